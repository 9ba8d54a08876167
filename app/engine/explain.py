"""``nightshift explain``: what would happen to a payload, computed without touching the store or any backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app import guards
from app.alertmanager import Notification
from app.engine.deps import EngineDeps, render_target
from app.engine.lifecycle import template_context
from app.planning import INVALID, plan_steps, when_context
from app.templates import render_promql


def explain(deps: EngineDeps, notification: Notification) -> list[dict[str, Any]]:
    """For each firing alert and each matching playbook: target, diagnosis from labels, plan, guard verdicts.

    History is taken as empty (no attempts, no recoveries, no other open incidents): the verdicts are those of a
    first incident on a quiet fleet. The live re-check is shown as the query it would run, not run.
    """
    now = deps.clock.now()
    report: list[dict[str, Any]] = []
    for alert in notification.alerts:
        entry: dict[str, Any] = {
            "alert": dict(alert.labels),
            "status": alert.status,
            "fingerprint": alert.fingerprint,
        }
        report.append(entry)
        if alert.status != "firing":
            entry["note"] = "resolved alerts close incidents that have not started acting; nothing to plan"
            continue
        matched = deps.playbooks.match(alert.labels)
        entry["playbooks"] = [
            _explain_playbook(deps, pb, alert.labels, alert.annotations, alert.starts_at, now)
            for pb in matched
        ]
        if not matched:
            entry["note"] = "no playbook matches: recorded in the ledger, no incident"
    return report


def _explain_playbook(
    deps: EngineDeps, playbook, labels: Mapping[str, str], annotations: Mapping[str, str], starts_at, now
) -> dict[str, Any]:
    target = render_target(playbook, labels, annotations)
    diagnosis = deps.diagnose(labels, "").as_dict()
    inc = {
        "id": "",
        "playbook": playbook.name,
        "labels": labels,
        "annotations": annotations,
        "target": target.values,
        "diagnosis": diagnosis,
    }
    context = template_context(inc, deps.settings.external_url)
    planned = plan_steps(
        playbook.steps,
        registry=deps.registry,
        permissions=deps.permissions,
        template_context=context,
        when=when_context(labels, diagnosis, 1),
        target=target.values,
    )
    g = deps.settings.guards
    runs = [p for p in planned if p.runs]
    facts = guards.GuardFacts(
        now=now,
        playbook=playbook.name,
        node=target.node,
        alert_starts_at=starts_at,
        paused=g.kill_switch,
        pause_reason="kill_switch set in settings" if g.kill_switch else "",
        granted_mutating=sum(1 for p in runs if p.mutating),
        would_run=sum(1 for p in planned if p.status == "would_run"),
        destructive=any(p.destructive for p in runs),
        budget_attempts=playbook.budget.attempts,
        budget_window=playbook.budget.window,
        backoff=playbook.budget.backoff,
        cooldown=playbook.cooldown,
        blast_max_nodes=g.blast_radius_max_nodes,
    )
    verdicts = guards.evaluate(facts)
    if any(p.status == INVALID for p in planned):
        outcome = "needs_human (a step parameter is invalid)"
    elif verdicts[-1].decision == guards.STOP:
        outcome = verdicts[-1].outcome
    elif verdicts[-1].decision == guards.WAIT:
        outcome = "waiting"
    else:
        outcome = "acting"
    return {
        "playbook": playbook.name,
        "source": f"{playbook.source}:{playbook.line}",
        "target": dict(target.values),
        "diagnosis": diagnosis,
        "guards": [v.as_dict() for v in verdicts],
        "recheck": render_promql(playbook.recheck, context) if playbook.recheck else None,
        "steps": [
            {
                "name": p.name,
                "action": p.action.name,
                "status": p.status,
                "summary": p.summary,
                "command": p.command,
                "reason": p.reason,
            }
            for p in planned
        ],
        "verify": render_promql(playbook.verify.promql, context) if playbook.verify else None,
        "outcome": outcome,
    }
