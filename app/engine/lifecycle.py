"""Advancing one claimed incident by one tick: gather the facts, decide (:mod:`app.domain.incident_policy`), apply.

Each tick is short; waits (the correlation window, guards, retries, verification polls) release the incident with a
``next_run_at`` so one worker thread serves many incidents and a crash loses nothing: every change is one transition
of :mod:`app.engine.transitions` (one transaction each), a step is marked ``running`` before it starts, and a step
found ``running`` by a later claimer is ``ambiguous`` and never re-run.

A job incident (one failure episode of a training job, :mod:`app.domain.episodes`) waits out its correlation window
unless a culprit node is known, diagnoses over all its evidence, confirms its culprits against the job's allocation, and
runs one recovery of the job that excludes them; each confirmed culprit is handed to the node repair lifecycle
(:mod:`app.engine.repair`) in the same transaction, and the job's recovery never waits on it. A node incident (a
node-scoped fault on a node that runs no job) goes through the same guard chain and live re-check, then hands its node
to the repair lifecycle and closes with its verdict.

What comes next is :func:`app.domain.incident_policy.decide`'s; the facts it asks for are gathered by
:class:`app.engine.worker_facts.WorkerSource`; this module applies the decision through the named transitions and
runs the attempt's steps and its verification.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from app.domain import incident_policy as policy
from app.domain.errors import BackendError, ConfigError
from app.domain.job_phase import JobPhase
from app.domain.outcome import Ambiguous, CredentialError, Ok, Retry
from app.domain.planning import PlannedStep
from app.domain.playbooks import Playbook
from app.domain.promql_window import clamp_ranges
from app.domain.states import (
    DONE_STEP_STATUSES,
    NOT_ACTED,
    Guard,
    IncidentKind,
    IncidentOutcome,
    LedgerKind,
    State,
    StepStatus,
    UndoState,
)
from app.domain.templates import render_promql
from app.engine import claims, transitions
from app.engine.context import template_context
from app.engine.deps import EngineDeps
from app.engine.effects import Effects
from app.engine.facts import decide_with
from app.engine.fleet_hold import FleetHolds, waits_for_restart
from app.engine.scheduler_backends import job_status
from app.engine.steps import StepRunner
from app.engine.worker_facts import WorkerSource
from app.store import records
from app.store.claims import INCIDENTS
from app.store.rows import Incident, StepRow

log = logging.getLogger(__name__)


class Lifecycle:
    """The incident state machine's driver: the only place that sequences actions, guards and store writes."""

    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self.effects = Effects(deps)
        self.steps = StepRunner(deps)
        self.fleet = FleetHolds(deps, self.effects.fleet_incident)
        self.source = WorkerSource(deps, self.steps, self.fleet)
        self.claims = claims.Lifecycle(INCIDENTS, records.get_incident, self._tick, self._tick_failed)

    # --- claiming ---------------------------------------------------------------------------------------------

    def work_once(self, worker: str) -> int | None:
        """Claim one due incident, advance it one tick, release it. Returns its id, or None when idle."""
        return claims.work_once(self.deps, self.claims, worker)

    def _tick_failed(self, claimed: Incident, exc: Exception) -> datetime | None:
        """Count the failure on the incident as stored; the same error N times in a row goes to a person."""
        deps = self.deps
        now = deps.clock.now()
        with deps.store.transaction() as conn:
            inc = records.get_incident(conn, claimed.id)
            if inc is None or inc.open_key is None:
                return None
            closed = transitions.tick_failed(conn, now, inc, repr(exc), deps.settings.worker.max_tick_errors)
        if closed:
            deps.metrics.incidents.labels(IncidentOutcome.NEEDS_HUMAN).inc()
            return now
        return now + timedelta(seconds=deps.settings.guards.defer_seconds)

    def _tick(self, inc: Incident) -> datetime | None:
        """One tick. One of an open incident that goes through after failed ones resets their count: only
        failures in a row (at ``worker.max_tick_errors``) hand it to a person, who then sees the count it reached."""
        following = self._advance(inc)
        if inc.tick_errors and inc.open_key is not None:
            self._transition(lambda conn, now: transitions.tick_succeeded(conn, now, inc))
        return following

    def _advance(self, inc: Incident) -> datetime | None:
        if inc.open_key is None:
            return self._closed_tick(inc)
        playbook = self.deps.playbooks.get(inc.playbook)
        if playbook is None:
            return self._close(
                inc, IncidentOutcome.NEEDS_HUMAN, f"playbook {inc.playbook!r} is no longer loaded"
            )
        ambiguous = self._recover_in_flight(inc)
        if ambiguous is not None:
            return self._close(inc, IncidentOutcome.NEEDS_HUMAN, ambiguous)
        if self._resolved_before_acting(inc):
            outcome = IncidentOutcome.BLOCKED if inc.held_by_guard else IncidentOutcome.RESOLVED
            return self._close(inc, outcome, "its alerts resolved while a worker held it, before any action")
        inc = self.effects.open_annotation(inc)
        if inc.kind == IncidentKind.NODE and inc.state in (State.OPEN, State.DIAGNOSING, State.WAITING):
            held_until = self.fleet.hold_node(inc)
            if held_until is not None:
                return held_until
            if inc.state == State.WAITING and inc.diagnosis is None:
                # Released from behind a failing domain before it was diagnosed: decided as a new one.
                inc = replace(inc, state=State.OPEN)
        decision, _, inc = decide_with(self.deps, self.source, inc, playbook)
        return self._apply(inc, playbook, decision)

    def _resolved_before_acting(self, inc: Incident) -> bool:
        """Whether every alert resolved while a worker held the incident, before it acted (ingestion closes an
        unheld one itself; a held one it pokes). A job whose restart waits on the fleet is not closed for it."""
        if not inc.alert_resolved or inc.acted or inc.state not in NOT_ACTED or waits_for_restart(inc):
            return False
        with self.deps.store.read() as conn:
            return records.firing_alert_count(conn, inc.id) == 0

    def _closed_tick(self, inc: Incident) -> datetime | None:
        if inc.on_resolved_state == UndoState.PENDING:
            wait, inc = self._run_on_resolved(inc)
            if wait is not None:
                return wait
        if inc.finalize_pending:
            return self.effects.finalize(inc)
        return None

    # --- applying the policy's decision ---------------------------------------------------------------------

    def _apply(self, inc: Incident, playbook: Playbook, decision: policy.Decision) -> datetime | None:
        """Write the decision (with what was learned on the way) through its transition, then act on it."""
        if isinstance(decision, policy.Act):
            return self._act(inc, playbook)
        if isinstance(decision, policy.Verify):
            return self._verify(inc, playbook)
        learned = decision.learned if not isinstance(decision, policy.Gather) else policy.Learned()
        self._count_verdicts(learned)
        if isinstance(decision, policy.Wait):
            return self._wait(inc, decision)
        if isinstance(decision, policy.Close):
            return self._decided_close(inc, decision)
        if isinstance(decision, policy.StartAttempt):
            return self._start_attempt(inc, playbook, decision)
        if isinstance(decision, policy.HandToRepair):
            return self._hand_to_repair(inc, playbook, decision)
        raise AssertionError(f"the policy asked for {decision.need} after deciding")

    def _wait(self, inc: Incident, wait: policy.Wait) -> datetime:
        if wait.elsewhere:
            return wait.until
        if wait.correlating:
            if not inc.reason:
                self._transition(lambda conn, now: transitions.correlating(conn, now, inc, wait.reason))
            return wait.until
        if inc.state == State.REPAIRING:  # polling the repair: nothing to write
            return wait.until

        def hold(conn: Connection, now: datetime) -> Incident:
            learned = transitions.learned(conn, now, inc, wait.learned)
            return transitions.hold(conn, now, learned, wait.reason, held_by_guard=wait.guard is not None)

        inc = self._transition(hold)
        if wait.guard is not None and wait.guard.guard == Guard.BLAST_RADIUS:
            self.effects.storm(inc, wait.reason)
        return wait.until

    def _decided_close(self, inc: Incident, close: policy.Close) -> datetime | None:
        inc = self._transition(lambda conn, now: transitions.learned(conn, now, inc, close.learned))
        if close.advisory:
            self._run_advisory(inc, close.planned)
            # The culprits' repairs record their plans too (advisory themselves unless their steps are granted).
            self._transition(
                lambda conn, now: transitions.request_repairs(
                    conn,
                    now,
                    inc,
                    _repairable(inc, close.exclude),
                    playbooks=self.deps.playbooks,
                )
            )
        return self._close(inc, close.outcome, close.reason)

    def _start_attempt(
        self, inc: Incident, playbook: Playbook, start: policy.StartAttempt
    ) -> datetime | None:
        """One transaction: what was learned, the attempt, the incident acting, its planned steps, and a repair
        of each culprit."""

        def begin(conn: Connection, now: datetime) -> Incident:
            learned = transitions.learned(conn, now, inc, start.learned)
            acting = transitions.start_attempt(
                conn, now, learned, start.planned, playbook=playbook.name, note=start.note
            )
            transitions.request_repairs(
                conn,
                now,
                acting,
                _repairable(acting, start.exclude),
                playbooks=self.deps.playbooks,
            )
            if acting.kind == IncidentKind.JOB:
                self.fleet.count_restart(conn, now)
            return acting

        acting = self._transition(begin)
        self.steps.count_unrun(start.planned)
        return self._act(acting, playbook)

    def _hand_to_repair(self, inc: Incident, playbook: Playbook, hand: policy.HandToRepair) -> datetime:
        """A node incident: its node goes through the repair lifecycle; the incident waits for the verdict."""

        def request(conn: Connection, now: datetime) -> None:
            transitions.hand_to_repair(
                conn,
                now,
                transitions.learned(conn, now, inc, hand.learned),
                node=hand.node,
                playbook=playbook.name,
                reason=hand.reason,
            )

        self._transition(request)
        return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)

    def _count_verdicts(self, learned: policy.Learned) -> None:
        for verdict in learned.verdicts:
            self.deps.metrics.guard_verdicts.labels(verdict.guard, verdict.decision).inc()

    # --- acting -----------------------------------------------------------------------------------------------

    def _run_advisory(self, inc: Incident, planned: Sequence[PlannedStep]) -> None:
        """Advisory mode: record every step as it would run; run only the granted read-only ones (notices, logs)."""
        for step in self.steps.persist(inc, planned, attempt=0, phase="steps"):
            if step.status == StepStatus.PENDING:
                self.steps.execute(inc, step)

    # --- acting -----------------------------------------------------------------------------------------------

    def _act(self, inc: Incident, playbook: Playbook) -> datetime | None:
        deps = self.deps
        for step in self.steps.rows(inc, attempt=inc.attempt, phase="steps"):
            if step.status in DONE_STEP_STATUSES:
                continue
            if step.status not in (StepStatus.PENDING, StepStatus.RETRY, StepStatus.AWAITING_APPROVAL):
                return self._close(inc, IncidentOutcome.NEEDS_HUMAN, f"step {step.name} is {step.status}")
            if step.approval and not step.approved_by:
                return self._await_approval(inc, step)
            outcome = self.steps.execute(inc, step)
            if isinstance(outcome, Ok):
                continue
            if isinstance(outcome, Retry) and step.retries < deps.settings.worker.step_retry_limit:
                self._transition(lambda conn, now, step=step: transitions.retry_step(conn, step))
                return deps.clock.now() + timedelta(seconds=outcome.after)
            if isinstance(outcome, Ambiguous):
                return self._close(
                    inc,
                    IncidentOutcome.NEEDS_HUMAN,
                    f"step {step.name}: outcome unknown: {outcome.reason}",
                )
            if isinstance(outcome, CredentialError):
                self.effects.credential_error(step.action, outcome.reason)
                return self._close(
                    inc, IncidentOutcome.CREDENTIAL_ERROR, f"step {step.name}: {outcome.reason}"
                )
            return self._attempt_failed(inc, f"step {step.name} failed: {getattr(outcome, 'reason', '')}")
        if playbook.verify is None:
            return self._close(
                inc, IncidentOutcome.UNVERIFIED, "steps done; the playbook has no verification"
            )
        verify = playbook.verify
        query = render_promql(verify.promql, template_context(inc, deps.settings.external_url))
        self._transition(
            lambda conn, now: transitions.verify(
                conn, now, inc, now + verify.timeout, f"polling {query} for up to {verify.timeout}"
            )
        )
        return deps.clock.now() + verify.interval

    def _await_approval(self, inc: Incident, step: StepRow) -> datetime:
        """Hold the attempt before a step marked ``approval: required`` until an operator approves it."""
        if step.status != StepStatus.AWAITING_APPROVAL:
            reason = f"step {step.name} awaits operator approval"

            self._transition(lambda conn, now: transitions.await_approval(conn, now, inc, step, reason))
            self.effects.approval_requested(inc, step)
        # Polled rather than parked: an approval that lands while this worker holds the claim is never lost.
        return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)

    # --- verifying --------------------------------------------------------------------------------------------

    def _verify(self, inc: Incident, playbook: Playbook) -> datetime | None:
        assert playbook.verify is not None
        verify = playbook.verify
        now = self.deps.clock.now()
        if inc.kind == IncidentKind.JOB:
            waiting, inc = self._job_waiting(inc, verify.timeout)
            if waiting is not None:
                return waiting
        # Only samples after the recovery action (or the job running again) count, whatever the query's window.
        since = now - (inc.verify_from or now)
        context = template_context(inc, self.deps.settings.external_url)
        expr = clamp_ranges(render_promql(verify.promql, context), since)
        try:
            samples = self.deps.clients.prometheus.query(expr)
            error = None
        except (BackendError, ConfigError) as exc:
            samples, error = [], str(exc)
        self._note(
            inc,
            LedgerKind.VERIFY_SAMPLE,
            f"{len(samples)} series" + (f" (error: {error})" if error else ""),
            {"expr": expr, "samples": [_sample(s) for s in samples[:20]], "error": error},
        )
        if samples:
            return self._close(
                inc, IncidentOutcome.RECOVERED, f"verified: {expr} returned {len(samples)} series"
            )
        assert inc.verify_deadline is not None, "a verifying incident has its deadline"
        if now >= inc.verify_deadline:
            return self._attempt_failed(inc, f"verification timed out: {expr} returned nothing")
        return now + verify.interval

    def _job_waiting(self, inc: Incident, timeout: timedelta) -> tuple[datetime | None, Incident]:
        """A requeued job waiting in the queue is not a failed attempt: hold the verification (its deadline and
        its first sample) until the scheduler reports it running. Returns when to look again while it waits, and
        the row as it is now."""
        try:
            status = job_status(self.deps, inc.target)
        except (BackendError, ConfigError) as exc:
            self._note(inc, LedgerKind.JOB_STATUS_ERROR, f"cannot read job {inc.job}'s state: {exc}")
            return None, inc
        if status.phase == JobPhase.WAITING:
            if inc.state != State.WAITING_FOR_RESOURCES:
                message = f"job {inc.job} is {status.state}: waiting for resources; verification starts when it runs"
                self._transition(
                    lambda conn, now: transitions.wait(
                        conn,
                        now,
                        inc,
                        message,
                        state=State.WAITING_FOR_RESOURCES,
                        kind=LedgerKind.WAITING_FOR_RESOURCES,
                    )
                )
            return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds), inc
        if inc.state == State.WAITING_FOR_RESOURCES:
            message = (
                f"job {inc.job} is {status.state} on {', '.join(status.nodes) or '?'}: verifying from now"
            )
            inc = self._transition(
                lambda conn, now: transitions.verify(conn, now, inc, now + timeout, message)
            )
        return None, inc

    def _attempt_failed(self, inc: Incident, reason: str) -> datetime | None:
        # A job's alerts resolving says nothing of it (a dead job's error rate falls within minutes): the policy
        # reads the job instead (running: resolved; dead: the guard chain, as below).
        if inc.alert_resolved and inc.kind != IncidentKind.JOB:
            return self._close(inc, IncidentOutcome.FAILED, reason)
        # The guard chain decides what comes next: backoff, another attempt, or needs_human when the budget is spent.
        self._transition(lambda conn, now: transitions.attempt_failed(conn, now, inc, reason))
        return self.deps.clock.now()

    def _run_on_resolved(self, inc: Incident) -> tuple[datetime | None, Incident]:
        """The undo steps of a closed incident, once automation is not paused: when to look again (None: now
        done), and the row as it is now."""
        playbook = self.deps.playbooks.get(inc.playbook)
        with self.deps.store.read() as conn:
            paused, _ = self.deps.pause_state(conn)
        if paused:
            self._note(inc, LedgerKind.GUARD, "kill_switch: wait: undo steps held while automation is paused")
            return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds), inc
        if playbook is not None:
            for step in self.steps.materialise(
                inc, playbook.on_resolved, attempt=inc.attempt, phase="on_resolved"
            ):
                if step.status == StepStatus.PENDING:
                    self.steps.execute(inc, step)
        return None, self._transition(lambda conn, now: transitions.undo_done(conn, now, inc))

    def _recover_in_flight(self, inc: Incident) -> str | None:
        """Steps left ``running`` by a dead worker: read-only ones run again, the others are ambiguous (one
        transaction). Why the incident goes to a person (None: nothing ambiguous)."""
        with self.deps.store.read() as conn:  # nearly always none: spare the write lock
            if not any(s.status == StepStatus.RUNNING for s in records.get_steps(conn, inc.id)):
                return None
        read_only = [action.name for action in self.deps.registry if action.read_only]
        reason: str | None = self._transition(
            lambda conn, now: transitions.recover_in_flight(conn, now, inc, read_only)
        )
        return reason

    # --- closing and bookkeeping ------------------------------------------------------------------------------

    def _close(self, inc: Incident, outcome: IncidentOutcome, reason: str) -> datetime | None:
        closed = self._transition(lambda conn, now: transitions.close(conn, now, inc, outcome, reason))
        self.deps.metrics.incidents.labels(outcome).inc()
        return self.effects.finalize(closed)

    def _transition(self, change: Any) -> Any:
        """Run ``change(conn, now)`` in one transaction; returns what it returns."""
        with self.deps.store.transaction() as conn:
            return change(conn, self.deps.clock.now())

    def _note(
        self, inc: Incident, kind: LedgerKind, message: str, data: Mapping[str, Any] | None = None
    ) -> None:
        self._transition(lambda conn, now: transitions.note(conn, now, inc.id, kind, message, data))


def _sample(sample: Any) -> dict[str, Any]:
    return {"labels": dict(sample.labels), "value": sample.value}


def _repairable(inc: Incident, excluded: Sequence[str]) -> Sequence[str]:
    """The excluded nodes to hand to repair: all of them when they are the job's culprits; none when the exclusion
    is a leaf's, a rack's or a block's nodes (the domain is at fault, not its nodes: app/engine/fleet_hold.py)."""
    culprits = {c.node for c in inc.culprits}
    return excluded if set(excluded) <= culprits else ()
