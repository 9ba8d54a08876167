"""``nightshift explain``: what would happen to a payload, computed without touching the store or any backend.

The alerts are grouped into the episodes the worker would form (:mod:`app.episodes`): per job, the alerts joined,
the culprits they name, the one job plan, and a node plan per culprit; a node alert on an idle node is a node
episode; anything else is one episode per (playbook, target). Guard verdicts come from the worker's own inputs
(:mod:`app.engine.guard_facts`) with an empty history: those of a first incident on a quiet fleet. Culprits are shown
as the worker would exclude them *if* the scheduler confirms they are in the job's allocation (explain asks no
scheduler), and the live re-check is shown as the query it would run. The one call it makes: on Kubernetes, it
asks the API (read-only) which job each alert's pod belongs to, as ingestion does (:mod:`app.workloads`). Every
alert is reported, an invalid one too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app import episodes, guards
from app.alertmanager import Alert, Notification
from app.engine import guard_facts
from app.engine.deps import EngineDeps, render_target
from app.engine.ingest import prefetch_workloads
from app.engine.lifecycle import template_context
from app.engine.repair import plan_repair
from app.errors import ParamError
from app.planning import INVALID, PlannedStep, plan_steps, when_context
from app.playbooks import Playbook
from app.states import IncidentKind, StepStatus
from app.templates import render_promql


@dataclass
class _Draft:
    """One episode as the alerts of the payload form it."""

    key: str
    kind: IncidentKind
    alerts: list[str] = field(default_factory=list)
    matched: list[tuple[Playbook, Alert, Mapping[str, str]]] = field(default_factory=list)
    culprits: list[dict[str, Any]] = field(default_factory=list)
    repairers: dict[str, str] = field(
        default_factory=dict
    )  # culprit node -> the node-scoped playbook naming it


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
    now = deps.clock.now()
    return {"alerts": alerts, "episodes": [_episode(deps, draft, now) for draft in drafts.values()]}


def _episode(deps: EngineDeps, draft: _Draft, now: datetime) -> dict[str, Any]:
    leading = episodes.leading_playbook(p for p, _, _ in draft.matched)
    assert leading is not None
    _, alert, target = next(m for m in draft.matched if m[0] is leading)
    diagnosis = deps.diagnose(alert.labels, "").as_dict()
    inc = {
        "id": "",
        "kind": draft.kind,
        "playbook": leading.name,
        "labels": alert.labels,
        "annotations": alert.annotations,
        "target": target,
        "diagnosis": diagnosis,
    }
    report: dict[str, Any] = {
        "episode": draft.key,
        "kind": draft.kind,
        "alerts": draft.alerts,
        "playbook": leading.name,
        "source": f"{leading.source}:{leading.line}",
        "target": dict(target),
        "diagnosis": diagnosis,
        "culprits": [c["node"] for c in draft.culprits],
    }
    if draft.kind == IncidentKind.NODE:
        report["job_plan"] = None
    else:
        report["job_plan"] = _job_plan(deps, leading, inc, draft, alert.starts_at, now)
    # Read-only and with an empty history: a culprit its playbook only excludes (a straggler) is on its first
    # exclusion, so it gets no repair (the worker counts the earlier ones: app.episodes.repair_due).
    report["node_plans"] = [
        _node_plan(deps, c["node"], target.get("scheduler", "slurm"), c["playbook"], inc)
        for c in draft.culprits
        if episodes.repair_due(deps.playbooks.get(c["playbook"]) if c["playbook"] else None, 0)
    ]
    return report


def _job_plan(
    deps: EngineDeps,
    playbook: Playbook,
    inc: Mapping[str, Any],
    draft: _Draft,
    starts_at: datetime,
    now: datetime,
) -> dict[str, Any]:
    e = deps.settings.episodes
    # Assumed in the allocation: the worker checks with the scheduler before acting (explain asks nobody).
    assumed = [{**c, "confirmed": True} for c in draft.culprits]
    exclusion = episodes.exclusion(assumed, None, e.max_culprits, e.max_culprit_share)
    context = template_context(inc, deps.settings.external_url, exclusion.nodes)
    planned = plan_steps(
        playbook.steps,
        registry=deps.registry,
        permissions=deps.permissions,
        template_context=context,
        when=when_context(inc["labels"], inc["diagnosis"], 1),
        target=inc["target"],
    )
    job = inc["target"].get("job") if draft.kind == IncidentKind.JOB else None
    facts = guard_facts.build(
        deps.settings,
        playbook,
        job=job,
        node=None if draft.kind == IncidentKind.JOB else inc["target"].get("node"),
        alert_starts_at=starts_at,
        planned=planned,
        history=guard_facts.History(),
        now=now,
    )
    verdicts = guards.evaluate(facts)
    if exclusion.refused:
        outcome = f"needs_human ({exclusion.refused})"
    elif any(p.status == INVALID for p in planned):
        outcome = "needs_human (a step parameter is invalid)"
    elif verdicts[-1].decision == guards.STOP:
        outcome = str(verdicts[-1].outcome)
    elif verdicts[-1].decision == guards.WAIT:
        outcome = "waiting"
    else:
        outcome = "acting"
    if not job:
        correlation = ""
    elif draft.culprits:
        correlation = "a culprit node is named: acts without waiting for the rest of the job's alerts"
    else:
        correlation = f"waits up to {e.correlation_seconds}s for the rest of the job's alerts (or a culprit)"
    return {
        "correlation": correlation,
        "excluded": list(exclusion.nodes),
        "exclusion_note": "culprits are excluded once the scheduler confirms they are in the job's allocation"
        if exclusion.nodes
        else "",
        "guards": [v.as_dict() for v in verdicts],
        "recheck": render_promql(playbook.recheck, context) if playbook.recheck else None,
        "steps": _steps(planned),
        "verify": render_promql(playbook.verify.promql, context) if playbook.verify else None,
        "outcome": outcome,
    }


def _node_plan(
    deps: EngineDeps, node: str, scheduler: str, playbook: str | None, inc: Mapping[str, Any]
) -> dict[str, Any]:
    repair = {
        "id": 0,
        "node": node,
        "scheduler": scheduler,
        "playbook": playbook,
        "incident_id": None,
        "reason": f"culprit named by {playbook or 'the diagnosis'}",
        "repairs": 1,
    }
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
