"""One way to build the engine: :func:`app.build_engine`, used by the app, the CLI, the benchmarks and the tests."""

from __future__ import annotations

import ast
from pathlib import Path

from app import build_engine
from app.config import Settings
from app.store import Store
from tests.fakes import FakeClock

ROOT = Path(__file__).resolve().parents[2]
# An XID 79 in the labels: gpu_hardware well above the default floor, and below a floor of 0.99.
LABELS = {"alertname": "GpuXidError", "xid": "79", "Hostname": "node1"}


def test_the_engine_diagnoses_with_the_configured_confidence_floor(tmp_path: Path) -> None:
    settings = Settings(data_dir=str(tmp_path))
    assert build_engine(settings, clock=FakeClock()).deps.diagnose(LABELS, "").category == "gpu_hardware"
    settings.diagnosis.confidence_floor = 0.99
    floored = build_engine(settings, store=Store.unread(), clock=FakeClock())
    assert floored.deps.diagnose(LABELS, "").category == "unknown"


def test_only_build_engine_wires_an_engine() -> None:
    """EngineDeps is constructed in app/__init__.py only (an Engine over an existing engine's deps is a restart)."""
    found = []
    for folder in ("app", "bench", "sim", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                call = node.func if isinstance(node, ast.Call) else None
                name = (
                    call.id
                    if isinstance(call, ast.Name)
                    else call.attr
                    if isinstance(call, ast.Attribute)
                    else ""
                )
                if name == "EngineDeps":
                    found.append(str(path.relative_to(ROOT)))
    assert found == ["app/__init__.py"]
