"""The incident state machine's transitions: each one function, each writing every row it changes in one transaction.

Every transition takes an open connection (the caller's transaction: the worker opens one per transition, ingestion
one per batch of alerts) and writes the incident, its attempt, its steps and its ledger row together, so a process
killed at any point leaves either the state before the transition or the state after it, never half of one. The
worker, ingestion and the operator controls all close an incident through :func:`close`.

The set is closed: there is no generic "update these columns". A change the lifecycle needs is a named transition
here, so every write to incidents, their steps and their ledger can be read in one file. A transition that changes
the incident returns its row as written (a new frozen :class:`~app.store.rows.Incident`; the one passed in is left as
it was): a tick goes on with the returned row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.domain import episodes, schedulers
from app.domain.culprits import Culprit
from app.domain.incident_policy import Learned
from app.domain.planning import RUN, PlannedStep
from app.domain.playbooks import PlaybookSet
from app.domain.states import (
    AttemptOutcome,
    Guard,
    IncidentOutcome,
    LedgerKind,
    NoticeKind,
    State,
    StepStatus,
    UndoState,
)
from app.store import records, repairs
from app.store.rows import Incident, StepRow

# The ledger row of a planned step that will not run, by its status.
UNRUN_STEP = {
    StepStatus.WOULD_RUN: LedgerKind.STEP_WOULD_RUN,
    StepStatus.SKIPPED: LedgerKind.STEP_SKIPPED,
    StepStatus.INVALID: LedgerKind.STEP_INVALID,
}

# How an open attempt ends when its incident closes with this outcome (an attempt never stays "in progress").
_ATTEMPT_OUTCOME = {
    IncidentOutcome.RECOVERED: AttemptOutcome.RECOVERED,
    IncidentOutcome.FAILED: AttemptOutcome.FAILED,
    IncidentOutcome.NEEDS_HUMAN: AttemptOutcome.NEEDS_HUMAN,
    IncidentOutcome.UNVERIFIED: AttemptOutcome.UNVERIFIED,
    IncidentOutcome.CREDENTIAL_ERROR: AttemptOutcome.CREDENTIAL_ERROR,
    IncidentOutcome.HANDLED: AttemptOutcome.HANDLED,
}


def _write(
    conn: Connection,
    now: datetime,
    inc: Incident,
    ledger: tuple[LedgerKind, str, Mapping[str, Any] | None] | None = None,
    **values: Any,
) -> Incident:
    """The incident's columns and its ledger row (kind, message, data): what every transition here writes with.
    Returns the row as written."""
    values["updated_at"] = now
    records.update_incident(conn, inc.id, **values)
    if ledger is not None:
        kind, message, data = ledger
        records.record(conn, now, kind, message, incident_id=inc.id, data=data)
    return replace(inc, **values)


def note(
    conn: Connection,
    now: datetime,
    incident_id: int | None,
    kind: LedgerKind,
    message: str,
    data: Mapping[str, Any] | None = None,
) -> None:
    """An observation about an incident (a verification sample, a re-check, a backend error), what an action
    reported while it ran (a poll, a validation pod started), or an effect's failure (an annotation Grafana
    refused): a ledger row only."""
    records.record(conn, now, kind, message, incident_id=incident_id, data=data)


def persist_plan(
    conn: Connection, now: datetime, inc: Incident, planned: Sequence[PlannedStep], attempt: int, phase: str
) -> list[StepRow]:
    """Write the plan as step rows (idempotent per attempt and phase), ledger the steps that will not run (once),
    and return the rows of that attempt and phase."""
    for p in planned:
        created = records.insert_step(
            conn,
            {
                "incident_id": inc.id,
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
                UNRUN_STEP[p.status],
                f"{p.name}: {p.summary or p.reason}",
                incident_id=inc.id,
                data={
                    "action": p.action.name,
                    "params": dict(p.params),
                    "command": p.command,
                    "reason": p.reason,
                    "phase": phase,
                    "attempt": attempt,
                },
            )
    return records.get_steps(conn, inc.id, attempt=attempt, phase=phase)


def start_attempt(
    conn: Connection,
    now: datetime,
    inc: Incident,
    planned: Sequence[PlannedStep],
    *,
    playbook: str,
    note: str = "",
) -> Incident:
    """Attempt N+1: its attempt row, the incident acting, its ledger row and its planned steps, together."""
    number = inc.attempt + 1
    records.insert_attempt(
        conn,
        {
            "incident_id": inc.id,
            "number": number,
            "playbook": playbook,
            "target_key": inc.target_key,
            "node": inc.node,
            "destructive": any(p.runs and p.destructive for p in planned),
            "started_at": now,
        },
    )
    acting = _write(
        conn,
        now,
        inc,
        ledger=(
            LedgerKind.ATTEMPT_STARTED,
            f"attempt {number}" + (f": {note}" if note else ""),
            {"attempt": number},
        ),
        attempt=number,
        state=State.ACTING,
        acted=True,
        held_by_guard=False,
        reason="",
        tick_errors=0,
    )
    persist_plan(conn, now, acting, planned, attempt=number, phase="steps")
    return acting


def start_step(conn: Connection, now: datetime, step: StepRow) -> None:
    """Mark a step running before its action starts: a step found running later is ambiguous, never re-run."""
    records.update_step(conn, step.id, status=StepStatus.RUNNING, started_at=now)


def finish_step(
    conn: Connection,
    now: datetime,
    inc: Incident,
    step: StepRow,
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
        step.id,
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
        LedgerKind.STEP,
        f"{step.name}: {status}" + (f": {reason}" if reason else ""),
        incident_id=inc.id,
        data={
            "action": step.action,
            "params": step.params,
            "phase": step.phase,
            "attempt": step.attempt,
            "status": status,
            "command": command,
            "exit_code": exit_code,
            "output": ledger_output,
            "reason": reason,
            "duration": duration,
        },
    )


def exclusions_changed(
    conn: Connection, now: datetime, inc: Incident, job: str, added: Sequence[str], dropped: Sequence[str]
) -> None:
    """A recovery step added nodes to the job's exclusion list (ours from now on) or dropped some of ours."""
    records.note_exclusions(conn, job, added, dropped, inc.id, now)


def retry_step(conn: Connection, step: StepRow) -> None:
    records.update_step(conn, step.id, status=StepStatus.RETRY, retries=step.retries + 1)


def wait(
    conn: Connection,
    now: datetime,
    inc: Incident,
    reason: str,
    *,
    held_by_guard: bool = False,
    state: State = State.WAITING,
    kind: LedgerKind | None = None,
) -> Incident:
    """Hold the incident (a guard, a backoff, the correlation window, a job waiting for resources)."""
    return _write(
        conn,
        now,
        inc,
        ledger=(kind, reason, None) if kind else None,
        state=state,
        held_by_guard=held_by_guard,
        reason=reason,
    )


def verify(conn: Connection, now: datetime, inc: Incident, deadline: datetime, message: str) -> Incident:
    """Steps done: poll the verification until ``deadline``, counting only samples from now on."""
    return _write(
        conn,
        now,
        inc,
        ledger=(LedgerKind.VERIFYING, message, None),
        state=State.VERIFYING,
        verify_deadline=deadline,
        verify_from=now,
    )


def attempt_failed(conn: Connection, now: datetime, inc: Incident, reason: str) -> Incident:
    """The attempt failed; the guard chain decides next (another attempt after backoff, or a person)."""
    records.finish_attempt(conn, inc.id, inc.attempt, AttemptOutcome.FAILED, now)
    records.record(
        conn, now, LedgerKind.ATTEMPT_FAILED, reason, incident_id=inc.id, data={"attempt": inc.attempt}
    )
    return _write(conn, now, inc, state=State.WAITING, reason=reason, verify_deadline=None)


def close(
    conn: Connection,
    now: datetime,
    inc: Incident,
    outcome: IncidentOutcome,
    reason: str,
    data: Mapping[str, Any] | None = None,
) -> Incident:
    """Close the incident: its open attempt gets an outcome, the open key is released, effects are owed."""
    if inc.attempt:
        attempt_outcome = _ATTEMPT_OUTCOME.get(outcome, AttemptOutcome.ABANDONED)
        records.finish_attempt(conn, inc.id, inc.attempt, attempt_outcome, now)
    return _write(
        conn,
        now,
        inc,
        ledger=(LedgerKind.INCIDENT_CLOSED, f"{outcome}: {reason}", {"outcome": outcome, **(data or {})}),
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
    """A tick raised. Counts consecutive failures; at ``limit`` the incident goes to a person (the count kept with
    it). True when closed."""
    errors = inc.tick_errors + 1
    if errors >= limit:
        close(
            conn,
            now,
            _write(conn, now, inc, tick_errors=errors),
            IncidentOutcome.NEEDS_HUMAN,
            f"processing failed {errors} times in a row: {error}",
            {"error": error},
        )
        return True
    _write(
        conn,
        now,
        inc,
        ledger=(
            LedgerKind.ENGINE_ERROR,
            f"tick failed ({errors} of {limit}), will retry: {error}",
            {"error": error},
        ),
        tick_errors=errors,
    )
    return False


def tick_succeeded(conn: Connection, now: datetime, inc: Incident) -> Incident:
    """A tick went through after failed ones: they were not in a row, their count starts again."""
    return _write(conn, now, inc, tick_errors=0)


def correlating(conn: Connection, now: datetime, inc: Incident, reason: str) -> Incident:
    """Inside the correlation window: the incident stays open, saying what it waits for (no ledger row)."""
    return _write(conn, now, inc, reason=reason)


def diagnosing(conn: Connection, now: datetime, inc: Incident) -> Incident:
    """The collect steps and the diagnosis are under way."""
    return _write(conn, now, inc, state=State.DIAGNOSING, reason="")


def diagnosed(
    conn: Connection,
    now: datetime,
    inc: Incident,
    diagnosis: Mapping[str, Any],
    culprits: Sequence[Culprit] | None,
) -> Incident:
    """The diagnosis, and the culprit it names (``culprits``: the list with it added; None: unchanged)."""
    values: dict[str, Any] = {"diagnosis": dict(diagnosis)}
    if culprits is not None:
        values["culprits"] = tuple(culprits)
    summary = f"{diagnosis['category']} ({diagnosis['confidence']:.2f}): {diagnosis['summary']}"
    return _write(conn, now, inc, ledger=(LedgerKind.DIAGNOSIS, summary, dict(diagnosis)), **values)


def learned(conn: Connection, now: datetime, inc: Incident, facts: Learned) -> Incident:
    """What the policy learned on its way to a decision, in the order it learned it: the scheduler unread, the
    culprits checked against the allocation, invalid steps, the guards' verdicts and the live re-check."""
    if facts.job_unread:
        inc = _write(
            conn,
            now,
            inc,
            ledger=(LedgerKind.JOB_STATUS_UNKNOWN, facts.job_unread, None),
            job_status_tries=inc.job_status_tries + 1,
        )
    if facts.culprits is not None:
        confirmed = [c.to_json() for c in facts.culprits]
        inc = _write(
            conn,
            now,
            inc,
            ledger=(LedgerKind.CULPRITS, facts.culprit_message, {"culprits": confirmed}),
            culprits=facts.culprits,
            node=facts.culprit_node,
        )
    if facts.progress:
        note(conn, now, inc.id, LedgerKind.SELF_RECOVERY, facts.progress)
    if facts.blame:
        note(conn, now, inc.id, LedgerKind.BLAME, facts.blame, {"nodes": list(facts.exclude)})
    for p in facts.invalid:
        note(conn, now, inc.id, LedgerKind.STEP_INVALID, f"{p.name}: {p.reason}", {"action": p.action.name})
    for verdict in facts.verdicts:
        check = facts.recheck
        if verdict.guard == Guard.RECHECK and check is not None and check.error is None:
            note(
                conn,
                now,
                inc.id,
                LedgerKind.RECHECK,
                f"{len(check.samples)} series for {check.expr}",
                {"expr": check.expr, "samples": [dict(s) for s in check.samples[:20]]},
            )
        note(
            conn,
            now,
            inc.id,
            LedgerKind.GUARD,
            f"{verdict.guard}: {verdict.decision}: {verdict.reason}",
            verdict.as_dict(),
        )
    return inc


def hold(conn: Connection, now: datetime, inc: Incident, reason: str, *, held_by_guard: bool) -> Incident:
    """Hold the incident until it is decided again: a guard's wait, or the scheduler asked again later."""
    return wait(conn, now, inc, reason, held_by_guard=held_by_guard)


def hand_to_repair(
    conn: Connection,
    now: datetime,
    inc: Incident,
    *,
    node: str,
    playbook: str,
    reason: str,
) -> Incident:
    """A node incident's node goes to the repair lifecycle; the incident waits for its verdict (its culprit names
    the repair)."""
    repair_id = repairs.request_repair(
        conn,
        node=node,
        scheduler=schedulers.of_incident(inc.target).name,
        playbook=playbook,
        incident_id=inc.id,
        reason=reason[:500],
        now=now,
    )
    culprit = Culprit(node, "alert", reason[:300], confirmed=True, repair_id=repair_id)
    return wait(
        conn,
        now,
        _write(conn, now, inc, culprits=(culprit,)),
        f"node {node} handed to repair #{repair_id}",
        state=State.REPAIRING,
        kind=LedgerKind.REPAIR_REQUESTED,
    )


def request_repairs(
    conn: Connection,
    now: datetime,
    inc: Incident,
    nodes: Sequence[str],
    *,
    playbooks: PlaybookSet,
) -> None:
    """Hand each culprit node of a job incident to the node repair lifecycle, except a culprit its playbook only
    excludes (a straggler) until its ``exclude_node.repair_after``-th exclusion (``culprit_excluded_only``)."""
    for node in nodes:
        named = next((c for c in inc.culprits if c.node == node), None)
        named_by = named.playbook if named else None
        playbook = playbooks.get(named_by) if named_by else None
        if playbook is not None and playbook.exclude_node is not None:
            rule = playbook.exclude_node
            excluders = [p.name for p in playbooks.playbooks if p.exclude_node is not None]
            earlier = records.exclusions_of(conn, node, excluders, now - rule.window, other_than=inc.id)
            if not episodes.repair_due(playbook, earlier):
                note(
                    conn,
                    now,
                    inc.id,
                    LedgerKind.CULPRIT_EXCLUDED_ONLY,
                    f"{node} excluded from job {inc.job} without a repair ({earlier + 1} of "
                    f"{rule.repair_after} exclusions within {rule.window})",
                    {"node": node, "exclusions": earlier + 1, "repair_after": rule.repair_after},
                )
                continue
        why = f"{named.source}: {named.reason}" if named else "named by the diagnosis"
        repairs.request_repair(
            conn,
            node=node,
            scheduler=schedulers.of_incident(inc.target).name,
            playbook=named_by,
            incident_id=inc.id,
            reason=f"culprit of job {inc.job}: {why}"[:500],
            now=now,
        )


def await_approval(conn: Connection, now: datetime, inc: Incident, step: StepRow, reason: str) -> Incident:
    """Hold the attempt before a step marked ``approval: required`` until an operator approves it."""
    records.update_step(conn, step.id, status=StepStatus.AWAITING_APPROVAL)
    return _write(
        conn,
        now,
        inc,
        ledger=(LedgerKind.APPROVAL_REQUESTED, f"{reason}: {step.command}", {"step_id": step.id}),
        reason=reason,
    )


def approve_step(conn: Connection, now: datetime, incident_id: int, step: StepRow, by: str) -> None:
    """An operator approves a step that waits for approval: the worker runs it on its next look."""
    records.update_step(conn, step.id, status=StepStatus.PENDING, approved_by=by, approved_at=now)
    records.update_incident(conn, incident_id, next_run_at=now, poked=True, updated_at=now)
    note(
        conn,
        now,
        incident_id,
        LedgerKind.APPROVED,
        f"step {step.name} approved by {by}",
        {"step_id": step.id, "by": by},
    )


def undo_done(conn: Connection, now: datetime, inc: Incident) -> Incident:
    """The closed incident's ``on_resolved`` steps have run."""
    return _write(conn, now, inc, on_resolved_state=UndoState.DONE)


def recover_in_flight(conn: Connection, now: datetime, inc: Incident, read_only: Sequence[str]) -> str | None:
    """Steps left ``running`` by a dead worker: those of the ``read_only`` actions run again, the others are
    ambiguous and never re-run. Returns why the incident goes to a person (None: nothing ambiguous)."""
    ambiguous = []
    for step in records.get_steps(conn, inc.id):
        if step.status != StepStatus.RUNNING:
            continue
        if step.action in read_only:
            records.update_step(conn, step.id, status=StepStatus.PENDING)
            continue
        records.update_step(
            conn,
            step.id,
            status=StepStatus.AMBIGUOUS,
            reason="in flight when its worker stopped; outcome unknown, not re-run",
        )
        ambiguous.append(step.name)
    if not ambiguous:
        return None
    reason = f"step {ambiguous[0]} was in flight when its worker stopped: outcome unknown, not re-run"
    note(conn, now, inc.id, LedgerKind.STEP_AMBIGUOUS, reason, {"steps": ambiguous})
    return reason


def annotation_opened(
    conn: Connection, now: datetime, inc: Incident, annotation_id: int, tags: Sequence[str]
) -> Incident:
    """The incident's Grafana region exists."""
    records.update_incident(conn, inc.id, annotation_id=annotation_id)
    note(
        conn,
        now,
        inc.id,
        LedgerKind.ANNOTATION,
        f"Grafana annotation {annotation_id} opened",
        {"annotation_id": annotation_id, "tags": list(tags)},
    )
    return replace(inc, annotation_id=annotation_id)


def finalized(conn: Connection, now: datetime, inc: Incident, delivered: Collection[str]) -> Incident:
    """The closed incident owes no more effects (annotation closed, outcome told, or tries spent); ``delivered``:
    the channels that delivered its outcome notice."""
    return _write(conn, now, inc, finalize_pending=False, delivered=sorted(delivered))


def finalize_retried(conn: Connection, now: datetime, inc: Incident, delivered: Collection[str]) -> Incident:
    """The annotation or the outcome notice failed: one more try later, counted (``finalize_tries``); the channels
    that delivered the notice are kept, so the next try sends only to the others."""
    return _write(
        conn,
        now,
        inc,
        ledger=(LedgerKind.FINALIZE_RETRY, "annotation or notification failed; will retry", None),
        finalize_tries=inc.finalize_tries + 1,
        delivered=sorted(delivered),
    )


def fleet_released(conn: Connection, now: datetime, inc: Incident) -> Incident:
    """A job held by a shared cause died (its alerts resolved): its recovery is released, looked at now."""
    return _write(conn, now, inc, alert_resolved=True, next_run_at=now, poked=True)


def open_incident(
    conn: Connection,
    now: datetime,
    values: Mapping[str, Any],
    alert_id: int,
    message: str,
    data: Mapping[str, Any],
) -> int | None:
    """A new incident with its first alert and its ``incident_opened`` row. None when another writer holds the
    open key already (the caller attaches to that one)."""
    incident_id = records.insert_incident(conn, values)
    if incident_id is None:
        return None
    records.link_alert(conn, incident_id, alert_id)
    note(conn, now, incident_id, LedgerKind.INCIDENT_OPENED, message, data)
    return incident_id


@dataclass(frozen=True)
class Leading:
    """The playbook that plans an incident's recovery and the alert it matched: the incident's columns they set."""

    playbook: str
    target_key: str
    target: Mapping[str, str]
    node: str | None
    serialize_key: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    def columns(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook,
            "target_key": self.target_key,
            "target": dict(self.target),
            "node": self.node,
            "serialize_key": self.serialize_key,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
        }


def attach(
    conn: Connection,
    now: datetime,
    inc: Incident,
    alert_id: int,
    message: str,
    data: Mapping[str, Any],
    *,
    culprits: Sequence[Culprit] | None = None,
    act_now: bool = False,
    leading: Leading | None = None,
) -> bool:
    """An alert joins an open incident, with what it changes: ``culprits`` (a culprit named), ``act_now`` (a known
    culprit ends the correlation wait), ``leading`` (a higher-priority playbook plans the recovery). False when it
    was attached already and changes nothing (no ledger row)."""
    linked = records.link_alert(conn, inc.id, alert_id)
    changes: dict[str, Any] = {**(leading.columns() if leading is not None else {})}
    if culprits is not None:
        changes["culprits"] = tuple(culprits)
    if act_now:
        changes["next_run_at"] = now
    if act_now or leading is not None:
        changes["poked"] = True  # a worker deciding on the row as it was looks again when it lets go
    if changes:
        _write(conn, now, inc, **changes)
    if not (linked or changes):
        return False
    note(conn, now, inc.id, LedgerKind.ALERT_ATTACHED, message, data)
    return True


def resolved_before_acting(
    conn: Connection, now: datetime, inc: Incident, outcome: IncidentOutcome, reason: str
) -> Incident:
    """Every alert of an incident that has done nothing resolved: it closes (``blocked`` when a guard held it)."""
    records.update_incident(conn, inc.id, alert_resolved=True)
    return close(conn, now, replace(inc, alert_resolved=True), outcome, reason)


def alert_resolved(conn: Connection, now: datetime, inc: Incident, message: str) -> Incident:
    """Every alert resolved while the incident acts (its verification finishes; a failed attempt is not retried,
    but a job's, whose alerts say nothing of it, is: lifecycle ``_attempt_failed``),
    or while a worker holds it before acting (it closes at the worker's next look, which is now: poked)."""
    return _write(
        conn,
        now,
        inc,
        ledger=(LedgerKind.ALERT_RESOLVED, message, None),
        alert_resolved=True,
        next_run_at=now,
        poked=True,
    )


def schedule_undo(conn: Connection, now: datetime, inc: Incident, message: str) -> Incident:
    """A closed incident that acted: its alert resolved, so its ``on_resolved`` steps are owed."""
    return _write(
        conn,
        now,
        inc,
        ledger=(LedgerKind.ON_RESOLVED_SCHEDULED, message, None),
        on_resolved_state=UndoState.PENDING,
        next_run_at=now,
    )


# --- what is not an incident's own state: notices told, actions' reports, the operators, the inbox, fleet holds --


def notified(
    conn: Connection,
    now: datetime,
    incident_id: int | None,
    notice: NoticeKind,
    message: str,
    data: Mapping[str, Any],
) -> None:
    """One channel's delivery of a notice (its channel, status, command and, failed, why)."""
    records.record(
        conn, now, LedgerKind.NOTIFICATION, message, incident_id=incident_id, data={**data, "notice": notice}
    )


def annotation_closed(
    conn: Connection, now: datetime, inc: Incident, message: str, tags: Sequence[str]
) -> None:
    """The closed incident's Grafana region is closed (or created closed)."""
    records.record(conn, now, LedgerKind.ANNOTATION, message, incident_id=inc.id, data={"tags": list(tags)})


def paused(conn: Connection, now: datetime, value: Mapping[str, Any]) -> None:
    """An operator pauses or resumes automation (``POST /api/v1/pause``, ``/resume``): the control and its row."""
    records.set_control(conn, "pause", dict(value), now)
    verb = "paused" if value["paused"] else "resumed"
    records.record(
        conn,
        now,
        LedgerKind.PAUSE if value["paused"] else LedgerKind.RESUME,
        f"automation {verb} by {value['by']}: {value['reason']}",
        data=value,
    )


def inbox_set_aside(conn: Connection, now: datetime, inbox_id: int, error: str) -> None:
    """A notification whose ingestion raised is set aside with its error; the queue moves on."""
    records.fail_inbox(conn, inbox_id, now, error)
    records.record(
        conn,
        now,
        LedgerKind.INBOX_FAILED,
        f"notification {inbox_id} could not be ingested and is set aside: {error}",
        data={"inbox_id": inbox_id, "error": error},
    )


def inbox_retried(conn: Connection, now: datetime) -> int:
    """Every set-aside notification queued again (``nightshift inbox --retry``). Returns how many."""
    count = records.retry_failed_inbox(conn)
    records.record(conn, now, LedgerKind.INBOX_RETRY, f"{count} set-aside notification(s) queued again")
    return count


def retention_noted(
    conn: Connection, now: datetime, kind: LedgerKind, message: str, data: Mapping[str, Any]
) -> None:
    """What a retention pass did (rows pruned), or why it stopped."""
    records.record(conn, now, kind, message, data=data)


def fleet_opened(
    conn: Connection, now: datetime, inc: Incident, message: str, record: Mapping[str, Any]
) -> None:
    """A shared cause of failing jobs (app/engine/fleet_hold.py; its record written by the caller): its
    ``fleet_incident`` row, on the incident that opened it."""
    records.record(conn, now, LedgerKind.FLEET_INCIDENT, message, incident_id=inc.id, data=dict(record))


def fleet_cleared(
    conn: Connection, now: datetime, message: str, record: Mapping[str, Any], due: Mapping[int, datetime]
) -> None:
    """The shared cause is over (checked, or a person said so): each held job is looked at at its ``due`` time
    (its release jitter)."""
    for incident_id, at in due.items():
        records.wake_incident(conn, incident_id, at)
    records.record(conn, now, LedgerKind.FLEET_CLEARED, message, data=dict(record))


def fleet_probe_failed(conn: Connection, now: datetime, inc: Incident, reason: str) -> None:
    """The probe job failed again: its attempt ends now (not at its verification's timeout) and it is looked at
    now, to be held again."""
    attempt_failed(conn, now, inc, reason)
    records.wake_incident(conn, inc.id, now)
