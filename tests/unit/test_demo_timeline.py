"""The demo tells what happened in the order it happened (issue 23 item 8): Nightshift's ledger rows (the job's and
its node repair's) merged with what the demo saw (alerts firing, the job running again), by time. Before, it
printed node2's drain after the job's verification, though the ledger had it 0.2 s after the requeue."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from sim.demo import Event, Narrator, ledger_events

T0 = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def row(seconds: float, kind: str, message: str, **data: object) -> dict[str, object]:
    return {
        "ts": (T0 + timedelta(seconds=seconds)).isoformat(),
        "kind": kind,
        "message": message,
        "data": data,
    }


def test_the_timeline_merges_the_ledger_and_what_was_seen_in_time_order():
    # As the incident's ledger lists them: the job's rows and its node repair's, interleaved by the engine.
    ledger = [
        row(0.5, "alert_received", "GpuXidError firing"),
        row(1.0, "incident_opened", "job incident job:slurm/1"),
        row(1.2, "guard", "kill_switch: pass", decision="pass"),
        row(1.3, "step", "requeue-off-culprits: ok", command="bash -lc 'scontrol requeue 1'"),
        row(1.5, "repair_step", "node node2: taken out of service"),
        row(9.0, "incident_closed", "recovered"),
    ]
    seen = [
        Event(T0 + timedelta(seconds=0.4), "alert firing"),
        Event(T0 + timedelta(seconds=5), "job running"),
    ]
    out = io.StringIO()
    say = Narrator(out, clock=lambda: 0.0, wall=lambda: T0)
    for event in sorted([*ledger_events(ledger, 1), *seen]):
        say.at(event.at, event.message)
    assert out.getvalue().splitlines() == [
        "[   0.4s] alert firing",
        "[   1.0s] incident #1 incident_opened: job incident job:slurm/1",
        "[   1.3s] incident #1 step: requeue-off-culprits: ok (scontrol requeue 1)",
        "[   1.5s] repair_step: node node2: taken out of service",  # the drain, before the verification
        "[   5.0s] job running",
        "[   9.0s] incident #1 incident_closed: recovered",
    ]
