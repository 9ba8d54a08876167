"""Failure episodes: which incident an alert belongs to, who the culprits are, when to act. Pure: no I/O.

One failure of a multi-node training job makes every rank alert (NCCL timeouts, watchdog aborts, error counters),
the faulty node's exporter report an Xid, and the scheduler perhaps the node. All of them name the same job, so they
form one **job incident**: one diagnosis, one recovery of the job that excludes the culprit nodes. A node-scoped
alert (a playbook with ``node_repair:``, or ``exclude_node:`` for a straggler that is excluded but not repaired)
names its node a culprit; a node-scoped alert on a node that runs no job opens a **node incident**; anything else
keeps the per-(playbook, target) incident.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from app.domain import schedulers
from app.domain.culprits import Culprit
from app.domain.playbooks import Playbook
from app.domain.states import IncidentKind
from app.domain.templates import render_promql

MAX_CULPRITS_KEPT = 32  # culprit entries kept on one incident (evidence beyond this is in the ledger)


@dataclass(frozen=True)
class Episode:
    """Where one matched alert goes: the incident kind and its open key (one open incident per key)."""

    kind: IncidentKind
    open_key: str
    culprit: str | None = None  # the node this alert names as faulty (node-scoped playbooks only)


def progress_query(target: Mapping[str, str]) -> str | None:
    """The PromQL of the highest step any rank of the target's job reports (the labels the progress library's
    identity sets, nightshift_progress.identity; its scheduler's ``job_selector``), values escaped as PromQL
    literals: what a job's own recovery is judged on. None for a target without a job."""
    scheduler = schedulers.of(target)
    if scheduler is None or schedulers.job_identity(target) is None:
        return None
    return render_promql(f"max(training_step_total{{{scheduler.job_selector}}})", {"target": target})


def episode_of(playbook: Playbook, target: Mapping[str, str], target_key: str) -> Episode:
    """The incident an alert joins, from its playbook and rendered target."""
    node = target.get("node") or None
    names_culprit = (
        playbook.node_repair is not None or playbook.exclude_node is not None
    ) and node is not None
    job = schedulers.job_identity(target)
    if job is not None:
        return Episode(IncidentKind.JOB, f"job:{job}", culprit=node if names_culprit else None)
    # Without a job only a playbook that repairs takes the node on: a straggler of no job is nobody's.
    scheduler = schedulers.of(target)
    if playbook.node_repair is not None and node is not None and scheduler is not None:
        return Episode(IncidentKind.NODE, f"node:{scheduler.name}/{node}", culprit=node)
    return Episode(IncidentKind.TARGET, f"{playbook.name}|{target_key}")


def add_culprit(
    culprits: Sequence[Culprit],
    node: str,
    source: str,
    reason: str,
    playbook: str | None = None,
) -> tuple[Culprit, ...] | None:
    """``culprits`` with ``node`` named by ``source``; None when it is already there (nothing to write).
    ``playbook``: the node-scoped playbook that named it, whose ``node_repair`` says how to repair it (None:
    named by the diagnosis, repaired with the scheduler's defaults)."""
    if any(c.node == node for c in culprits) or len(culprits) >= MAX_CULPRITS_KEPT:
        return None
    return (*culprits, Culprit(node, source, reason, playbook))


def confirm(culprits: Iterable[Culprit], allocation: Iterable[str]) -> tuple[Culprit, ...]:
    """Mark each culprit confirmed when its node is in the job's allocation. A node outside it is evidence only:
    never excluded, never drained."""
    nodes = set(allocation)
    return tuple(replace(c, confirmed=c.node in nodes) for c in culprits)


@dataclass(frozen=True)
class Exclusion:
    """The nodes the job's recovery keeps it off, or why none are and a person decides."""

    nodes: tuple[str, ...] = ()
    refused: str | None = None  # set: exclude none, hand to a human


def exclusion(
    culprits: Iterable[Culprit], job_nodes: int | None, max_culprits: int, max_share: float
) -> Exclusion:
    """Confirmed culprits to exclude, unless there are too many: a fault that seems to be everywhere is rarely in
    the nodes (the fabric, the storage or the application is the likelier cause). ``job_nodes`` None: the job's
    size is unknown and only the count limit applies."""
    nodes = tuple(sorted({c.node for c in culprits if c.confirmed}))
    if not nodes:
        return Exclusion()
    # The share never forbids one culprit: a single-node job moves off its faulty node.
    share_limit = max(1, math.floor(job_nodes * max_share)) if job_nodes is not None else len(nodes)
    if len(nodes) > max_culprits or len(nodes) > share_limit:
        size = f"a {job_nodes}-node job" if job_nodes is not None else "the job"
        return Exclusion(
            refused=f"{len(nodes)} culprit node(s) ({', '.join(nodes[:8])}) of {size} exceed the limit "
            f"({max_culprits} nodes, {max_share:.0%} of the job): excluding none"
        )
    return Exclusion(nodes=nodes)


def repair_due(playbook: Playbook | None, earlier_exclusions: int) -> bool:
    """Whether a confirmed culprit goes to the repair lifecycle: always, unless the playbook that named it only
    excludes it (``exclude_node``) and this exclusion is not yet its ``repair_after``-th within the window
    (``earlier_exclusions``: the exclusions by such playbooks before this one)."""
    if playbook is None or playbook.exclude_node is None:
        return True
    return earlier_exclusions + 1 >= playbook.exclude_node.repair_after


def correlation_end(opened_at: datetime, window_seconds: int) -> datetime:
    return opened_at + timedelta(seconds=window_seconds)


def must_wait(now: datetime, act_after: datetime | None, culprits: Iterable[Culprit]) -> bool:
    """Whether the job incident still waits for the rest of its episode's alerts: inside the correlation window
    and no culprit node known yet (a node-scoped alert is decisive)."""
    if act_after is None or now >= act_after:
        return False
    return not any(True for _ in culprits)


def leading_playbook(playbooks: Iterable[Playbook]) -> Playbook | None:
    """The playbook that plans the job's recovery: highest priority, then node-scoped, then name."""
    return min(
        playbooks,
        key=lambda p: (-p.priority, p.node_repair is None, p.name),
        default=None,
    )
