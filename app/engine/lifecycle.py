"""Advancing one claimed incident by one tick: correlate → diagnose → guards → act → verify → close.

Each tick is short; waits (the correlation window, guards, retries, verification polls) release the incident with a
``next_run_at`` so one worker thread serves many incidents and a crash loses nothing: every change is one transition
of :mod:`app.engine.transitions` (one transaction each), a step is marked ``running`` before it starts, and a step
found ``running`` by a later claimer is ``ambiguous`` and never re-run.

A job incident (one failure episode of a training job, :mod:`app.episodes`) waits out its correlation window unless a
culprit node is known, diagnoses over all its evidence, confirms its culprits against the job's allocation, and runs
one recovery of the job that excludes them; each confirmed culprit is handed to the node repair lifecycle
(:mod:`app.engine.repair`) in the same transaction, and the job's recovery never waits on it. A node incident (a
node-scoped fault on a node that runs no job) hands its node to the repair lifecycle and closes with its verdict.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from app import episodes, guards
from app.actions.base import ActionContext
from app.engine import guard_facts, transitions
from app.engine.deps import EngineDeps
from app.engine.effects import Effects
from app.engine.fleet_hold import FleetHolds
from app.engine.jobs import JobPhase, JobStatus, job_status
from app.engine.repair import pool_facts
from app.errors import BackendError, ConfigError, ParamError, StoreUnavailable
from app.outcome import Ambiguous, CredentialError, Failed, Ok, Outcome, Retry, tail
from app.planning import INVALID, PlannedStep, nodes_taken_out, plan_steps, when_context
from app.playbooks import Playbook, Step
from app.promql_window import clamp_ranges
from app.states import (
    DONE_STEP_STATUSES,
    REPAIR_SETTLED,
    IncidentKind,
    RepairState,
    State,
    StepStatus,
    UndoState,
)
from app.states import Outcome as Closed
from app.store import records, repairs
from app.templates import render_promql

log = logging.getLogger(__name__)

Incident = dict[str, Any]
ALLOCATION_TRIES = 3  # looks at a job's allocation before its recovery goes ahead without exclusions
BENIGN_CATEGORIES = frozenset({"benign", "no_fault"})  # diagnosis verdicts that mean "do not act"

# A repaired node incident closes with the repair's verdict.
_REPAIR_OUTCOME = {
    RepairState.RETURNED: Closed.RECOVERED,
    RepairState.RELEASED: Closed.HANDLED,
    RepairState.HELD: Closed.NEEDS_HUMAN,
    RepairState.ADVISORY: Closed.ADVISORY,
    RepairState.NOT_OURS: Closed.NEEDS_HUMAN,
}


class Lifecycle:
    """The incident state machine's driver: the only place that sequences actions, guards and store writes."""

    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self.effects = Effects(deps)
        self.fleet = FleetHolds(deps, self.effects.fleet_incident)

    # --- claiming ---------------------------------------------------------------------------------------------

    def work_once(self, worker: str) -> int | None:
        """Claim one due incident, advance it one tick, release it. Returns its id, or None when idle."""
        deps = self.deps
        now = deps.clock.now()
        lease = timedelta(seconds=deps.settings.worker.lease_seconds)
        with deps.store.read() as conn:
            if not records.any_due(conn, now):
                return None
        with deps.store.transaction() as conn:
            incident = records.claim_next(conn, worker, now, lease)
        if incident is None:
            return None
        try:
            next_run = self._advance(incident)
        except Exception as exc:
            log.exception("incident %s: tick failed", incident["id"])
            next_run = self._tick_failed(incident["id"], exc)
        with deps.store.transaction() as conn:
            records.release_claim(conn, incident["id"], worker, next_run)
        return incident["id"]

    def _tick_failed(self, incident_id: int, exc: Exception) -> datetime | None:
        """Count the failure on the incident as stored; the same error N times in a row goes to a person."""
        deps = self.deps
        now = deps.clock.now()
        with deps.store.transaction() as conn:
            inc = records.get_incident(conn, incident_id)
            if inc is None or inc["open_key"] is None:
                return None
            closed = transitions.tick_failed(conn, now, inc, repr(exc), deps.settings.worker.max_tick_errors)
        if closed:
            deps.metrics.incidents.labels(Closed.NEEDS_HUMAN).inc()
            return now
        return now + timedelta(seconds=deps.settings.guards.defer_seconds)

    def _advance(self, inc: Incident) -> datetime | None:
        if inc["open_key"] is None:
            return self._closed_tick(inc)
        playbook = self.deps.playbooks.get(inc["playbook"])
        if playbook is None:
            return self._close(inc, Closed.NEEDS_HUMAN, f"playbook {inc['playbook']!r} is no longer loaded")
        if self._recover_in_flight(inc):
            return self._close(inc, Closed.NEEDS_HUMAN, inc["reason"])
        self.effects.open_annotation(inc)
        state = inc["state"]
        if inc["kind"] == IncidentKind.NODE and state in (State.OPEN, State.DIAGNOSING, State.WAITING):
            held_until = self.fleet.hold_node(inc)
            if held_until is not None:
                return held_until
            state = State.OPEN if state == State.WAITING else state  # no longer behind a failing domain
        if state == State.OPEN and episodes.must_wait(
            self.deps.clock.now(), inc["act_after"], inc["culprits"] or ()
        ):
            return self._correlate(inc)
        if state in (State.OPEN, State.DIAGNOSING):
            self._diagnose(inc, playbook)
            if _benign(inc["diagnosis"]):
                return self._close(inc, Closed.BENIGN, f"no fault to act on: {inc['diagnosis']['summary']}")
            if inc["kind"] == IncidentKind.NODE:
                return self._hand_to_repair(inc, playbook)
            return self._decide(inc, playbook)
        if state == State.WAITING:
            return self._decide(inc, playbook)
        if state == State.ACTING:
            return self._act(inc, playbook)
        if state in (State.VERIFYING, State.WAITING_FOR_RESOURCES):
            return self._verify(inc, playbook)
        if state == State.REPAIRING:
            return self._repair_settled(inc)
        return self._close(inc, Closed.NEEDS_HUMAN, f"unexpected state {state!r}")

    def _closed_tick(self, inc: Incident) -> datetime | None:
        if inc["on_resolved_state"] == UndoState.PENDING:
            wait = self._run_on_resolved(inc)
            if wait is not None:
                return wait
        if inc["finalize_pending"]:
            return self.effects.finalize(inc)
        return None

    # --- the episode --------------------------------------------------------------------------------------------

    def _correlate(self, inc: Incident) -> datetime:
        """Inside the correlation window with no culprit known: wait for the rest of the job's alerts."""
        if not inc["reason"]:
            reason = f"correlating: waiting for the rest of job {inc['job']}'s alerts until {inc['act_after']:%H:%M:%S}"
            self._transition(lambda conn, now: transitions.update(conn, now, inc, reason=reason))
        return inc["act_after"]

    def _job_before_acting(self, inc: Incident) -> JobStatus | datetime | None:
        """What the scheduler says of the job before its recovery: its status, None when it cannot be read (then
        the recovery goes ahead and excludes no node), or when to ask again. Bounded: the job's recovery never
        waits long on the scheduler's view (not at all when no access to it is configured)."""
        try:
            return job_status(self.deps.clients, inc["target"])
        except (BackendError, ConfigError) as exc:
            with self.deps.store.read() as conn:
                tries = 1 + sum(
                    1 for r in records.ledger_for(conn, inc["id"]) if r["kind"] == "job_status_unknown"
                )
            last = tries >= ALLOCATION_TRIES or isinstance(exc, ConfigError)
            then = "recovering the job without excluding any node" if last else "will ask again"
            self._ledger(
                inc, "job_status_unknown", f"cannot read job {inc['job']} from the scheduler ({exc}): {then}"
            )
            if last:
                return None
            return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)

    def _confirm_culprits(self, inc: Incident, status: JobStatus | None) -> episodes.Exclusion:
        """Culprits checked against the job's allocation (a node outside it is evidence, never excluded or
        drained; an unread allocation confirms none), then the exclusion."""
        culprits = inc["culprits"] or []
        if not culprits or status is None:
            return episodes.Exclusion()
        confirmed = episodes.confirm(culprits, status.nodes)
        outside = [c["node"] for c in confirmed if not c["confirmed"]]
        message = (
            f"job {inc['job']} runs on {', '.join(status.nodes) or 'no node'} ({status.state or 'unknown'}); "
            f"culprits: {', '.join(c['node'] for c in confirmed if c['confirmed']) or 'none confirmed'}"
            + (f"; outside the allocation (evidence only): {', '.join(outside)}" if outside else "")
        )
        # The incident's node is its (first) confirmed culprit: filters, tags and the node views find it there.
        node = next((c["node"] for c in confirmed if c["confirmed"]), None)
        self._transition(
            lambda conn, now: transitions.update(
                conn,
                now,
                inc,
                ledger=("culprits", message, {"culprits": confirmed}),
                culprits=confirmed,
                node=node,
            )
        )
        widened = self.fleet.widen(inc, [c["node"] for c in confirmed if c["confirmed"]])
        if widened is not None:
            self._ledger(inc, "blame", widened[1], {"nodes": list(widened[0])})
            return episodes.Exclusion(nodes=widened[0])
        e = self.deps.settings.episodes
        return episodes.exclusion(confirmed, len(status.nodes), e.max_culprits, e.max_culprit_share)

    def _hand_to_repair(self, inc: Incident, playbook: Playbook) -> datetime | None:
        """A node incident: its node goes through the repair lifecycle; the incident waits for the verdict."""
        node = inc["node"]
        reason = f"{inc['labels'].get('alertname', 'alert')}: {(inc['diagnosis'] or {}).get('summary', '')}"

        def request(conn: Connection, now: datetime) -> None:
            repair_id = repairs.request_repair(
                conn,
                node=node,
                scheduler=inc["target"].get("scheduler", "slurm"),
                playbook=playbook.name,
                incident_id=inc["id"],
                reason=reason[:500],
                now=now,
            )
            culprit = {"node": node, "source": "alert", "reason": reason[:300], "confirmed": True}
            transitions.update(conn, now, inc, culprits=[{**culprit, "repair_id": repair_id}])
            transitions.wait(
                conn,
                now,
                inc,
                f"node {node} handed to repair #{repair_id}",
                state=State.REPAIRING,
                kind="repair_requested",
            )

        self._transition(request)
        return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)

    def _repair_settled(self, inc: Incident) -> datetime | None:
        repair_id = next((c.get("repair_id") for c in inc["culprits"] or ()), None)
        with self.deps.store.read() as conn:
            repair = repairs.get_repair(conn, repair_id) if repair_id else None
        if repair is None:
            return self._close(inc, Closed.NEEDS_HUMAN, f"the repair of node {inc['node']} is gone")
        if repair["state"] not in REPAIR_SETTLED:
            return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)
        outcome = _REPAIR_OUTCOME[RepairState(repair["state"])]
        return self._close(
            inc, outcome, f"node {inc['node']}: repair #{repair['id']} {repair['state']}: {repair['reason']}"
        )

    # --- diagnosis ------------------------------------------------------------------------------------------

    def _diagnose(self, inc: Incident, playbook: Playbook) -> None:
        self._transition(
            lambda conn, now: transitions.update(conn, now, inc, state=State.DIAGNOSING, reason="")
        )
        logs = []
        for step in self._materialise(inc, playbook.collect, attempt=0, phase="collect"):
            if step["status"] == StepStatus.PENDING:
                outcome = self._execute(inc, step)
                if isinstance(outcome, Ok) and outcome.data.get("log"):
                    logs.append(str(outcome.data["log"]))
        diagnosis = self.deps.diagnose(inc["labels"], "\n".join(logs)).as_dict()
        culprit = (diagnosis.get("culprit") or {}).get("node")
        peers: list[str] = []
        if inc["kind"] == IncidentKind.JOB:
            peers, reporters = self.fleet.lost_peers("\n".join(logs))
            if peers and culprit in reporters:
                culprit = None  # a rank that logged a lost peer: the peer is the suspect, never the logger

        def record(conn: Connection, now: datetime) -> None:
            values: dict[str, Any] = {"diagnosis": diagnosis}
            named = inc["culprits"]
            for node, source in [
                *((p, "lost peer") for p in peers),
                *([(culprit, "diagnosis")] if culprit else []),
            ]:
                if inc["kind"] == IncidentKind.JOB:
                    named = episodes.add_culprit(named, node, source, diagnosis["summary"][:300]) or named
            if named is not inc["culprits"]:
                values["culprits"] = named
            summary = f"{diagnosis['category']} ({diagnosis['confidence']:.2f}): {diagnosis['summary']}"
            transitions.update(conn, now, inc, ledger=("diagnosis", summary, diagnosis), **values)

        self._transition(record)

    # --- deciding ---------------------------------------------------------------------------------------------

    def _decide(self, inc: Incident, playbook: Playbook) -> datetime | None:
        deps = self.deps
        exclusion = episodes.Exclusion()
        job_phase = ""  # what `when: job_phase=...` sees: set for job incidents only
        if inc["kind"] == IncidentKind.JOB:
            status = self._job_before_acting(inc)
            if isinstance(status, datetime):
                return status
            job_phase = status.phase if status is not None else JobPhase.UNKNOWN
            if status is not None and status.phase == JobPhase.COMPLETED:
                reason = (
                    f"job {inc['job']} is {status.state}: it ended on purpose or normally, nothing to recover"
                )
                return self._close(inc, Closed.COMPLETED, reason)
            held_until = self.fleet.hold(inc) or self.fleet.storm_wait(inc)
            if held_until is not None:
                return held_until
            exclusion = self._confirm_culprits(inc, status)
            if exclusion.refused:
                return self._close(inc, Closed.NEEDS_HUMAN, exclusion.refused)
        now = deps.clock.now()
        planned = self._plan(
            inc,
            playbook.steps,
            attempt=inc["attempt"] + 1,
            exclude=exclusion.nodes,
            job_phase=job_phase,
        )
        invalid = [p for p in planned if p.status == INVALID]
        if invalid:
            for p in invalid:
                self._ledger(inc, "step_invalid", f"{p.name}: {p.reason}", {"action": p.action.name})
            return self._close(inc, Closed.NEEDS_HUMAN, f"step {invalid[0].name}: {invalid[0].reason}")
        with deps.store.read() as conn:
            history = guard_facts.read_history(
                conn, deps.settings, deps.registry, playbook, inc, now, deps.pause_state(conn)
            )
        taking_out = sorted(nodes_taken_out(planned))
        pool = (
            pool_facts(deps, inc["target"].get("scheduler", "slurm"), taking_out[0])[0]
            if taking_out
            else None
        )
        facts = guard_facts.build(
            deps.settings,
            playbook,
            pool=pool,
            job=inc["job"] if inc["kind"] == IncidentKind.JOB else None,
            node=inc["node"],
            alert_starts_at=inc["alert_starts_at"],
            planned=planned,
            history=history,
            now=now,
        )
        verdicts = guards.evaluate(facts)
        self._record_verdicts(inc, verdicts)
        last = verdicts[-1]
        if last.decision == guards.PASS and playbook.recheck:
            last = self._recheck(inc, playbook, now)
            self._record_verdicts(inc, [last])
        if last.decision == guards.WAIT:
            self._transition(
                lambda conn, now: transitions.wait(conn, now, inc, last.reason, held_by_guard=True)
            )
            if last.guard == "blast_radius":
                self.effects.storm(inc, last.reason)
            return last.until
        if last.decision == guards.STOP:
            if last.outcome == Closed.ADVISORY:
                self._run_advisory(inc, planned)
                # The culprits' repairs record their plans too (advisory themselves unless their steps are granted).
                self._transition(
                    lambda conn, now: self._request_repairs(conn, now, inc, _repairable(inc, exclusion.nodes))
                )
            return self._close(inc, Closed(last.outcome or Closed.NEEDS_HUMAN), last.reason)
        return self._start_attempt(inc, playbook, planned, exclusion.nodes)

    def _recheck(self, inc: Incident, playbook: Playbook, now: datetime) -> guards.Verdict:
        expr = render_promql(playbook.recheck or "", self._template_context(inc))
        defer = timedelta(seconds=self.deps.settings.guards.defer_seconds)
        try:
            samples = self.deps.clients.prometheus.query(expr)
        except (BackendError, ConfigError) as exc:
            return guards.recheck(expr, None, str(exc), now, defer)
        self._ledger(
            inc,
            "recheck",
            f"{len(samples)} series for {expr}",
            {"expr": expr, "samples": [_sample(s) for s in samples[:20]]},
        )
        return guards.recheck(expr, len(samples), None, now, defer)

    def _record_verdicts(self, inc: Incident, verdicts: Sequence[guards.Verdict]) -> None:
        """The guards' verdicts in the ledger, in one transaction, and in the metrics."""
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            for verdict in verdicts:
                records.record(
                    conn,
                    now,
                    "guard",
                    f"{verdict.guard}: {verdict.decision}: {verdict.reason}",
                    incident_id=inc["id"],
                    data=verdict.as_dict(),
                )
        for verdict in verdicts:
            self.deps.metrics.guard_verdicts.labels(verdict.guard, verdict.decision).inc()

    # --- acting -----------------------------------------------------------------------------------------------

    def _run_advisory(self, inc: Incident, planned: Sequence[PlannedStep]) -> None:
        """Advisory mode: record every step as it would run; run only the granted read-only ones (notices, logs)."""
        rows = self._transition(
            lambda conn, now: transitions.persist_plan(conn, now, inc, planned, attempt=0, phase="steps")
        )
        self._count_unrun(planned)
        for step in rows:
            if step["status"] == StepStatus.PENDING:
                self._execute(inc, step)

    def _start_attempt(
        self, inc: Incident, playbook: Playbook, planned: Sequence[PlannedStep], exclude: Sequence[str]
    ) -> datetime | None:
        """One transaction: the attempt, the incident acting, the planned steps, and a repair of each culprit."""
        note = f"excluding {', '.join(exclude)}" if exclude else ""

        def start(conn: Connection, now: datetime) -> None:
            transitions.start_attempt(conn, now, inc, planned, playbook=playbook.name, note=note)
            self._request_repairs(conn, now, inc, _repairable(inc, exclude))
            if inc["kind"] == IncidentKind.JOB:
                self.fleet.count_restart(conn, now)

        self._transition(start)
        self._count_unrun(planned)
        return self._act(inc, playbook)

    def _request_repairs(self, conn: Connection, now: datetime, inc: Incident, nodes: Sequence[str]) -> None:
        """Hand each culprit node to the node repair lifecycle (in the caller's transaction), except a culprit
        its playbook only excludes (a straggler) until its ``exclude_node.repair_after``-th exclusion."""
        for node in nodes:
            named_by = _culprit(inc, node).get("playbook")
            playbook = self.deps.playbooks.get(named_by) if named_by else None
            if playbook is not None and playbook.exclude_node is not None:
                rule = playbook.exclude_node
                excluders = [p.name for p in self.deps.playbooks.playbooks if p.exclude_node is not None]
                earlier = records.exclusions_of(
                    conn, node, excluders, now - rule.window, other_than=inc["id"]
                )
                if not episodes.repair_due(playbook, earlier):
                    records.record(
                        conn,
                        now,
                        "culprit_excluded_only",
                        f"{node} excluded from job {inc['job']} without a repair ({earlier + 1} of "
                        f"{rule.repair_after} exclusions within {rule.window})",
                        incident_id=inc["id"],
                        data={"node": node, "exclusions": earlier + 1, "repair_after": rule.repair_after},
                    )
                    continue
            repairs.request_repair(
                conn,
                node=node,
                scheduler=inc["target"].get("scheduler", "slurm"),
                playbook=_culprit(inc, node).get("playbook"),
                incident_id=inc["id"],
                reason=f"culprit of job {inc['job']}: {_culprit_reason(inc, node)}"[:500],
                now=now,
            )

    def _act(self, inc: Incident, playbook: Playbook) -> datetime | None:
        deps = self.deps
        for step in self._steps(inc, attempt=inc["attempt"], phase="steps"):
            if step["status"] in DONE_STEP_STATUSES:
                continue
            if step["status"] not in (StepStatus.PENDING, StepStatus.RETRY, StepStatus.AWAITING_APPROVAL):
                return self._close(inc, Closed.NEEDS_HUMAN, f"step {step['name']} is {step['status']}")
            if step["approval"] and not step["approved_by"]:
                return self._await_approval(inc, step)
            outcome = self._execute(inc, step)
            if isinstance(outcome, Ok):
                continue
            if isinstance(outcome, Retry) and step["retries"] < deps.settings.worker.step_retry_limit:
                self._transition(lambda conn, now, step=step: transitions.retry_step(conn, step))
                return deps.clock.now() + timedelta(seconds=outcome.after)
            if isinstance(outcome, Ambiguous):
                return self._close(
                    inc, Closed.NEEDS_HUMAN, f"step {step['name']}: outcome unknown: {outcome.reason}"
                )
            if isinstance(outcome, CredentialError):
                self.effects.credential_error(step["action"], outcome.reason)
                return self._close(inc, Closed.CREDENTIAL_ERROR, f"step {step['name']}: {outcome.reason}")
            return self._attempt_failed(inc, f"step {step['name']} failed: {getattr(outcome, 'reason', '')}")
        if playbook.verify is None:
            return self._close(inc, Closed.UNVERIFIED, "steps done; the playbook has no verification")
        verify = playbook.verify
        self._transition(
            lambda conn, now: transitions.verify(
                conn, now, inc, now + verify.timeout, f"polling {verify.promql} for up to {verify.timeout}"
            )
        )
        return deps.clock.now() + verify.interval

    def _await_approval(self, inc: Incident, step: dict[str, Any]) -> datetime:
        """Hold the attempt before a step marked ``approval: required`` until an operator approves it."""
        if step["status"] != StepStatus.AWAITING_APPROVAL:
            reason = f"step {step['name']} awaits operator approval"

            def hold(conn: Connection, now: datetime) -> None:
                records.update_step(conn, step["id"], status=StepStatus.AWAITING_APPROVAL)
                transitions.update(
                    conn,
                    now,
                    inc,
                    ledger=("approval_requested", f"{reason}: {step['command']}", {"step_id": step["id"]}),
                    reason=reason,
                )

            self._transition(hold)
            self.effects.approval_requested(inc, step)
        # Polled rather than parked: an approval that lands while this worker holds the claim is never lost.
        return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)

    # --- verifying --------------------------------------------------------------------------------------------

    def _verify(self, inc: Incident, playbook: Playbook) -> datetime | None:
        assert playbook.verify is not None
        verify = playbook.verify
        now = self.deps.clock.now()
        if inc["kind"] == IncidentKind.JOB:
            waiting = self._job_waiting(inc, verify.timeout)
            if waiting is not None:
                return waiting
        # Only samples after the recovery action (or the job running again) count, whatever the query's window.
        since = now - (inc["verify_from"] or now)
        expr = clamp_ranges(render_promql(verify.promql, self._template_context(inc)), since)
        try:
            samples = self.deps.clients.prometheus.query(expr)
            error = None
        except (BackendError, ConfigError) as exc:
            samples, error = [], str(exc)
        self._ledger(
            inc,
            "verify_sample",
            f"{len(samples)} series" + (f" (error: {error})" if error else ""),
            {"expr": expr, "samples": [_sample(s) for s in samples[:20]], "error": error},
        )
        if samples:
            return self._close(inc, Closed.RECOVERED, f"verified: {expr} returned {len(samples)} series")
        if now >= inc["verify_deadline"]:
            return self._attempt_failed(inc, f"verification timed out: {expr} returned nothing")
        return now + verify.interval

    def _job_waiting(self, inc: Incident, timeout: timedelta) -> datetime | None:
        """A requeued job waiting in the queue is not a failed attempt: hold the verification (its deadline and
        its first sample) until the scheduler reports it running. Returns when to look again while it waits."""
        try:
            status = job_status(self.deps.clients, inc["target"])
        except (BackendError, ConfigError) as exc:
            self._ledger(inc, "job_status_error", f"cannot read job {inc['job']}'s state: {exc}")
            return None
        if status.phase == JobPhase.WAITING:
            if inc["state"] != State.WAITING_FOR_RESOURCES:
                message = f"job {inc['job']} is {status.state}: waiting for resources; verification starts when it runs"
                self._transition(
                    lambda conn, now: transitions.wait(
                        conn,
                        now,
                        inc,
                        message,
                        state=State.WAITING_FOR_RESOURCES,
                        kind="waiting_for_resources",
                    )
                )
            return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)
        if inc["state"] == State.WAITING_FOR_RESOURCES:
            message = (
                f"job {inc['job']} is {status.state} on {', '.join(status.nodes) or '?'}: verifying from now"
            )
            self._transition(lambda conn, now: transitions.verify(conn, now, inc, now + timeout, message))
        return None

    def _attempt_failed(self, inc: Incident, reason: str) -> datetime | None:
        if inc["alert_resolved"]:
            return self._close(inc, Closed.FAILED, reason)
        # The guard chain decides what comes next: backoff, another attempt, or needs_human when the budget is spent.
        self._transition(lambda conn, now: transitions.attempt_failed(conn, now, inc, reason))
        return self.deps.clock.now()

    def _run_on_resolved(self, inc: Incident) -> datetime | None:
        playbook = self.deps.playbooks.get(inc["playbook"])
        with self.deps.store.read() as conn:
            paused, _ = self.deps.pause_state(conn)
        if paused:
            self._ledger(inc, "guard", "kill_switch: wait: undo steps held while automation is paused")
            return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)
        if playbook is not None:
            for step in self._materialise(
                inc, playbook.on_resolved, attempt=inc["attempt"], phase="on_resolved"
            ):
                if step["status"] == StepStatus.PENDING:
                    self._execute(inc, step)
        self._transition(
            lambda conn, now: transitions.update(conn, now, inc, on_resolved_state=UndoState.DONE)
        )
        return None

    # --- steps ------------------------------------------------------------------------------------------------

    def _plan(
        self,
        inc: Incident,
        steps: Sequence[Step],
        attempt: int,
        exclude: Sequence[str] = (),
        job_phase: str = "",
    ) -> list[PlannedStep]:
        return plan_steps(
            steps,
            registry=self.deps.registry,
            permissions=self.deps.permissions,
            template_context=self._template_context(inc, exclude),
            when=when_context(inc["labels"], inc["diagnosis"], attempt, job_phase),
            target=inc["target"],
        )

    def _materialise(
        self, inc: Incident, steps: Sequence[Step], attempt: int, phase: str
    ) -> list[dict[str, Any]]:
        planned = self._plan(inc, steps, attempt)
        rows = self._transition(
            lambda conn, now: transitions.persist_plan(conn, now, inc, planned, attempt=attempt, phase=phase)
        )
        self._count_unrun(planned)
        return rows

    def _count_unrun(self, planned: Sequence[PlannedStep]) -> None:
        for p in planned:
            if not p.runs:
                self.deps.metrics.steps.labels(p.action.name, p.status).inc()

    def _steps(self, inc: Incident, attempt: int, phase: str) -> list[dict[str, Any]]:
        with self.deps.store.read() as conn:
            return records.get_steps(conn, inc["id"], attempt=attempt, phase=phase)

    def _execute(self, inc: Incident, step: dict[str, Any]) -> Outcome:
        """Run one step: marked ``running`` durably first, then the action, then its outcome and output."""
        deps = self.deps
        self._transition(lambda conn, now: transitions.start_step(conn, now, step))
        action = deps.registry.get(step["action"])
        ctx = ActionContext(
            settings=deps.settings,
            clients=deps.clients,
            clock=deps.clock,
            incident_id=inc["id"],
            labels=inc["labels"],
            record=lambda kind, message, data: self._ledger(inc, kind, message, data),
        )
        t0 = time.monotonic()
        try:
            with self._lease_kept(inc):
                outcome = action.run(action.validate(step["params"]), ctx)
        except ParamError as exc:
            outcome = Failed(reason=str(exc))
        except Exception as exc:  # an action bug must not kill the worker; it is a failed step
            log.exception("action %s raised", step["action"])
            outcome = Failed(reason=f"internal error in {step['action']}: {exc!r}")
        duration = round(time.monotonic() - t0, 3)
        self._transition(
            lambda conn, now: transitions.finish_step(
                conn,
                now,
                inc,
                step,
                status=outcome.status,
                command=outcome.command or step["command"],
                exit_code=outcome.exit_code,
                output=tail(outcome.output),
                ledger_output=tail(outcome.output, 2000),
                reason=getattr(outcome, "reason", ""),
                duration=duration,
            )
        )
        deps.metrics.steps.labels(step["action"], outcome.status).inc()
        deps.metrics.step_duration.labels(step["action"], outcome.status).observe(duration)
        return outcome

    def _recover_in_flight(self, inc: Incident) -> bool:
        """Steps left ``running`` by a dead worker: re-run read-only ones, mark the others ambiguous."""
        with self.deps.store.read() as conn:  # nearly always none: spare the write lock
            if not any(s["status"] == StepStatus.RUNNING for s in records.get_steps(conn, inc["id"])):
                return False
        with self.deps.store.transaction() as conn:
            running = [s for s in records.get_steps(conn, inc["id"]) if s["status"] == StepStatus.RUNNING]
            ambiguous = []
            for step in running:
                if step["action"] in self.deps.registry and self.deps.registry.get(step["action"]).read_only:
                    records.update_step(conn, step["id"], status=StepStatus.PENDING)
                    continue
                records.update_step(
                    conn,
                    step["id"],
                    status=StepStatus.AMBIGUOUS,
                    reason="in flight when its worker stopped; outcome unknown, not re-run",
                )
                ambiguous.append(step["name"])
            if ambiguous:
                reason = (
                    f"step {ambiguous[0]} was in flight when its worker stopped: outcome unknown, not re-run"
                )
                records.record(
                    conn,
                    self.deps.clock.now(),
                    "step_ambiguous",
                    reason,
                    incident_id=inc["id"],
                    data={"steps": ambiguous},
                )
                inc["reason"] = reason
        return bool(ambiguous)

    # --- closing and bookkeeping ------------------------------------------------------------------------------

    def _close(self, inc: Incident, outcome: Closed, reason: str) -> datetime | None:
        self._transition(lambda conn, now: transitions.close(conn, now, inc, outcome, reason))
        self.deps.metrics.incidents.labels(outcome).inc()
        return self.effects.finalize(inc)

    def _transition(self, change: Any) -> Any:
        """Run ``change(conn, now)`` in one transaction; returns what it returns."""
        with self.deps.store.transaction() as conn:
            return change(conn, self.deps.clock.now())

    @contextmanager
    def _lease_kept(self, inc: Incident) -> Iterator[None]:
        """Renew this worker's claim while a step runs, so a long step is never taken for a dead worker's."""
        stop = threading.Event()
        lease = self.deps.settings.worker.lease_seconds

        def beat() -> None:
            while not stop.wait(max(1.0, lease / 3)):
                until = self.deps.clock.now() + timedelta(seconds=lease)
                try:
                    with self.deps.store.transaction() as conn:
                        records.renew_claim(conn, inc["id"], inc["claimed_by"], until)
                except StoreUnavailable as exc:
                    log.warning("incident %s: lease renewal failed: %s", inc["id"], exc)

        heart = threading.Thread(target=beat, name=f"lease-{inc['id']}", daemon=True)
        heart.start()
        try:
            yield
        finally:
            stop.set()
            heart.join()

    def _ledger(self, inc: Incident, kind: str, message: str, data: Mapping[str, Any] | None = None) -> None:
        self.deps.ledger(inc["id"], kind, message, data)

    def _template_context(self, inc: Incident, exclude: Sequence[str] = ()) -> dict[str, Mapping[str, Any]]:
        return template_context(inc, self.deps.settings.external_url, exclude)


def template_context(
    inc: Incident, external_url: str, exclude: Sequence[str] = ()
) -> dict[str, Mapping[str, Any]]:
    """What templates may reference: labels, annotations, target, diagnosis, incident. ``incident.culprits`` is
    the comma-separated list of nodes the recovery excludes ("" when none)."""
    return {
        "labels": inc["labels"],
        "annotations": inc["annotations"],
        "target": inc["target"],
        "diagnosis": {
            k: "" if v is None else str(v)
            for k, v in (inc.get("diagnosis") or {}).items()
            if not isinstance(v, list | dict)
        },
        "incident": {
            "id": str(inc.get("id", "")),
            "playbook": inc["playbook"],
            "url": f"{external_url.rstrip('/')}/incidents/{inc.get('id', '')}",
            "culprits": ",".join(exclude),
        },
    }


def _sample(sample: Any) -> dict[str, Any]:
    return {"labels": dict(sample.labels), "value": sample.value}


def _benign(diagnosis: Mapping[str, Any] | None) -> bool:
    return bool(diagnosis) and diagnosis.get("category") in BENIGN_CATEGORIES


def _culprit(inc: Incident, node: str) -> Mapping[str, Any]:
    return next((c for c in inc["culprits"] or () if c["node"] == node), {})


def _culprit_reason(inc: Incident, node: str) -> str:
    named = _culprit(inc, node)
    return f"{named['source']}: {named['reason']}" if named else "named by the diagnosis"


def _repairable(inc: Incident, excluded: Sequence[str]) -> Sequence[str]:
    """The excluded nodes to hand to repair: all of them when they are the job's culprits; none when the exclusion
    is a leaf's, a rack's or a block's nodes (the domain is at fault, not its nodes: app/engine/fleet_hold.py)."""
    culprits = {c["node"] for c in inc["culprits"] or ()}
    return excluded if set(excluded) <= culprits else ()
