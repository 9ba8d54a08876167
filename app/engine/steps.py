"""Running an incident's steps: planned, written as step rows, marked ``running`` durably, run, their outcome
written with its ledger row (one transaction each), the worker's claim renewed while a step runs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from app.actions.base import ActionContext
from app.engine import transitions
from app.engine.context import template_context
from app.engine.deps import EngineDeps
from app.errors import ParamError, StoreUnavailable
from app.outcome import Failed, Outcome, tail
from app.planning import PlannedStep, plan_steps, when_context
from app.playbooks import Step
from app.store import records

log = logging.getLogger(__name__)

Incident = dict[str, Any]


class StepRunner:
    def __init__(self, deps: EngineDeps):
        self.deps = deps

    def plan(self, inc: Incident, steps: Sequence[Step], attempt: int) -> list[PlannedStep]:
        """Steps of a phase that needs no exclusion nor job phase (collect, on_resolved)."""
        return plan_steps(
            steps,
            registry=self.deps.registry,
            permissions=self.deps.permissions,
            template_context=template_context(inc, self.deps.settings.external_url),
            when=when_context(inc["labels"], inc["diagnosis"], attempt, ""),
            target=inc["target"],
        )

    def materialise(
        self, inc: Incident, steps: Sequence[Step], attempt: int, phase: str
    ) -> list[dict[str, Any]]:
        """The phase's steps as rows (written once per attempt and phase)."""
        return self.persist(inc, self.plan(inc, steps, attempt), attempt, phase)

    def persist(
        self, inc: Incident, planned: Sequence[PlannedStep], attempt: int, phase: str
    ) -> list[dict[str, Any]]:
        with self.deps.store.transaction() as conn:
            rows = transitions.persist_plan(
                conn, self.deps.clock.now(), inc, planned, attempt=attempt, phase=phase
            )
        self.count_unrun(planned)
        return rows

    def count_unrun(self, planned: Sequence[PlannedStep]) -> None:
        for p in planned:
            if not p.runs:
                self.deps.metrics.steps.labels(p.action.name, p.status).inc()

    def rows(self, inc: Incident, attempt: int, phase: str) -> list[dict[str, Any]]:
        with self.deps.store.read() as conn:
            return records.get_steps(conn, inc["id"], attempt=attempt, phase=phase)

    def execute(self, inc: Incident, step: dict[str, Any]) -> Outcome:
        """Run one step: marked ``running`` durably first, then the action, then its outcome and output."""
        deps = self.deps
        with deps.store.transaction() as conn:
            transitions.start_step(conn, deps.clock.now(), step)
        action = deps.registry.get(step["action"])
        ctx = ActionContext(
            settings=deps.settings,
            clients=deps.clients,
            clock=deps.clock,
            incident_id=inc["id"],
            labels=inc["labels"],
            record=lambda kind, message, data: deps.ledger(inc["id"], kind, message, data),
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
        with deps.store.transaction() as conn:
            transitions.finish_step(
                conn,
                deps.clock.now(),
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
        deps.metrics.steps.labels(step["action"], outcome.status).inc()
        deps.metrics.step_duration.labels(step["action"], outcome.status).observe(duration)
        return outcome

    @contextmanager
    def _lease_kept(self, inc: Incident) -> Iterator[None]:
        """Renew this worker's claim while a step runs, so a long step is never taken for a dead worker's."""
        stop = threading.Event()
        lease = self.deps.settings.worker.lease_seconds

        def beat() -> None:
            while not stop.wait(max(1.0, lease / 3)):
                until: datetime = self.deps.clock.now() + timedelta(seconds=lease)
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
