"""Every write to incidents, their attempts and steps, the ledger and the inbox goes through a named transition of
app/engine/transitions.py (the store's own modules aside): no other module of app/ calls the store's writers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRITERS = frozenset(
    {
        "record",
        "insert_incident",
        "update_incident",
        "wake_incident",
        "link_alert",
        "insert_step",
        "update_step",
        "insert_attempt",
        "finish_attempt",
        "fail_inbox",
        "retry_failed_inbox",
    }
)
ALLOWED = ("app/engine/transitions.py", "app/store/")


def _writes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "records"
            and node.func.attr in WRITERS
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: records.{node.func.attr}")
    return found


def test_only_the_transitions_write_incidents_steps_and_the_ledger() -> None:
    modules = [
        p for p in sorted((ROOT / "app").rglob("*.py")) if not str(p.relative_to(ROOT)).startswith(ALLOWED)
    ]
    assert modules and [hit for path in modules for hit in _writes(path)] == []
    assert _writes(ROOT / "app" / "engine" / "transitions.py")  # the check sees the writes where they are
