"""Benchmark results files: one JSON document per benchmark, with the machine and parameters it ran with."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the numbers depend on: CPUs, interpreter, the server stack's versions."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        **{name: metadata.version(name) for name in ("gunicorn", "flask", "sqlalchemy", "werkzeug")},
    }


def write(path: Path, benchmark: str, params: dict[str, Any], results: dict[str, Any]) -> Path:
    """Write ``results`` as ``path`` (parents created); return the path."""
    document = {
        "benchmark": benchmark,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        # Other work on the machine skews timings: the load average at the end says how busy it was.
        "loadavg_at_finish": [round(x, 2) for x in os.getloadavg()],
        "params": params,
        "results": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
