"""The guard chain: pure functions of (incident facts, history, settings, clock) → Verdict.

Order (DESIGN.md): kill switch, permission, blast radius, per-target serialisation, attempt budget with backoff,
cooldown after success, stale signal, live re-check. The first verdict that is not ``pass`` ends the chain; every
verdict evaluated is ledgered by the engine. ``wait`` holds the incident (re-evaluated at ``until``); ``stop`` closes it
with ``outcome``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

PASS, WAIT, STOP = "pass", "wait", "stop"


@dataclass(frozen=True)
class Verdict:
    guard: str
    decision: str
    reason: str
    until: datetime | None = None
    outcome: str | None = None

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
    destructive: bool = False  # a granted step takes capacity away (not read-only, not return-to-service)
    ahead: str | None = None  # description of an earlier open incident on the same node/job
    attempts: Sequence[PastAttempt] = field(default_factory=tuple)  # on this target, within the budget window
    budget_attempts: int = 3
    budget_window: timedelta = timedelta(hours=24)
    backoff: timedelta = timedelta(minutes=10)
    cooldown: timedelta = timedelta(minutes=30)
    last_recovery: PastAttempt | None = None
    disrupted_nodes: frozenset[str] = frozenset()  # nodes disrupted fleet-wide within the blast window
    blast_max_nodes: int = 3
    blast_window: timedelta = timedelta(hours=1)
    defer: timedelta = timedelta(seconds=30)


def kill_switch(f: GuardFacts) -> Verdict:
    if f.paused and f.granted_mutating:
        return Verdict(
            "kill_switch",
            WAIT,
            f"automation paused: {f.pause_reason or 'no reason given'}",
            until=f.now + f.defer,
        )
    return Verdict(
        "kill_switch", PASS, "automation paused, nothing to hold" if f.paused else "automation enabled"
    )


def permission(f: GuardFacts) -> Verdict:
    if not f.granted_mutating:
        return Verdict(
            "permission",
            STOP,
            f"no remediation step is whitelisted ({f.would_run} would run): advisory",
            outcome="advisory",
        )
    return Verdict(
        "permission", PASS, f"{f.granted_mutating} step(s) whitelisted, {f.would_run} would run only"
    )


def blast_radius(f: GuardFacts) -> Verdict:
    if not f.destructive:
        return Verdict("blast_radius", PASS, "no capacity-reducing step")
    if f.node and f.node in f.disrupted_nodes:
        return Verdict("blast_radius", PASS, f"node {f.node} already counted")
    used = len(f.disrupted_nodes)
    window = _human(f.blast_window)
    if used >= f.blast_max_nodes:
        nodes = ", ".join(sorted(f.disrupted_nodes)[:10])
        return Verdict(
            "blast_radius",
            WAIT,
            f"{used} node(s) disrupted in the last {window} (limit {f.blast_max_nodes}): {nodes}",
            until=f.now + f.defer,
        )
    return Verdict("blast_radius", PASS, f"{used + 1} of {f.blast_max_nodes} nodes within {window}")


def serialisation(f: GuardFacts) -> Verdict:
    if f.ahead:
        return Verdict("serialisation", WAIT, f"waiting for {f.ahead}", until=f.now + f.defer)
    return Verdict("serialisation", PASS, "no other open incident on this target")


def budget(f: GuardFacts) -> Verdict:
    used = len(f.attempts)
    if used >= f.budget_attempts:
        return Verdict(
            "budget",
            STOP,
            f"{used} attempt(s) in the last {_human(f.budget_window)} (budget {f.budget_attempts})",
            outcome="needs_human",
        )
    if f.attempts:
        last = f.attempts[-1]
        ready = (last.finished_at or last.started_at) + f.backoff
        if ready > f.now:
            return Verdict("budget", WAIT, f"backoff {_human(f.backoff)} after attempt {used}", until=ready)
    return Verdict("budget", PASS, f"attempt {used + 1} of {f.budget_attempts}")


def cooldown(f: GuardFacts) -> Verdict:
    if f.last_recovery and f.last_recovery.finished_at:
        ready = f.last_recovery.finished_at + f.cooldown
        if ready > f.now:
            return Verdict(
                "cooldown",
                WAIT,
                f"recovered {_human(f.now - f.last_recovery.finished_at)} ago "
                f"(cooldown {_human(f.cooldown)})",
                until=ready,
            )
    return Verdict("cooldown", PASS, "no recent recovery")


def stale_signal(f: GuardFacts) -> Verdict:
    if f.last_recovery and f.alert_starts_at < f.last_recovery.started_at:
        return Verdict(
            "stale_signal",
            STOP,
            f"alert started {f.alert_starts_at.isoformat()}, before our last successful remediation "
            f"({f.last_recovery.started_at.isoformat()})",
            outcome="ignored",
        )
    return Verdict("stale_signal", PASS, "alert is newer than our last action")


def recheck(
    expr: str | None, samples: int | None, error: str | None, now: datetime, defer: timedelta
) -> Verdict:
    """Verdict on the live PromQL re-check done by the engine just before acting."""
    if expr is None:
        return Verdict("recheck", PASS, "no re-check configured")
    if error is not None:
        return Verdict("recheck", WAIT, f"re-check failed, not acting blind: {error}", until=now + defer)
    if not samples:
        return Verdict(
            "recheck", STOP, "condition no longer holds (re-check returned no series)", outcome="resolved"
        )
    return Verdict("recheck", PASS, f"condition still holds ({samples} series)")


CHAIN = (kill_switch, permission, blast_radius, serialisation, budget, cooldown, stale_signal)


def evaluate(facts: GuardFacts) -> list[Verdict]:
    """Run the chain up to the first verdict that is not ``pass`` (re-check is the engine's last step)."""
    verdicts = []
    for guard in CHAIN:
        verdict = guard(facts)
        verdicts.append(verdict)
        if verdict.decision != PASS:
            break
    return verdicts


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
