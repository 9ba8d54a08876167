"""The guard chain: pure functions of (incident facts, history, settings, clock) → Verdict.

Order (DESIGN.md): kill switch, permission, blast radius, per-target serialisation, attempt budget with backoff,
cooldown after success, stale signal, live re-check. The first verdict that is not ``pass`` ends the chain; every
verdict evaluated is ledgered by the engine. ``wait`` holds the incident (re-evaluated at ``until``); ``stop`` closes it
with ``outcome``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.domain.states import Guard, GuardDecision, IncidentOutcome


@dataclass(frozen=True)
class Verdict:
    guard: Guard
    decision: GuardDecision
    reason: str
    until: datetime | None = None
    outcome: IncidentOutcome | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "guard": self.guard,
            "decision": self.decision,
            "reason": self.reason,
            "until": self.until.isoformat() if self.until else None,
            "outcome": self.outcome,
        }


@dataclass(frozen=True)
class PastAttempt:
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None


@dataclass(frozen=True)
class GuardFacts:
    """Everything the chain decides on, gathered by the engine (or by ``explain`` with an empty history)."""

    now: datetime
    playbook: str
    node: str | None
    alert_starts_at: datetime
    paused: bool = False
    pause_reason: str = ""
    granted_mutating: int = 0  # whitelisted steps that change something
    would_run: int = 0  # steps not whitelisted, recorded only
    ahead: str | None = None  # description of an earlier open incident on the same node/job
    attempts: Sequence[PastAttempt] = field(default_factory=tuple)  # on this target, within the budget window
    budget_attempts: int = 3
    budget_window: timedelta = timedelta(hours=24)
    backoff: timedelta = timedelta(minutes=10)
    cooldown: timedelta = timedelta(minutes=30)
    last_recovery: PastAttempt | None = None
    blast_max_nodes: int = 3
    blast_window: timedelta = timedelta(hours=1)
    # Blast radius on nodes (see :func:`blast_radius`). ``takes_out``: the nodes the granted steps take out of
    # service (drain, cordon, reboot; :func:`app.domain.planning.nodes_taken_out`). ``taken_out``: nodes taken out
    # fleet-wide within the window or still out (:func:`app.engine.guard_facts.taken_out_nodes`). ``pool_nodes``:
    # every node of the partition / node pool of the node taken out (empty: unknown, no share limit), named ``pool``.
    takes_out: frozenset[str] = frozenset()
    taken_out: frozenset[str] = frozenset()
    pool: str = ""
    pool_nodes: frozenset[str] = frozenset()
    blast_max_share: float = 1.0
    # A node incident: its node is taken out by its repair, whose own blast-radius guard counts it (with its
    # partition/pool) just before; counted there, not twice.
    repair_takes_out: frozenset[str] = frozenset()
    defer: timedelta = timedelta(seconds=30)
    # A job incident: its job, when each earlier recovery of the job started (any playbook), and the job budget.
    job: str | None = None
    job_recoveries: Sequence[datetime] = field(default_factory=tuple)
    job_recoveries_max: int = 5
    job_recoveries_window: timedelta = timedelta(hours=24)


def kill_switch(f: GuardFacts) -> Verdict:
    if f.paused and f.granted_mutating:
        return Verdict(
            Guard.KILL_SWITCH,
            GuardDecision.WAIT,
            f"automation paused: {f.pause_reason or 'no reason given'}",
            until=f.now + f.defer,
        )
    return Verdict(
        Guard.KILL_SWITCH,
        GuardDecision.PASS,
        "automation paused, nothing to hold" if f.paused else "automation enabled",
    )


def permission(f: GuardFacts) -> Verdict:
    if not f.granted_mutating:
        return Verdict(
            Guard.PERMISSION,
            GuardDecision.STOP,
            f"no remediation step is whitelisted ({f.would_run} would run): advisory",
            outcome=IncidentOutcome.ADVISORY,
        )
    return Verdict(
        Guard.PERMISSION,
        GuardDecision.PASS,
        f"{f.granted_mutating} step(s) whitelisted, {f.would_run} would run only",
    )


def blast_radius(f: GuardFacts) -> Verdict:
    """Nodes taken out of service (drain, cordon, reboot) within the window, fleet-wide and per partition/pool.

    Job restarts never count, and returning a node to service is never held (it takes nothing out)."""
    adding, out = f.takes_out, f.taken_out
    if f.repair_takes_out:
        nodes = ", ".join(sorted(f.repair_takes_out))
        return Verdict(
            Guard.BLAST_RADIUS,
            GuardDecision.PASS,
            f"node {nodes}: counted by its repair's guard when it is taken out",
        )
    if not adding:
        return Verdict(Guard.BLAST_RADIUS, GuardDecision.PASS, "takes no node out of service")
    new = adding - out
    if not new:
        return Verdict(
            Guard.BLAST_RADIUS, GuardDecision.PASS, f"node(s) {', '.join(sorted(adding))} already counted"
        )
    window = human_duration(f.blast_window)
    after = out | adding
    if len(after) > f.blast_max_nodes:
        nodes = ", ".join(sorted(out)[:10])
        return Verdict(
            Guard.BLAST_RADIUS,
            GuardDecision.WAIT,
            f"{len(out)} node(s) taken out in the last {window} (limit {f.blast_max_nodes}): {nodes}",
            until=f.now + f.defer,
        )
    if f.pool_nodes:
        limit = pool_limit(len(f.pool_nodes), f.blast_max_share)
        in_pool = after & f.pool_nodes
        if len(in_pool) > limit:
            return Verdict(
                Guard.BLAST_RADIUS,
                GuardDecision.WAIT,
                f"{len(in_pool - new)} of the {len(f.pool_nodes)} nodes of {f.pool or 'its pool'} taken out in the "
                f"last {window} (limit {limit}, {f.blast_max_share:.0%}): {', '.join(sorted(in_pool - new)[:10])}",
                until=f.now + f.defer,
            )
        share = f"; {len(in_pool)} of {limit} in {f.pool or 'its pool'}"
    else:
        share = ""
    return Verdict(
        Guard.BLAST_RADIUS,
        GuardDecision.PASS,
        f"{len(after)} of {f.blast_max_nodes} nodes within {window}{share}",
    )


def pool_limit(pool_size: int, max_share: float) -> int:
    """How many nodes of a partition/pool of ``pool_size`` may be out at once: the share, at least one."""
    return max(1, math.floor(pool_size * max_share + 1e-9))


def serialisation(f: GuardFacts) -> Verdict:
    if f.ahead:
        return Verdict(
            Guard.SERIALISATION, GuardDecision.WAIT, f"waiting for {f.ahead}", until=f.now + f.defer
        )
    return Verdict(Guard.SERIALISATION, GuardDecision.PASS, "no other open incident on this target")


def budget(f: GuardFacts) -> Verdict:
    used = len(f.attempts)
    if used >= f.budget_attempts:
        return Verdict(
            Guard.BUDGET,
            GuardDecision.STOP,
            f"{used} attempt(s) in the last {human_duration(f.budget_window)} (budget {f.budget_attempts})",
            outcome=IncidentOutcome.NEEDS_HUMAN,
        )
    if f.attempts:
        last = f.attempts[-1]
        ready = (last.finished_at or last.started_at) + f.backoff
        if ready > f.now:
            return Verdict(
                Guard.BUDGET,
                GuardDecision.WAIT,
                f"backoff {human_duration(f.backoff)} after attempt {used}",
                until=ready,
            )
    return Verdict(Guard.BUDGET, GuardDecision.PASS, f"attempt {used + 1} of {f.budget_attempts}")


def cooldown(f: GuardFacts) -> Verdict:
    if f.last_recovery and f.last_recovery.finished_at:
        ready = f.last_recovery.finished_at + f.cooldown
        if ready > f.now:
            return Verdict(
                Guard.COOLDOWN,
                GuardDecision.WAIT,
                f"recovered {human_duration(f.now - f.last_recovery.finished_at)} ago "
                f"(cooldown {human_duration(f.cooldown)})",
                until=ready,
            )
    return Verdict(Guard.COOLDOWN, GuardDecision.PASS, "no recent recovery")


def stale_signal(f: GuardFacts) -> Verdict:
    if f.last_recovery and f.alert_starts_at < f.last_recovery.started_at:
        return Verdict(
            Guard.STALE_SIGNAL,
            GuardDecision.STOP,
            f"alert started {f.alert_starts_at.isoformat()}, before our last successful remediation "
            f"({f.last_recovery.started_at.isoformat()})",
            outcome=IncidentOutcome.IGNORED,
        )
    return Verdict(Guard.STALE_SIGNAL, GuardDecision.PASS, "alert is newer than our last action")


REPLACEMENT_CHARACTER = "\ufffd"


def recheck(
    expr: str | None, samples: int | None, error: str | None, now: datetime, defer: timedelta
) -> Verdict:
    """Verdict on the live PromQL re-check done by the engine just before acting."""
    if expr is None:
        return Verdict(Guard.RECHECK, GuardDecision.PASS, "no re-check configured")
    if error is not None:
        return Verdict(
            Guard.RECHECK,
            GuardDecision.WAIT,
            f"re-check failed, not acting blind: {error}",
            until=now + defer,
        )
    if not samples:
        reason = "condition no longer holds (re-check returned no series)"
        if REPLACEMENT_CHARACTER in expr:
            # Alert text with a lone UTF-16 surrogate is stored with U+FFFD in its place (as Alertmanager's Go
            # decoder does), so a query built from it cannot name the series the alert came from.
            reason = (
                "re-check returned no series, and cannot: its query holds U+FFFD where an alert label had an "
                "invalid character (a lone UTF-16 surrogate, replaced on receipt), so it matches no real series; "
                "not acting"
            )
        return Verdict(Guard.RECHECK, GuardDecision.STOP, reason, outcome=IncidentOutcome.RESOLVED)
    return Verdict(Guard.RECHECK, GuardDecision.PASS, f"condition still holds ({samples} series)")


def recoveries_verdict(
    job: str | None, recoveries: Sequence[datetime], now: datetime, limit: int, window: timedelta
) -> Verdict:
    """At most ``limit`` recoveries of one training job within ``window``, whatever the fault class (settings
    ``guards.job_recoveries_max`` / ``guards.job_recoveries_window_seconds``); then the job goes to a person.

    ``recoveries``: when each earlier recovery attempt of this job started (any playbook, any incident); those
    older than the window do not count. In the chain as :func:`job_budget`."""
    if not job:
        return Verdict(Guard.JOB_BUDGET, GuardDecision.PASS, "not a training job's incident")
    if limit < 1:
        return Verdict(
            Guard.JOB_BUDGET,
            GuardDecision.STOP,
            f"job {job}: job recoveries disabled (limit {limit})",
            outcome=IncidentOutcome.NEEDS_HUMAN,
        )
    used = sum(1 for started in recoveries if now - window < started <= now)
    if used >= limit:
        return Verdict(
            Guard.JOB_BUDGET,
            GuardDecision.STOP,
            f"job {job}: {used} recoveries in the last {human_duration(window)}, whatever the fault "
            f"(job budget {limit}): a person looks before another",
            outcome=IncidentOutcome.NEEDS_HUMAN,
        )
    return Verdict(
        Guard.JOB_BUDGET,
        GuardDecision.PASS,
        f"job {job}: recovery {used + 1} of {limit} in {human_duration(window)}",
    )


def job_budget(f: GuardFacts) -> Verdict:
    """The job budget (:func:`recoveries_verdict`) of a job incident."""
    return recoveries_verdict(f.job, f.job_recoveries, f.now, f.job_recoveries_max, f.job_recoveries_window)


CHAIN = (kill_switch, permission, blast_radius, serialisation, budget, job_budget, cooldown, stale_signal)


def evaluate(facts: GuardFacts) -> list[Verdict]:
    """Run the chain up to the first verdict that is not ``pass`` (re-check is the engine's last step)."""
    verdicts = []
    for guard in CHAIN:
        verdict = guard(facts)
        verdicts.append(verdict)
        if verdict.decision != GuardDecision.PASS:
            break
    return verdicts


def human_duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
