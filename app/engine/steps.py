"""Running steps: an incident's planned, written as step rows, marked ``running`` durably, run, their outcome written
with its ledger row (one transaction each); and the one runner of an action that both lifecycles use
(:func:`run_action`: the worker's claim renewed while it runs, every exception a failed outcome)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from app.actions.base import Action, ActionContext
from app.domain import schedulers
from app.domain.errors import ParamError
from app.domain.outcome import Failed, Ok, Outcome, tail
from app.domain.planning import PlannedStep, plan_steps, when_context
from app.domain.playbooks import Step
from app.domain.states import LedgerKind
from app.engine import transitions
from app.engine.claims import Claim, kept
from app.engine.context import template_context
from app.engine.deps import EngineDeps
from app.store import records
from app.store.claims import INCIDENTS
from app.store.rows import Incident, StepRow

log = logging.getLogger(__name__)


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
            when=when_context(inc.labels, inc.diagnosis, attempt, ""),
            target=inc.target,
        )

    def materialise(self, inc: Incident, steps: Sequence[Step], attempt: int, phase: str) -> list[StepRow]:
        """The phase's steps as rows (written once per attempt and phase)."""
        return self.persist(inc, self.plan(inc, steps, attempt), attempt, phase)

    def persist(
        self, inc: Incident, planned: Sequence[PlannedStep], attempt: int, phase: str
    ) -> list[StepRow]:
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

    def rows(self, inc: Incident, attempt: int, phase: str) -> list[StepRow]:
        with self.deps.store.read() as conn:
            return records.get_steps(conn, inc.id, attempt=attempt, phase=phase)

    def execute(self, inc: Incident, step: StepRow) -> Outcome:
        """Run one step: marked ``running`` durably first, then the action, then its outcome and output."""
        deps = self.deps
        with deps.store.transaction() as conn:
            transitions.start_step(conn, deps.clock.now(), step)
        outcome, duration = run_action(
            deps,
            deps.registry.get(step.action),
            step.params,
            action_context(deps, inc.id, labels=inc.labels),
            Claim(INCIDENTS, inc.id, inc.claimed_by or ""),  # claimed: the worker's name
        )
        with deps.store.transaction() as conn:
            transitions.finish_step(
                conn,
                deps.clock.now(),
                inc,
                step,
                status=outcome.status,
                command=outcome.command or step.command,
                exit_code=outcome.exit_code,
                output=tail(outcome.output),
                ledger_output=tail(outcome.output, 2000),
                reason=getattr(outcome, "reason", ""),
                duration=duration,
            )
            job = schedulers.job_identity(inc.target)
            changed = outcome.data if isinstance(outcome, Ok) else {}
            if job is not None and ("added" in changed or "dropped" in changed):
                # What the recovery added to the job's exclusion list (ours from now on) or dropped of ours.
                transitions.exclusions_changed(
                    conn, deps.clock.now(), inc, job, changed.get("added") or (), changed.get("dropped") or ()
                )
        return outcome


def action_context(
    deps: EngineDeps,
    incident_id: int | None,
    *,
    labels: Mapping[str, str] | None = None,
    about: Mapping[str, Any] | None = None,
) -> ActionContext:
    """What an action of an incident's step or of a node repair runs with: what it reports along the way is a
    ledger row of ``incident_id`` carrying ``about`` (a repair's node and id)."""

    def report(kind: LedgerKind, message: str, data: Mapping[str, Any]) -> None:
        with deps.store.transaction() as conn:
            transitions.note(conn, deps.clock.now(), incident_id, kind, message, {**(about or {}), **data})

    return ActionContext(
        settings=deps.settings,
        clients=deps.clients,
        clock=deps.clock,
        incident_id=incident_id,
        labels=labels or {},
        record=report,
    )


def run_action(
    deps: EngineDeps, action: Action, params: Mapping[str, Any], ctx: ActionContext, claim: Claim
) -> tuple[Outcome, float]:
    """The one step runner of both lifecycles: the action run on its validated parameters while the worker's
    claim is kept (:func:`app.engine.claims.kept`), every exception a failed outcome (an action bug never kills
    the worker), counted in the metrics. Returns the outcome and how long it took (seconds)."""
    t0 = time.monotonic()
    try:
        with kept(deps, claim):
            outcome = action.run(action.validate(params), ctx)
    except ParamError as exc:
        outcome = Failed(reason=str(exc))
    except Exception as exc:
        log.exception("action %s raised", action.name)
        outcome = Failed(reason=f"internal error in {action.name}: {exc!r}")
    duration = round(time.monotonic() - t0, 3)
    deps.metrics.steps.labels(action.name, outcome.status).inc()
    deps.metrics.step_duration.labels(action.name, outcome.status).observe(duration)
    return outcome, duration
