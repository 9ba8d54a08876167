"""Every ledger row, also one log line at INFO (logger ``app.ledger``): what a log shipper sees of each decision,
guard verdict, step and closing, with the ids it is about.

Called by :func:`app.store.records.record`, the one function that writes the ledger, so no engine path can add a
row without its line. The line is written as the row is added, inside its transaction: a transaction that then
rolls back (a lost store, a killed process) leaves a line whose row never landed, never the reverse.

Text: ``incident 12: step: requeue-off-culprits: would_run [action=slurm.requeue_job command='scontrol requeue
4242' exit_code=0 duration=0.213s]``. JSON (``log_format: json``): the same message plus ``incident_id``,
``repair_id``, ``kind`` and each of :data:`FIELDS` that the row has, as fields. A step's output stays in the
ledger only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("app.ledger")
# Row data shown on the line (when present), in this order.
FIELDS = (
    "node",
    "action",
    "guard",
    "decision",
    "state",
    "outcome",
    "status",
    "command",
    "exit_code",
    "duration",
)
MAX_VALUE = 300  # characters of one value on the line (a command can be long); the ledger has it whole


def log_entry(kind: str, message: str, incident_id: int | None, data: Mapping[str, Any]) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    fields = {name: data[name] for name in FIELDS if data.get(name) not in (None, "")}
    extra: dict[str, Any] = {"kind": kind, **{f"ledger_{k}": v for k, v in fields.items()}}
    if incident_id is not None:
        extra["incident_id"] = incident_id
    if data.get("repair_id") is not None:
        extra["repair_id"] = data["repair_id"]  # the line's prefix names the incident first, else the repair
    shown = " ".join(f"{name}={_show(name, value)}" for name, value in fields.items())
    repair_id = data.get("repair_id")
    about = (
        f"incident {incident_id}"
        if incident_id is not None
        else f"repair {repair_id}"
        if repair_id is not None
        else "ledger"
    )
    log.info("%s: %s: %s%s", about, kind, _one_line(message), f" [{shown}]" if shown else "", extra=extra)


def _show(name: str, value: Any) -> str:
    if name == "duration" and isinstance(value, int | float):
        return f"{value:.3f}s"
    text = _one_line(str(value))
    text = text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."
    return f"'{text}'" if " " in text or not text else text


def _one_line(text: str) -> str:
    """Label values reach messages: a newline in one must not forge a log line."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
