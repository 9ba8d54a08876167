"""What ``/metrics`` and ``/readyz`` read from the store at scrape time (the same whichever process answers), and
the worker's heartbeat, written to the store so a worker in another process or on another host is seen too.

The heartbeat is one control row (``worker_tick``): every worker loop writes the time at most every
:data:`HEARTBEAT_SECONDS`; ``nightshift_worker_last_tick_timestamp_seconds`` is its value, so it goes stale when no
worker is looping (rules/nightshift.yml, NightshiftWorkerStalled).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.domain.startup import credential_states
from app.engine.deps import EngineDeps
from app.store import records, repairs

HEARTBEAT_SECONDS = 15.0
TICK_CONTROL = "worker_tick"


@dataclass(frozen=True)
class Vitals:
    inbox: dict[str, Any]  # records.inbox_stats
    held_nodes: int
    open_by_state: dict[str, int]
    credentials: dict[str, dict[str, Any]]
    last_tick: datetime | None


def _readable(path: str) -> bool:
    return os.access(path, os.R_OK)


def credentials(deps: EngineDeps, recorded: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each backend's credential state: what the settings and files say now (:func:`credential_states`), unless a
    use recorded them rejected since (``credential:<backend>`` controls, app/engine/effects.py); a file that cannot
    be read now wins over an older record."""
    found: dict[str, dict[str, Any]] = dict(credential_states(deps.settings, _readable))
    for backend, state in recorded.items():
        if found.get(backend, {}).get("state") != "credential_error":
            found[backend] = state
    return found


def read(deps: EngineDeps) -> Vitals:
    """One consistent read of the store's vitals."""
    with deps.store.read() as conn:
        tick = records.get_control(conn, TICK_CONTROL)
        return Vitals(
            inbox=records.inbox_stats(conn),
            held_nodes=repairs.held_count(conn),
            open_by_state=records.open_incidents_by_state(conn),
            credentials=credentials(deps, records.controls_with_prefix(conn, "credential:")),
            last_tick=datetime.fromisoformat(tick["at"]) if tick else None,
        )


def beat(deps: EngineDeps, worker: str) -> None:
    """Record that ``worker`` is looping now."""
    now = deps.clock.now()
    with deps.store.transaction() as conn:
        records.set_control(conn, TICK_CONTROL, {"at": now.isoformat(), "by": worker}, now)
