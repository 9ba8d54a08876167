"""Advancing one claimed incident by one tick: diagnose → guards → act → verify → close.

Each tick is short; waits (guards, retries, verification polls) release the incident with a ``next_run_at`` so one
worker thread serves many incidents and a crash loses nothing: state lives in the store, a step is marked
``running`` before it starts, and a step found ``running`` by a later claimer is ``ambiguous`` and never re-run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from app import guards
from app.actions.base import ActionContext
from app.engine.deps import EngineDeps
from app.engine.effects import Effects
from app.errors import BackendError, ConfigError, ParamError, StoreUnavailable
from app.outcome import Ambiguous, CredentialError, Failed, Ok, Outcome, Retry, tail
from app.planning import INVALID, RUN, PlannedStep, plan_steps, when_context
from app.playbooks import Playbook, Step
from app.store import records
from app.templates import render_promql

log = logging.getLogger(__name__)

Incident = dict[str, Any]
DONE_STEP_STATUSES = ("ok", "would_run", "skipped")


class Lifecycle:
    """The incident state machine. The only place that sequences actions, guards and store writes."""

    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self.effects = Effects(deps)

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
            next_run = deps.clock.now() + timedelta(seconds=deps.settings.guards.defer_seconds)
            self._ledger(incident, "engine_error", f"tick failed, will retry: {exc!r}")
        with deps.store.transaction() as conn:
            records.release_claim(conn, incident["id"], worker, next_run)
        return incident["id"]

    def _advance(self, inc: Incident) -> datetime | None:
        if inc["open_key"] is None:
            return self._closed_tick(inc)
        playbook = self.deps.playbooks.get(inc["playbook"])
        if playbook is None:
            return self._close(inc, "needs_human", f"playbook {inc['playbook']!r} is no longer loaded")
        if self._recover_in_flight(inc):
            return self._close(inc, "needs_human", inc["reason"])
        self.effects.open_annotation(inc)
        state = inc["state"]
        if state in ("open", "diagnosing"):
            self._diagnose(inc, playbook)
            return self._decide(inc, playbook)
        if state == "waiting":
            return self._decide(inc, playbook)
        if state == "acting":
            return self._act(inc, playbook)
        if state == "verifying":
            return self._verify(inc, playbook)
        return self._close(inc, "needs_human", f"unexpected state {state!r}")

    def _closed_tick(self, inc: Incident) -> datetime | None:
        if inc["on_resolved_state"] == "pending":
            wait = self._run_on_resolved(inc)
            if wait is not None:
                return wait
        if inc["finalize_pending"]:
            return self.effects.finalize(inc)
        return None

    # --- diagnosis ------------------------------------------------------------------------------------------

    def _diagnose(self, inc: Incident, playbook: Playbook) -> None:
        self._update(inc, state="diagnosing")
        logs = []
        for step in self._materialise(inc, playbook.collect, attempt=0, phase="collect"):
            if step["status"] == "pending":
                outcome = self._execute(inc, step)
                if isinstance(outcome, Ok) and outcome.data.get("log"):
                    logs.append(str(outcome.data["log"]))
        diagnosis = self.deps.diagnose(inc["labels"], "\n".join(logs)).as_dict()
        self._update(
            inc,
            diagnosis=diagnosis,
            ledger=(
                "diagnosis",
                f"{diagnosis['category']} ({diagnosis['confidence']:.2f}): {diagnosis['summary']}",
                diagnosis,
            ),
        )

    # --- deciding ---------------------------------------------------------------------------------------------

    def _decide(self, inc: Incident, playbook: Playbook) -> datetime | None:
        deps = self.deps
        now = deps.clock.now()
        planned = self._plan(inc, playbook.steps, attempt=inc["attempt"] + 1)
        invalid = [p for p in planned if p.status == INVALID]
        if invalid:
            for p in invalid:
                self._ledger(inc, "step_invalid", f"{p.name}: {p.reason}", {"action": p.action.name})
            return self._close(inc, "needs_human", f"step {invalid[0].name}: {invalid[0].reason}")
        facts = self._guard_facts(inc, playbook, planned, now)
        verdicts = guards.evaluate(facts)
        self._record_verdicts(inc, verdicts)
        last = verdicts[-1]
        if last.decision == guards.PASS and playbook.recheck:
            last = self._recheck(inc, playbook, now)
            self._record_verdicts(inc, [last])
        if last.decision == guards.WAIT:
            self._update(inc, state="waiting", held_by_guard=True, reason=last.reason)
            if last.guard == "blast_radius":
                self.effects.storm(inc, last.reason)
            return last.until
        if last.decision == guards.STOP:
            if last.outcome == "advisory":
                self._run_advisory(inc, planned)
            return self._close(inc, last.outcome or "needs_human", last.reason)
        return self._start_attempt(inc, playbook, planned)

    def _guard_facts(
        self, inc: Incident, playbook: Playbook, planned: Sequence[PlannedStep], now: datetime
    ) -> guards.GuardFacts:
        deps = self.deps
        g = deps.settings.guards
        blast_window = timedelta(seconds=g.blast_radius_window_seconds)
        with deps.store.read() as conn:
            history = records.attempts_for_target(
                conn, playbook.name, inc["target_key"], now - playbook.budget.window
            )
            recovery = records.last_recovery(conn, playbook.name, inc["target_key"])
            disrupted = records.nodes_disrupted_since(conn, now - blast_window)
            ahead = (
                records.earlier_open_on(conn, inc["serialize_key"], inc["id"])
                if inc["serialize_key"]
                else None
            )
            paused, pause_reason = self.deps.pause_state(conn)
        runs = [p for p in planned if p.runs]
        return guards.GuardFacts(
            now=now,
            playbook=playbook.name,
            node=inc["node"],
            alert_starts_at=inc["alert_starts_at"],
            paused=paused,
            pause_reason=pause_reason,
            granted_mutating=sum(1 for p in runs if p.mutating),
            would_run=sum(1 for p in planned if p.status == "would_run"),
            destructive=any(p.destructive for p in runs),
            ahead=f"incident #{ahead['id']} ({ahead['playbook']}, {ahead['state']})" if ahead else None,
            attempts=tuple(_past(a) for a in history),
            budget_attempts=playbook.budget.attempts,
            budget_window=playbook.budget.window,
            backoff=playbook.budget.backoff,
            cooldown=playbook.cooldown,
            last_recovery=_past(recovery) if recovery else None,
            disrupted_nodes=frozenset(disrupted),
            blast_max_nodes=g.blast_radius_max_nodes,
            blast_window=blast_window,
            defer=timedelta(seconds=g.defer_seconds),
        )

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
        for step in self._persist_plan(inc, planned, attempt=0, phase="steps"):
            if step["status"] == "pending":
                self._execute(inc, step)

    def _start_attempt(
        self, inc: Incident, playbook: Playbook, planned: Sequence[PlannedStep]
    ) -> datetime | None:
        now = self.deps.clock.now()
        number = inc["attempt"] + 1
        with self.deps.store.transaction() as conn:
            records.insert_attempt(
                conn,
                {
                    "incident_id": inc["id"],
                    "number": number,
                    "playbook": playbook.name,
                    "target_key": inc["target_key"],
                    "node": inc["node"],
                    "destructive": any(p.runs and p.destructive for p in planned),
                    "started_at": now,
                },
            )
        self._update(inc, attempt=number, state="acting", acted=True, held_by_guard=False, reason="")
        self._ledger(inc, "attempt_started", f"attempt {number}", {"attempt": number})
        self._persist_plan(inc, planned, attempt=number, phase="steps")
        return self._act(inc, playbook)

    def _act(self, inc: Incident, playbook: Playbook) -> datetime | None:
        deps = self.deps
        for step in self._steps(inc, attempt=inc["attempt"], phase="steps"):
            if step["status"] in DONE_STEP_STATUSES:
                continue
            if step["status"] not in ("pending", "retry", "awaiting_approval"):
                return self._close(inc, "needs_human", f"step {step['name']} is {step['status']}")
            if step["approval"] and not step["approved_by"]:
                return self._await_approval(inc, step)
            outcome = self._execute(inc, step)
            if isinstance(outcome, Ok):
                continue
            if isinstance(outcome, Retry) and step["retries"] < deps.settings.worker.step_retry_limit:
                with deps.store.transaction() as conn:
                    records.update_step(conn, step["id"], status="retry", retries=step["retries"] + 1)
                return deps.clock.now() + timedelta(seconds=outcome.after)
            if isinstance(outcome, Ambiguous):
                return self._close(
                    inc, "needs_human", f"step {step['name']}: outcome unknown: {outcome.reason}"
                )
            if isinstance(outcome, CredentialError):
                self.effects.credential_error(step["action"], outcome.reason)
                return self._close(inc, "credential_error", f"step {step['name']}: {outcome.reason}")
            return self._attempt_failed(inc, f"step {step['name']} failed: {getattr(outcome, 'reason', '')}")
        if playbook.verify is None:
            self._finish_attempt(inc, "unverified")
            return self._close(inc, "unverified", "steps done; the playbook has no verification")
        now = deps.clock.now()
        self._update(inc, state="verifying", verify_deadline=now + playbook.verify.timeout)
        self._ledger(
            inc, "verifying", f"polling {playbook.verify.promql} for up to {playbook.verify.timeout}"
        )
        return now + playbook.verify.interval

    def _await_approval(self, inc: Incident, step: dict[str, Any]) -> datetime:
        """Hold the attempt before a step marked ``approval: required`` until an operator approves it."""
        if step["status"] != "awaiting_approval":
            with self.deps.store.transaction() as conn:
                records.update_step(conn, step["id"], status="awaiting_approval")
            reason = f"step {step['name']} awaits operator approval"
            self._update(inc, reason=reason)
            self._ledger(inc, "approval_requested", f"{reason}: {step['command']}", {"step_id": step["id"]})
            self.effects.approval_requested(inc, step)
        # Polled rather than parked: an approval that lands while this worker holds the claim is never lost.
        return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)

    def _verify(self, inc: Incident, playbook: Playbook) -> datetime | None:
        assert playbook.verify is not None
        expr = render_promql(playbook.verify.promql, self._template_context(inc))
        now = self.deps.clock.now()
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
            self._finish_attempt(inc, "recovered")
            return self._close(inc, "recovered", f"verified: {expr} returned {len(samples)} series")
        if now >= inc["verify_deadline"]:
            return self._attempt_failed(inc, f"verification timed out: {expr} returned nothing")
        return now + playbook.verify.interval

    def _attempt_failed(self, inc: Incident, reason: str) -> datetime | None:
        self._finish_attempt(inc, "failed")
        self._ledger(inc, "attempt_failed", reason, {"attempt": inc["attempt"]})
        if inc["alert_resolved"]:
            return self._close(inc, "failed", reason)
        # The guard chain decides what comes next: backoff, another attempt, or needs_human when the budget is spent.
        self._update(inc, state="waiting", reason=reason)
        return self.deps.clock.now()

    def _run_on_resolved(self, inc: Incident) -> datetime | None:
        playbook = self.deps.playbooks.get(inc["playbook"])
        with self.deps.store.read() as conn:
            paused, _ = self.deps.pause_state(conn)
        if paused:
            self._ledger(inc, "guard", "kill_switch: wait: undo steps held while automation is paused")
            return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)
        if playbook is not None:
            planned = self._plan(inc, playbook.on_resolved, attempt=inc["attempt"])
            for step in self._persist_plan(inc, planned, attempt=inc["attempt"], phase="on_resolved"):
                if step["status"] == "pending":
                    self._execute(inc, step)
        self._update(inc, on_resolved_state="done")
        return None

    # --- steps ------------------------------------------------------------------------------------------------

    def _plan(self, inc: Incident, steps: Sequence[Step], attempt: int) -> list[PlannedStep]:
        return plan_steps(
            steps,
            registry=self.deps.registry,
            permissions=self.deps.permissions,
            template_context=self._template_context(inc),
            when=when_context(inc["labels"], inc["diagnosis"], attempt),
            target=inc["target"],
        )

    def _materialise(
        self, inc: Incident, steps: Sequence[Step], attempt: int, phase: str
    ) -> list[dict[str, Any]]:
        return self._persist_plan(inc, self._plan(inc, steps, attempt), attempt=attempt, phase=phase)

    def _persist_plan(
        self, inc: Incident, planned: Sequence[PlannedStep], attempt: int, phase: str
    ) -> list[dict[str, Any]]:
        """Write the plan as step rows (idempotent per attempt and phase) and return the rows."""
        with self.deps.store.transaction() as conn:
            for p in planned:
                records.insert_step(
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
            for p in planned:
                if p.status != RUN:
                    self.deps.metrics.steps.labels(p.action.name, p.status).inc()
                    records.record(
                        conn,
                        self.deps.clock.now(),
                        "step_" + p.status,
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

    def _steps(self, inc: Incident, attempt: int, phase: str) -> list[dict[str, Any]]:
        with self.deps.store.read() as conn:
            return records.get_steps(conn, inc["id"], attempt=attempt, phase=phase)

    def _execute(self, inc: Incident, step: dict[str, Any]) -> Outcome:
        """Run one step: marked ``running`` durably first, then the action, then its outcome and output."""
        deps = self.deps
        started = deps.clock.now()
        with deps.store.transaction() as conn:
            records.update_step(conn, step["id"], status="running", started_at=started)
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
        duration = time.monotonic() - t0
        reason = getattr(outcome, "reason", "")
        with deps.store.transaction() as conn:
            records.update_step(
                conn,
                step["id"],
                status=outcome.status,
                command=outcome.command or step["command"],
                exit_code=outcome.exit_code,
                output=tail(outcome.output),
                reason=reason,
                finished_at=deps.clock.now(),
                duration=round(duration, 3),
            )
            records.record(
                conn,
                deps.clock.now(),
                "step",
                f"{step['name']}: {outcome.status}" + (f": {reason}" if reason else ""),
                incident_id=inc["id"],
                data={
                    "action": step["action"],
                    "params": step["params"],
                    "phase": step["phase"],
                    "attempt": step["attempt"],
                    "status": outcome.status,
                    "command": outcome.command or step["command"],
                    "exit_code": outcome.exit_code,
                    "output": tail(outcome.output, 2000),
                    "reason": reason,
                    "duration": round(duration, 3),
                },
            )
        deps.metrics.steps.labels(step["action"], outcome.status).inc()
        deps.metrics.step_duration.labels(step["action"], outcome.status).observe(duration)
        return outcome

    def _recover_in_flight(self, inc: Incident) -> bool:
        """Steps left ``running`` by a dead worker: re-run read-only ones, mark the others ambiguous."""
        with self.deps.store.read() as conn:  # nearly always none: spare the write lock
            if not any(s["status"] == "running" for s in records.get_steps(conn, inc["id"])):
                return False
        with self.deps.store.transaction() as conn:
            running = [s for s in records.get_steps(conn, inc["id"]) if s["status"] == "running"]
            ambiguous = []
            for step in running:
                if step["action"] in self.deps.registry and self.deps.registry.get(step["action"]).read_only:
                    records.update_step(conn, step["id"], status="pending")
                    continue
                records.update_step(
                    conn,
                    step["id"],
                    status="ambiguous",
                    reason="in flight when its worker stopped; outcome unknown, not re-run",
                )
                ambiguous.append(step["name"])
        if not ambiguous:
            return False
        reason = f"step {ambiguous[0]} was in flight when its worker stopped: outcome unknown, not re-run"
        self._ledger(inc, "step_ambiguous", reason, {"steps": ambiguous})
        inc["reason"] = reason
        return True

    # --- closing and bookkeeping ------------------------------------------------------------------------------

    def _finish_attempt(self, inc: Incident, outcome: str) -> None:
        with self.deps.store.transaction() as conn:
            records.finish_attempt(conn, inc["id"], inc["attempt"], outcome, self.deps.clock.now())

    def _close(self, inc: Incident, outcome: str, reason: str) -> datetime | None:
        now = self.deps.clock.now()
        if inc["attempt"]:
            self._finish_attempt(inc, outcome)
        self._update(
            inc,
            state=outcome,
            outcome=outcome,
            reason=reason,
            open_key=None,
            closed_at=now,
            finalize_pending=True,
            verify_deadline=None,
            ledger=("incident_closed", f"{outcome}: {reason}", {"outcome": outcome}),
        )
        self.deps.metrics.incidents.labels(outcome).inc()
        return self.effects.finalize(inc)

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

    def _update(
        self, inc: Incident, ledger: tuple[str, str, Mapping[str, Any]] | None = None, **values: Any
    ) -> None:
        """Update the incident's columns, and add ``ledger`` (kind, message, data) in the same transaction."""
        now = self.deps.clock.now()
        values["updated_at"] = now
        with self.deps.store.transaction() as conn:
            records.update_incident(conn, inc["id"], **values)
            if ledger is not None:
                kind, message, data = ledger
                records.record(conn, now, kind, message, incident_id=inc["id"], data=data)
        inc.update(values)

    def _ledger(self, inc: Incident, kind: str, message: str, data: Mapping[str, Any] | None = None) -> None:
        self.deps.ledger(inc["id"], kind, message, data)

    def _template_context(self, inc: Incident) -> dict[str, Mapping[str, Any]]:
        return template_context(inc, self.deps.settings.external_url)


def template_context(inc: Incident, external_url: str) -> dict[str, Mapping[str, Any]]:
    """What templates may reference: labels, annotations, target, diagnosis, incident."""
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
        },
    }


def _past(row: Mapping[str, Any]) -> guards.PastAttempt:
    return guards.PastAttempt(
        started_at=row["started_at"], finished_at=row["finished_at"], outcome=row["outcome"]
    )


def _sample(sample: Any) -> dict[str, Any]:
    return {"labels": dict(sample.labels), "value": sample.value}
