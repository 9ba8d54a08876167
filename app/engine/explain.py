"""``nightshift explain``: what would happen to a payload, decided by the worker's own policy, read-only.

The alerts are grouped into the episodes the worker would form (:mod:`app.domain.episodes`): per job, the alerts joined,
the culprits they name, the one job plan, and a node plan per culprit; a node alert on an idle node is a node
episode; anything else is one episode per (playbook, target). Each episode is decided by
:func:`app.domain.incident_policy.decide`, as the worker decides it, over facts gathered read-only
(:class:`ExplainSource`): the scheduler's view of the job and the node's partition/pool when a scheduler is configured
(then ``when: job_phase=...`` branches as the worker's do), an empty history (a first incident on a quiet fleet), no log
(the collect steps are listed, not run). Without a scheduler the culprits are shown as the worker would exclude them
*if* the scheduler confirms they are in the job's allocation, and the live re-check is shown as the query it would run
(assumed to hold). On Kubernetes it asks the API (read-only) which job each alert's pod belongs to, as ingestion
does (:mod:`app.workloads`). Nothing is written and no step runs. Every alert is reported, an invalid one too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.domain import episodes, schedulers
from app.domain import incident_policy as policy
from app.domain.alertmanager import Alert, Notification
from app.domain.culprits import Culprit
from app.domain.errors import BackendError, ConfigError, ParamError
from app.domain.planning import PlannedStep
from app.domain.playbooks import Playbook
from app.domain.states import Guard, GuardDecision, IncidentKind, RepairState, State, StepStatus
from app.domain.templates import render_promql
from app.engine import guard_facts
from app.engine.context import template_context
from app.engine.deps import EngineDeps, render_target
from app.engine.facts import decide_with
from app.engine.ingest import prefetch_workloads
from app.engine.repair import plan_repair
from app.engine.scheduler_backends import job_status, pool_facts
from app.engine.steps import StepRunner
from app.store.rows import Incident, Repair


@dataclass
class _Draft:
    """One episode as the alerts of the payload form it."""

    key: str
    kind: IncidentKind
    alerts: list[str] = field(default_factory=list)
    matched: list[tuple[Playbook, Alert, Mapping[str, str]]] = field(default_factory=list)
    culprits: tuple[Culprit, ...] = ()


class ExplainSource:
    """The facts explain gathers: read-only, with an empty history (implements :class:`app.engine.facts.Source`)."""

    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self.collect: list[PlannedStep] = []
        self.job_note = ""

    def diagnosis(self, inc: Incident, playbook: Playbook) -> Incident:
        self.collect = StepRunner(self.deps).plan(inc, playbook.collect, attempt=0)
        return replace(inc, diagnosis=self.deps.diagnose(inc.labels, "").as_dict(), state=State.DIAGNOSING)

    def job_status(self, inc: Incident) -> policy.JobStatus | policy.JobAssumed:
        try:
            status = job_status(self.deps, inc.target)
        except (BackendError, ConfigError) as exc:
            self.job_note = f"the scheduler was not asked ({exc})"
            return policy.JobAssumed(str(exc))
        self.job_note = f"the scheduler says job {inc.job} is {status.state or status.phase}"
        return status

    def history(self, inc: Incident, playbook: Playbook) -> guard_facts.History:
        return guard_facts.History()

    def pool(self, inc: Incident, node: str) -> Mapping[str, Any] | None:
        return pool_facts(self.deps, schedulers.of(inc.target), node)[0]

    def recheck(self, inc: Incident, expr: str) -> policy.Recheck:
        return policy.Recheck(expr, samples=({"assumed": "the condition still holds"},))

    def fleet(self, inc: Incident) -> tuple[policy.FleetHold, Incident]:
        return policy.FleetHold(), inc  # read-only: no fleet incident is opened or joined

    def blame(self, inc: Incident, culprits: Sequence[str]) -> policy.Blame:
        return policy.Blame()

    def progress(self, inc: Incident) -> policy.Progress:
        return policy.Progress(error="explain does not read the job's progress")

    def returned(self, inc: Incident) -> tuple[str, ...]:
        return ()  # a first incident on a quiet fleet: nothing excluded before

    def repair(self, inc: Incident) -> policy.RepairView:
        raise AssertionError("explain decides episodes that have not started")


def explain(deps: EngineDeps, notification: Notification) -> dict[str, Any]:
    """``alerts``: each alert with the episodes it joins (or why none); ``episodes``: the plan of each."""
    drafts: dict[str, _Draft] = {}
    alerts = []
    prefetch_workloads(deps, notification.alerts)
    for alert in notification.alerts:
        entry: dict[str, Any] = {
            "alert": dict(alert.labels),
            "status": alert.status,
            "episodes": [],
            "errors": [],
        }
        alerts.append(entry)
        if alert.status != "firing":
            entry["note"] = "resolved alerts close incidents that have not started acting; nothing to plan"
            continue
        matched = deps.playbooks.match(alert.labels)
        if not matched:
            entry["note"] = "no playbook matches: recorded in the ledger, no incident"
        if excluded := deps.playbooks.excluded_matches(alert.labels):
            entry["not_loaded"] = excluded
        workload = deps.workload_of(alert.labels)
        if workload is not None:
            entry["job_lookup"] = workload.note
        for playbook in matched:
            try:
                target = render_target(playbook, alert.labels, alert.annotations, workload)
            except ParamError as exc:
                entry["errors"].append(f"playbook {playbook.name}: {exc}; no incident")
                continue
            episode = episodes.episode_of(playbook, target.values, target.key)
            draft = drafts.setdefault(episode.open_key, _Draft(episode.open_key, episode.kind))
            name = f"{alert.labels.get('alertname', '')} on {alert.labels.get('Hostname') or '-'}"
            if name not in draft.alerts:
                draft.alerts.append(name)
            draft.matched.append((playbook, alert, target.values))
            if episode.culprit:
                named = episodes.add_culprit(draft.culprits, episode.culprit, name, "", playbook.name)
                if named is not None:
                    draft.culprits = named
            entry["episodes"].append(episode.open_key)
    return {"alerts": alerts, "episodes": [_episode(deps, draft) for draft in drafts.values()]}


def _episode(deps: EngineDeps, draft: _Draft) -> dict[str, Any]:
    leading = episodes.leading_playbook(p for p, _, _ in draft.matched)
    assert leading is not None
    _, alert, target = next(m for m in draft.matched if m[0] is leading)
    job = draft.kind == IncidentKind.JOB
    now = deps.clock.now()
    draft_incident = Incident(
        id=0,  # never stored
        kind=draft.kind,
        state=State.OPEN,
        playbook=leading.name,
        target_key=draft.key,
        labels=alert.labels,
        annotations=alert.annotations,
        target=target,
        job=target.get("job") if job else None,
        node=None if job else target.get("node"),
        culprits=draft.culprits,
        act_after=None,  # the correlation window is reported, not waited out
        alert_starts_at=alert.starts_at,
        opened_at=now,
        updated_at=now,
    )
    source = ExplainSource(deps)
    decision, facts, inc = decide_with(deps, source, draft_incident, leading)
    report: dict[str, Any] = {
        "episode": draft.key,
        "kind": draft.kind,
        "alerts": draft.alerts,
        "playbook": leading.name,
        "source": f"{leading.source}:{leading.line}",
        "target": dict(target),
        "diagnosis": inc.diagnosis,
        "culprits": [c.node for c in draft.culprits],
        "collect": _steps(source.collect),
    }
    plan = _plan(deps, leading, inc, decision, source)
    if draft.kind == IncidentKind.NODE:
        report["job_plan"] = None
        repair = _node_plan(deps, inc.node or "", leading.name, inc)
        # Handed to its repair: the repair's own outcome (repaired, or advisory when its steps are not granted).
        merged = {**plan, **repair} if isinstance(decision, policy.HandToRepair) else {**repair, **plan}
        report["node_plans"] = [merged]
        return report
    steps = _steps(facts.planned or ())
    report["job_plan"] = {"correlation": _correlation(deps, draft, job), **plan, "steps": steps}
    report["node_plans"] = [
        _node_plan(deps, c.node, c.playbook, inc)
        for c in draft.culprits
        # Read-only and with an empty history: a culprit its playbook only excludes (a straggler) is on its first
        # exclusion, so it gets no repair (the worker counts the earlier ones: app.domain.episodes.repair_due).
        if episodes.repair_due(deps.playbooks.get(c.playbook) if c.playbook else None, 0)
    ]
    return report


def _correlation(deps: EngineDeps, draft: _Draft, job: bool) -> str:
    if not job:
        return ""
    if draft.culprits:
        return "a culprit node is named: acts without waiting for the rest of the job's alerts"
    return f"waits up to {deps.settings.episodes.correlation_seconds}s for the rest of the job's alerts (or a culprit)"


def _plan(
    deps: EngineDeps, playbook: Playbook, inc: Incident, decision: policy.Decision, source: ExplainSource
) -> dict[str, Any]:
    """The decision as explain reports it: the exclusion, the guards' verdicts, the queries, the outcome."""
    learned = policy.learned_of(decision)
    exclude = learned.exclude
    context = template_context(inc, deps.settings.external_url, exclude)
    return {
        "excluded": list(exclude),
        "exclusion_note": "culprits are excluded once the scheduler confirms they are in the job's allocation"
        if exclude
        else "",
        "scheduler": source.job_note,
        "guards": [v.as_dict() for v in learned.verdicts if v.guard != Guard.RECHECK],
        "recheck": render_promql(playbook.recheck, context) if playbook.recheck else None,
        "verify": render_promql(playbook.verify.promql, context) if playbook.verify else None,
        "outcome": _outcome(decision),
    }


def _outcome(decision: policy.Decision) -> str:
    learned = policy.learned_of(decision)
    if isinstance(decision, policy.StartAttempt):
        return "acting"
    if isinstance(decision, policy.HandToRepair):
        return "repair: take out, repair, validate, return or hold (the node is handed to its repair)"
    if isinstance(decision, policy.Wait):
        return "waiting"
    if isinstance(decision, policy.Close):
        if learned.invalid:
            return "needs_human (a step parameter is invalid)"
        if learned.verdicts and learned.verdicts[-1].decision == GuardDecision.STOP:
            return str(decision.outcome)
        return f"{decision.outcome} ({decision.reason})"
    return str(decision)


def _node_plan(deps: EngineDeps, node: str, playbook: str | None, inc: Incident) -> dict[str, Any]:
    repair = Repair(
        id=0,
        node=node,
        scheduler=schedulers.of_incident(inc.target).name,
        state=RepairState.REQUESTED,
        playbook=playbook,
        reason=f"culprit named by {playbook or 'the diagnosis'}",
    )
    planned = plan_repair(deps, repair, inc)
    granted = all(p.runs or p.status == StepStatus.SKIPPED for p in planned.values())
    return {
        "node": node,
        "playbook": playbook,
        "steps": _steps(list(planned.values())),
        "outcome": "repair: take out, repair, validate, return or hold"
        if granted
        else "advisory (not every repair step is whitelisted: the plan is recorded, the node is left alone)",
    }


def _steps(planned: Sequence[PlannedStep]) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "action": p.action.name,
            "status": p.status,
            "summary": p.summary,
            "command": p.command,
            "reason": p.reason,
        }
        for p in planned
    ]
