"""The incident state machine's transitions: each one function, each writing every row it changes in one transaction.

Every transition takes an open connection (the caller's transaction: the worker opens one per transition, ingestion
one per batch of alerts) and writes the incident, its attempt, its steps and its ledger row together, so a process
killed at any point leaves either the state before the transition or the state after it, never half of one. The
worker, ingestion and the operator controls all close an incident through :func:`close`.

The in-memory incident row passed in is updated with what was written, so a tick can go on with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.planning import RUN, PlannedStep
from app.states import AttemptOutcome, Outcome, State, StepStatus
from app.store import records

Incident = dict[str, Any]

# How an open attempt ends when its incident closes with this outcome (an attempt never stays "in progress").
_ATTEMPT_OUTCOME = {
    Outcome.RECOVERED: AttemptOutcome.RECOVERED,
    Outcome.FAILED: AttemptOutcome.FAILED,
    Outcome.NEEDS_HUMAN: AttemptOutcome.NEEDS_HUMAN,
    Outcome.UNVERIFIED: AttemptOutcome.UNVERIFIED,
    Outcome.CREDENTIAL_ERROR: AttemptOutcome.CREDENTIAL_ERROR,
    Outcome.HANDLED: AttemptOutcome.HANDLED,
}


def update(
    conn: Connection,
    now: datetime,
    inc: Incident,
    ledger: tuple[str, str, Mapping[str, Any] | None] | None = None,
    **values: Any,
) -> None:
    """Change the incident's columns and add its ledger row (kind, message, data)."""
    values["updated_at"] = now
    records.update_incident(conn, inc["id"], **values)
    if ledger is not None:
        kind, message, data = ledger
        records.record(conn, now, kind, message, incident_id=inc["id"], data=data)
    inc.update(values)


def persist_plan(
    conn: Connection, now: datetime, inc: Incident, planned: Sequence[PlannedStep], attempt: int, phase: str
) -> list[dict[str, Any]]:
    """Write the plan as step rows (idempotent per attempt and phase), ledger the steps that will not run (once),
    and return the rows of that attempt and phase."""
    for p in planned:
        created = records.insert_step(
            conn,
            {
                "incident_id": inc["id"],
                "attempt": attempt,
                "phase": phase,
                "idx": p.idx,
                "name": p.name,
                "action": p.action.name,
                "params": dict(p.params),
                "status": p.status,
                "summary": p.summary,
                "command": p.command,
                "reason": p.reason,
                "retries": 0,
                "approval": p.approval,
            },
        )
        if created is not None and p.status != RUN:
            records.record(
                conn,
                now,
                f"step_{p.status}",
                f"{p.name}: {p.summary or p.reason}",
                incident_id=inc["id"],
                data={
                    "action": p.action.name,
                    "params": dict(p.params),
                    "command": p.command,
                    "reason": p.reason,
                    "phase": phase,
                    "attempt": attempt,
                },
            )
    return records.get_steps(conn, inc["id"], attempt=attempt, phase=phase)


def start_attempt(
    conn: Connection,
    now: datetime,
    inc: Incident,
    planned: Sequence[PlannedStep],
    *,
    playbook: str,
    note: str = "",
) -> list[dict[str, Any]]:
    """Attempt N+1: its attempt row, the incident acting, its ledger row and its planned steps, together."""
    number = inc["attempt"] + 1
    records.insert_attempt(
        conn,
        {
            "incident_id": inc["id"],
            "number": number,
            "playbook": playbook,
            "target_key": inc["target_key"],
            "node": inc["node"],
            "destructive": any(p.runs and p.destructive for p in planned),
            "started_at": now,
        },
    )
    update(
        conn,
        now,
        inc,
        ledger=("attempt_started", f"attempt {number}" + (f": {note}" if note else ""), {"attempt": number}),
        attempt=number,
        state=State.ACTING,
        acted=True,
        held_by_guard=False,
        reason="",
        tick_errors=0,
    )
    return persist_plan(conn, now, inc, planned, attempt=number, phase="steps")


def start_step(conn: Connection, now: datetime, step: Mapping[str, Any]) -> None:
    """Mark a step running before its action starts: a step found running later is ambiguous, never re-run."""
    records.update_step(conn, step["id"], status=StepStatus.RUNNING, started_at=now)


def finish_step(
    conn: Connection,
    now: datetime,
    inc: Incident,
    step: Mapping[str, Any],
    *,
    status: str,
    command: str,
    exit_code: int | None,
    output: str,
    ledger_output: str,
    reason: str,
    duration: float,
) -> None:
    """A step's outcome and its ledger row."""
    records.update_step(
        conn,
        step["id"],
        status=status,
        command=command,
        exit_code=exit_code,
        output=output,
        reason=reason,
        finished_at=now,
        duration=duration,
    )
    records.record(
        conn,
        now,
        "step",
        f"{step['name']}: {status}" + (f": {reason}" if reason else ""),
        incident_id=inc["id"],
        data={
            "action": step["action"],
            "params": step["params"],
            "phase": step["phase"],
            "attempt": step["attempt"],
            "status": status,
            "command": command,
            "exit_code": exit_code,
            "output": ledger_output,
            "reason": reason,
            "duration": duration,
        },
    )


def retry_step(conn: Connection, step: Mapping[str, Any]) -> None:
    records.update_step(conn, step["id"], status=StepStatus.RETRY, retries=step["retries"] + 1)


def wait(
    conn: Connection,
    now: datetime,
    inc: Incident,
    reason: str,
    *,
    held_by_guard: bool = False,
    state: State = State.WAITING,
    kind: str | None = None,
) -> None:
    """Hold the incident (a guard, a backoff, the correlation window, a job waiting for resources)."""
    update(
        conn,
        now,
        inc,
        ledger=(kind, reason, None) if kind else None,
        state=state,
        held_by_guard=held_by_guard,
        reason=reason,
    )


def verify(conn: Connection, now: datetime, inc: Incident, deadline: datetime, message: str) -> None:
    """Steps done: poll the verification until ``deadline``, counting only samples from now on."""
    update(
        conn,
        now,
        inc,
        ledger=("verifying", message, None),
        state=State.VERIFYING,
        verify_deadline=deadline,
        verify_from=now,
    )


def attempt_failed(conn: Connection, now: datetime, inc: Incident, reason: str) -> None:
    """The attempt failed; the guard chain decides next (another attempt after backoff, or a person)."""
    records.finish_attempt(conn, inc["id"], inc["attempt"], AttemptOutcome.FAILED, now)
    records.record(
        conn, now, "attempt_failed", reason, incident_id=inc["id"], data={"attempt": inc["attempt"]}
    )
    update(conn, now, inc, state=State.WAITING, reason=reason, verify_deadline=None)


def close(
    conn: Connection,
    now: datetime,
    inc: Incident,
    outcome: Outcome,
    reason: str,
    data: Mapping[str, Any] | None = None,
) -> None:
    """Close the incident: its open attempt gets an outcome, the open key is released, effects are owed."""
    if inc["attempt"]:
        attempt_outcome = _ATTEMPT_OUTCOME.get(outcome, AttemptOutcome.ABANDONED)
        records.finish_attempt(conn, inc["id"], inc["attempt"], attempt_outcome, now)
    update(
        conn,
        now,
        inc,
        ledger=("incident_closed", f"{outcome}: {reason}", {"outcome": outcome, **(data or {})}),
        state=outcome,
        outcome=outcome,
        reason=reason,
        open_key=None,
        closed_at=now,
        finalize_pending=True,
        verify_deadline=None,
        next_run_at=now,
    )


def tick_failed(conn: Connection, now: datetime, inc: Incident, error: str, limit: int) -> bool:
    """A tick raised. Counts consecutive failures; at ``limit`` the incident goes to a person. True when closed."""
    errors = (inc.get("tick_errors") or 0) + 1
    if errors >= limit:
        inc["tick_errors"] = errors
        close(
            conn,
            now,
            inc,
            Outcome.NEEDS_HUMAN,
            f"processing failed {errors} times in a row: {error}",
            {"error": error},
        )
        return True
    update(
        conn,
        now,
        inc,
        ledger=("engine_error", f"tick failed ({errors} of {limit}), will retry: {error}", {"error": error}),
        tick_errors=errors,
    )
    return False
