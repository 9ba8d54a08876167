"""Every ledger row is a log line at INFO with its ids (app/ledger_log.py), in text and JSON."""

from __future__ import annotations

import json
import logging

import pytest

from app.ledger_log import log_entry
from app.logging_setup import TEXT_FORMAT, JsonFormatter
from tests.payloads import alert, xid
from tests.worlds import GRANTS


def test_an_incident_logs_each_guard_step_and_its_closing_with_its_id(world, caplog):
    caplog.set_level(logging.INFO, logger="app.ledger")
    w = world(GRANTS)
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    lines = [
        r for r in caplog.records if r.name == "app.ledger" and getattr(r, "incident_id", None) == incident_id
    ]
    rows = w.ledger(incident_id)
    assert len(lines) == len(rows) and all(r.levelno == logging.INFO for r in lines)
    assert [r.kind for r in lines] == [row["kind"] for row in rows]  # type: ignore[attr-defined]
    assert {"guard", "step"} <= {r.kind for r in lines}  # type: ignore[attr-defined]
    (drain,) = [r for r in lines if getattr(r, "ledger_action", None) == "fake.drain" and r.kind == "step"]  # type: ignore[attr-defined]
    text = logging.Formatter(TEXT_FORMAT).format(drain)
    assert text.count("\n") == 0 and f"incident {incident_id}: step: " in text
    assert "duration=" in text and "command='fake.drain node=node1 reason=Xid 79'" in text
    entry = json.loads(JsonFormatter().format(drain))
    assert entry["incident_id"] == incident_id and entry["kind"] == "step" and entry["level"] == "INFO"
    assert {"command", "duration", "action", "status"} <= set(entry)


def test_a_repair_row_carries_its_repair_id_and_a_newline_cannot_forge_a_line(caplog):
    caplog.set_level(logging.INFO, logger="app.ledger")
    log_entry("repair_held", "node n1: held\nincident 9: forged", 7, {"repair_id": 3, "node": "n1"})
    log_entry(
        "repair_step", "node n1: validate: failed", None, {"repair_id": 3, "exit_code": 1, "duration": 2}
    )
    held, step = caplog.records
    assert held.getMessage() == "incident 7: repair_held: node n1: held\\nincident 9: forged [node=n1]"
    entry = json.loads(JsonFormatter().format(held))
    assert (entry["incident_id"], entry["repair_id"], entry["node"]) == (7, 3, "n1")
    assert (
        step.getMessage() == "repair 3: repair_step: node n1: validate: failed [exit_code=1 duration=2.000s]"
    )
    assert json.loads(JsonFormatter().format(step))["exit_code"] == 1


@pytest.mark.parametrize("level", [logging.WARNING])
def test_nothing_is_formatted_above_info(caplog, level):
    caplog.set_level(level, logger="app.ledger")
    log_entry("step", "x", 1, {})
    assert caplog.records == []
