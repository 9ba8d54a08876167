"""The guard chain's inputs, built one way for the worker and for ``nightshift explain``.

:func:`read_history` reads what the store knows (attempts on the target, the last recovery, nodes taken out,
an incident ahead on the same node or job, the pause); :func:`build` turns it, the settings, the playbook and the
plan into :class:`app.domain.guards.GuardFacts`. ``explain`` passes an empty :class:`History` where it has no store, so
the two can only differ in history, never in how settings and plans are read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from app.actions.registry import ActionRegistry
from app.config import Settings
from app.domain import guards
from app.domain.planning import PlannedStep, nodes_taken_out
from app.domain.playbooks import Playbook
from app.domain.states import IncidentKind, RepairState, StepStatus
from app.store import records, repairs
from app.store.rows import Attempt, Incident, Repair


@dataclass(frozen=True)
class History:
    attempts: tuple[guards.PastAttempt, ...] = ()
    last_recovery: guards.PastAttempt | None = None
    job_recoveries: tuple[datetime, ...] = ()  # a job incident: when each earlier recovery of the job started
    taken_out: frozenset[str] = frozenset()  # nodes taken out of service fleet-wide within the blast window
    ahead: str | None = None
    paused: bool = False
    pause_reason: str = ""


def blast_window(settings: Settings) -> timedelta:
    return timedelta(seconds=settings.guards.blast_radius_window_seconds)


def taken_out_nodes(
    conn: Connection, settings: Settings, registry: ActionRegistry, now: datetime
) -> frozenset[str]:
    """Nodes taken out of service fleet-wide within the blast-radius window: what the guard counts."""
    since = now - blast_window(settings)
    return frozenset(repairs.nodes_taken_out_since(conn, since, [a.name for a in registry if a.takes_out]))


def read_history(
    conn: Connection,
    settings: Settings,
    registry: ActionRegistry,
    playbook: Playbook,
    inc: Incident,
    now: datetime,
    pause_state: tuple[bool, str],
) -> History:
    """What the store says about this incident's target. A job incident's history is the job's, whatever the
    playbook: its budget and cooldown count every recovery of the job."""
    per_job = inc.kind == IncidentKind.JOB
    attempts = records.attempts_for_target(
        conn, None if per_job else playbook.name, inc.target_key, now - playbook.budget.window
    )
    recovery = records.last_recovery(conn, None if per_job else playbook.name, inc.target_key)
    job_window = timedelta(seconds=settings.guards.job_recoveries_window_seconds)
    job_attempts = (
        records.attempts_for_target(conn, None, inc.target_key, now - job_window) if per_job else []
    )
    ahead = records.earlier_open_on(conn, inc.serialize_key, inc.id) if inc.serialize_key else None
    paused, reason = pause_state
    return History(
        attempts=tuple(_past(a) for a in attempts),
        job_recoveries=tuple(a.started_at for a in job_attempts),
        last_recovery=_past(recovery) if recovery else None,
        taken_out=taken_out_nodes(conn, settings, registry, now),
        ahead=f"incident #{ahead.id} ({ahead.playbook}, {ahead.state})" if ahead else None,
        paused=paused,
        pause_reason=reason,
    )


def read_node_history(
    conn: Connection,
    settings: Settings,
    registry: ActionRegistry,
    playbook: Playbook,
    inc: Incident,
    now: datetime,
    pause_state: tuple[bool, str],
) -> History:
    """A node incident's history is its node's: each repair that took it out is an attempt (budget, backoff), the
    latest one that returned it a recovery (cooldown, and the stale signal: an alert older than that take-out is
    the fault it repaired, not a new one)."""
    taken_out = [
        _repair_past(r)
        for r in repairs.list_repairs(conn, node=inc.node, limit=repairs.MAX_LIST)
        if r.taken_out_by_us and r.taken_out_at is not None
    ]
    since = now - playbook.budget.window
    attempts = sorted((a for a in taken_out if a.started_at >= since), key=lambda a: a.started_at)
    returned = [a for a in taken_out if a.outcome in (RepairState.RETURNED, RepairState.RELEASED)]
    last = max(returned, key=lambda a: a.started_at, default=None)
    ahead = records.earlier_open_on(conn, inc.serialize_key, inc.id) if inc.serialize_key else None
    paused, reason = pause_state
    return History(
        attempts=tuple(attempts),
        last_recovery=last,
        taken_out=taken_out_nodes(conn, settings, registry, now),
        ahead=f"incident #{ahead.id} ({ahead.playbook}, {ahead.state})" if ahead else None,
        paused=paused,
        pause_reason=reason,
    )


def build(
    settings: Settings,
    playbook: Playbook,
    *,
    job: str | None,
    node: str | None,
    alert_starts_at: datetime,
    planned: Sequence[PlannedStep],
    history: History,
    now: datetime,
    pool: Mapping[str, Any] | None = None,
    repair_takes_out: bool = False,
) -> guards.GuardFacts:
    """``pool``: the partition/pool facts of the node the plan takes out
    (:func:`app.engine.scheduler_backends.pool_facts`), so the share limit holds for incidents' take-outs as for
    repairs'; None: only the absolute limit.
    ``repair_takes_out``: the plan is a node repair's, whose own guard counts its take-out (a node incident)."""
    g = settings.guards
    runs = [p for p in planned if p.runs]
    paused = history.paused or g.kill_switch
    pause_reason = "kill_switch set in settings" if g.kill_switch else history.pause_reason
    return guards.GuardFacts(
        now=now,
        playbook=playbook.name,
        node=node,
        alert_starts_at=alert_starts_at,
        paused=paused,
        pause_reason=pause_reason,
        granted_mutating=sum(1 for p in runs if p.mutating),
        would_run=sum(1 for p in planned if p.status == StepStatus.WOULD_RUN),
        takes_out=frozenset() if repair_takes_out else nodes_taken_out(planned),
        repair_takes_out=nodes_taken_out(planned) if repair_takes_out else frozenset(),
        taken_out=history.taken_out,
        ahead=history.ahead,
        attempts=history.attempts,
        budget_attempts=playbook.budget.attempts,
        budget_window=playbook.budget.window,
        backoff=playbook.budget.backoff,
        cooldown=playbook.cooldown,
        last_recovery=history.last_recovery,
        blast_max_nodes=g.blast_radius_max_nodes,
        blast_window=blast_window(settings),
        defer=timedelta(seconds=g.defer_seconds),
        job=job,
        job_recoveries=history.job_recoveries,
        job_recoveries_max=g.job_recoveries_max,
        job_recoveries_window=timedelta(seconds=g.job_recoveries_window_seconds),
        **(pool or {}),
    )


def _repair_past(row: Repair) -> guards.PastAttempt:
    assert row.taken_out_at is not None
    return guards.PastAttempt(started_at=row.taken_out_at, finished_at=row.closed_at, outcome=row.state)


def _past(attempt: Attempt) -> guards.PastAttempt:
    return guards.PastAttempt(
        started_at=attempt.started_at, finished_at=attempt.finished_at, outcome=attempt.outcome
    )
