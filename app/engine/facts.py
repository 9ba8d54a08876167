"""Gathering the facts :func:`app.domain.incident_policy.decide` asks for, and the loop that asks.

:func:`decide_with` calls the policy, gathers what it asks for from a :class:`Source`, and calls it again until it
decides. The worker's source (:class:`app.engine.lifecycle.WorkerSource`) reads the store and the backends and runs
the collect steps; ``nightshift explain``'s (:class:`app.engine.explain.ExplainSource`) reads the scheduler when one
is configured, assumes an empty history and runs nothing. The planning and the guard inputs are built here, the one
way both use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

from app.domain import guards, schedulers
from app.domain import incident_policy as policy
from app.domain.planning import PlannedStep, nodes_taken_out, plan_steps, when_context
from app.domain.playbooks import Playbook
from app.domain.states import IncidentKind, RepairState
from app.domain.templates import render_promql
from app.engine import guard_facts
from app.engine.context import template_context
from app.engine.deps import EngineDeps
from app.engine.repair import plan_repair
from app.store.rows import Incident, Repair

MAX_GATHERS = 8  # one of each fact at most: a policy that asks for more is a bug, never a loop


class Source(Protocol):
    """Where facts come from (the worker's store and backends, or explain's read-only view)."""

    def diagnosis(self, inc: Incident, playbook: Playbook) -> Incident:
        """Run the collect steps and the diagnosis; the incident row with the result."""

    def job_status(self, inc: Incident) -> policy.JobStatus | policy.JobUnread | policy.JobAssumed:
        """The scheduler's view of the incident's job."""

    def history(self, inc: Incident, playbook: Playbook) -> guard_facts.History:
        """What the store says of the target: attempts, recoveries, nodes out, the pause."""

    def pool(self, inc: Incident, node: str) -> Mapping[str, Any] | None:
        """The partition/pool facts of a node the plan takes out (None: unknown)."""

    def recheck(self, inc: Incident, expr: str) -> policy.Recheck:
        """The live re-check, run (or, read-only, shown)."""

    def repair(self, inc: Incident) -> policy.RepairView:
        """The repair a node incident waits on."""

    def fleet(self, inc: Incident) -> tuple[policy.FleetHold, Incident]:
        """Whether a shared cause holds the job's recovery, and the row as it is now (a probe of the shared cause
        back from a restart that did not recover it is held again)."""

    def blame(self, inc: Incident, culprits: Sequence[str]) -> policy.Blame:
        """Whether the culprits' leaf/rack/block is to blame instead of them."""

    def progress(self, inc: Incident) -> policy.Progress:
        """The job's step counter now and :data:`app.domain.incident_policy.PROGRESS_WINDOW` ago."""

    def returned(self, inc: Incident) -> tuple[str, ...]:
        """The nodes Nightshift excluded from the job that are back in service (the plan lets the job back)."""


def limits(deps: EngineDeps) -> policy.Limits:
    e = deps.settings.episodes
    return policy.Limits(
        max_culprits=e.max_culprits,
        max_culprit_share=e.max_culprit_share,
        defer=timedelta(seconds=deps.settings.guards.defer_seconds),
    )


def decide_with(
    deps: EngineDeps, source: Source, inc: Incident, playbook: Playbook, *, diagnosed: bool = False
) -> tuple[policy.Decision, policy.Facts, Incident]:
    """Decide the incident's next move, gathering every fact the policy asks for. Returns the decision, the
    facts it was made on, and the incident's row as gathering left it (diagnosed, held)."""
    facts = policy.Facts(now=deps.clock.now(), limits=limits(deps), diagnosed=diagnosed)
    for _ in range(MAX_GATHERS):
        # A job whose alerts resolved (while its restart waited, or after an attempt that did not bring it back): the
        # re-check of them would say nothing; the policy reads the job itself.
        recheck = bool(playbook.recheck) and not (inc.alert_resolved and inc.kind == IncidentKind.JOB)
        decision = policy.decide(policy.Subject.of(inc, recheck, playbook.self_recovery), facts)
        if not isinstance(decision, policy.Gather):
            return decision, facts, inc
        facts, inc = gather(deps, source, inc, playbook, decision, facts)
    raise RuntimeError(f"incident {inc.id}: the policy asked for more than {MAX_GATHERS} facts")


def gather(
    deps: EngineDeps,
    source: Source,
    inc: Incident,
    playbook: Playbook,
    ask: policy.Gather,
    facts: policy.Facts,
) -> tuple[policy.Facts, Incident]:
    """The fact the policy asked for, and the incident's row as gathering it left it (diagnosed, held)."""
    need = ask.need
    if need == policy.Need.DIAGNOSIS:
        return replace(facts, diagnosed=True), source.diagnosis(inc, playbook)
    if need == policy.Need.FLEET:
        hold, inc = source.fleet(inc)
        return replace(facts, fleet=hold), inc
    if need == policy.Need.JOB_STATUS:
        return replace(facts, job=source.job_status(inc)), inc
    if need == policy.Need.PLAN:
        planned = plan(deps, inc, playbook, ask.exclude, ask.job_phase, source.returned(inc))
        return replace(facts, planned=tuple(planned)), inc
    if need == policy.Need.GUARDS:
        assert facts.planned is not None
        return replace(facts, guards=guard_inputs(deps, source, inc, playbook, facts.planned)), inc
    if need == policy.Need.RECHECK:
        expr = render_promql(playbook.recheck or "", template_context(inc, deps.settings.external_url))
        return replace(facts, recheck=source.recheck(inc, expr)), inc
    if need == policy.Need.BLAME:
        return replace(facts, blame=source.blame(inc, ask.exclude)), inc
    if need == policy.Need.PROGRESS:
        return replace(facts, progress=source.progress(inc)), inc
    return replace(facts, repair=source.repair(inc)), inc


def plan(
    deps: EngineDeps,
    inc: Incident,
    playbook: Playbook,
    exclude: Sequence[str],
    job_phase: str,
    returned: Sequence[str] = (),
) -> list[PlannedStep]:
    """What the incident would do next: a job or target incident its playbook's steps (attempt N+1, excluding
    ``exclude``, letting the job back on ``returned``); a node incident its node's repair, take-out to return."""
    if inc.kind == IncidentKind.NODE:
        assert inc.node is not None, "a node incident names its node"
        draft = Repair(
            id=0,
            node=inc.node,
            scheduler=schedulers.of_incident(inc.target).name,
            state=RepairState.REQUESTED,
            playbook=playbook.name,
            incident_id=inc.id or None,
            reason=policy.repair_reason(policy.Subject.of(inc, False)),
        )
        return list(plan_repair(deps, draft, inc).values())
    return plan_steps(
        playbook.steps,
        registry=deps.registry,
        permissions=deps.permissions,
        template_context=template_context(inc, deps.settings.external_url, exclude, returned),
        when=when_context(inc.labels, inc.diagnosis, inc.attempt + 1, job_phase),
        target=inc.target,
    )


def guard_inputs(
    deps: EngineDeps, source: Source, inc: Incident, playbook: Playbook, planned: Sequence[PlannedStep]
) -> guards.GuardFacts:
    """The guard chain's inputs over ``planned``. A node incident's take-out is counted by its repair's own
    blast-radius guard (against its partition too), so it is not counted here twice."""
    node_incident = inc.kind == IncidentKind.NODE
    taking_out = sorted(nodes_taken_out(planned))
    pool = source.pool(inc, taking_out[0]) if taking_out and not node_incident else None
    return guard_facts.build(
        deps.settings,
        playbook,
        pool=pool,
        job=inc.job if inc.kind == IncidentKind.JOB else None,
        node=inc.node,
        alert_starts_at=inc.alert_starts_at,
        planned=planned,
        history=source.history(inc, playbook),
        now=deps.clock.now(),
        repair_takes_out=node_incident,
    )
