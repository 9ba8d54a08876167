"""The guard chain as pure functions with an injected clock: each guard's pass, wait and stop, and the chain order."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from app.domain import guards
from app.domain.guards import GuardFacts, PastAttempt
from app.domain.states import GuardDecision
from tests.fakes import START

NOW = START
BASE = GuardFacts(
    now=NOW,
    playbook="gpu-xid",
    node="node1",
    alert_starts_at=NOW - timedelta(minutes=1),
    granted_mutating=2,
    takes_out=frozenset({"node1"}),
)


def decisions(facts: GuardFacts) -> list[tuple[str, str]]:
    return [(v.guard, v.decision) for v in guards.evaluate(facts)]


def test_quiet_fleet_passes_every_guard_in_design_order():
    assert decisions(BASE) == [
        ("kill_switch", GuardDecision.PASS),
        ("permission", GuardDecision.PASS),
        ("blast_radius", GuardDecision.PASS),
        ("serialisation", GuardDecision.PASS),
        ("budget", GuardDecision.PASS),
        ("job_budget", GuardDecision.PASS),
        ("cooldown", GuardDecision.PASS),
        ("stale_signal", GuardDecision.PASS),
    ]


def test_a_job_incident_stops_at_the_job_budget_whatever_the_playbook_budget_says():
    now = BASE.now
    recoveries = [now - timedelta(hours=h) for h in (1, 3, 30)]  # the one 30 h ago is outside the window
    facts = replace(BASE, job="slurm/4242", job_recoveries=recoveries, job_recoveries_max=2)
    last = guards.evaluate(facts)[-1]
    assert (last.guard, last.decision, last.outcome) == ("job_budget", GuardDecision.STOP, "needs_human")
    assert guards.evaluate(replace(facts, job_recoveries_max=3))[-1].decision == GuardDecision.PASS


def test_kill_switch_holds_acting_incidents_and_ends_the_chain():
    verdicts = guards.evaluate(replace(BASE, paused=True, pause_reason="maintenance"))
    assert [(v.guard, v.decision) for v in verdicts] == [("kill_switch", GuardDecision.WAIT)]
    assert "maintenance" in verdicts[0].reason
    assert verdicts[0].until == NOW + BASE.defer


def test_kill_switch_does_not_hold_an_advisory_plan():
    verdicts = guards.evaluate(
        replace(BASE, paused=True, granted_mutating=0, takes_out=frozenset(), would_run=3)
    )
    assert [(v.guard, v.decision, v.outcome) for v in verdicts] == [
        ("kill_switch", GuardDecision.PASS, None),
        ("permission", GuardDecision.STOP, "advisory"),
    ]
    assert "3 would run" in verdicts[1].reason


def test_blast_radius_waits_when_the_limit_of_other_nodes_is_reached():
    full = replace(BASE, taken_out=frozenset({"n2", "n3", "n4"}), blast_max_nodes=3)
    last = guards.evaluate(full)[-1]
    assert (last.guard, last.decision) == ("blast_radius", GuardDecision.WAIT)
    assert "3 node(s) taken out in the last 1h (limit 3): n2, n3, n4" in last.reason


def test_blast_radius_counts_a_node_once_and_never_blocks_return_to_service():
    already = replace(BASE, taken_out=frozenset({"node1", "n2", "n3"}), blast_max_nodes=3)
    assert guards.blast_radius(already).decision == GuardDecision.PASS
    resume_only = replace(BASE, takes_out=frozenset(), taken_out=frozenset({"n2", "n3", "n4"}))
    assert guards.blast_radius(resume_only).decision == GuardDecision.PASS


def test_blast_radius_counts_nodes_taken_out_never_job_restarts():
    # A requeue takes no node out: however many nodes are out, it passes.
    restart = replace(BASE, takes_out=frozenset(), taken_out=frozenset({"n2", "n3", "n4"}))
    verdict = guards.blast_radius(restart)
    assert (verdict.decision, verdict.reason) == (GuardDecision.PASS, "takes no node out of service")
    drain = replace(restart, takes_out=frozenset({"node1"}))
    assert guards.blast_radius(drain).decision == GuardDecision.WAIT


def test_blast_radius_share_of_the_partition_at_least_one_node():
    pool = frozenset(f"node{i}" for i in range(1, 9))  # 8 nodes, 25 %: 2 may be out
    facts = replace(
        BASE, takes_out=frozenset({"node1"}), taken_out=frozenset(), pool="partition gpu", pool_nodes=pool,
        blast_max_share=0.25, blast_max_nodes=10,
    )  # fmt: skip
    assert guards.blast_radius(facts).reason == "1 of 10 nodes within 1h; 1 of 2 in partition gpu"
    one_out = replace(facts, taken_out=frozenset({"node2"}))
    assert guards.blast_radius(one_out).decision == GuardDecision.PASS
    two_out = replace(facts, taken_out=frozenset({"node2", "node3", "elsewhere9"}))
    verdict = guards.blast_radius(two_out)
    assert verdict.decision == GuardDecision.WAIT
    assert verdict.reason == (
        "2 of the 8 nodes of partition gpu taken out in the last 1h (limit 2, 25%): node2, node3"
    )
    # A pool of 2 at 25 %: still one node may go.
    small = replace(facts, pool_nodes=frozenset({"node1", "node2"}))
    assert guards.blast_radius(small).decision == GuardDecision.PASS
    assert guards.blast_radius(replace(small, taken_out=frozenset({"node2"}))).decision == GuardDecision.WAIT
    assert guards.pool_limit(0, 0.25) == 1 and guards.pool_limit(10, 0.3) == 3


def test_serialisation_waits_behind_an_earlier_incident():
    verdict = guards.serialisation(replace(BASE, ahead="incident #4 (gpu-xid, acting)"))
    assert verdict.decision == GuardDecision.WAIT and "incident #4" in verdict.reason


def test_budget_spent_stops_with_needs_human():
    spent = tuple(
        PastAttempt(NOW - timedelta(hours=h), NOW - timedelta(hours=h), "failed") for h in (5, 3, 1)
    )
    verdict = guards.budget(replace(BASE, attempts=spent, budget_attempts=3))
    assert (verdict.decision, verdict.outcome) == (GuardDecision.STOP, "needs_human")
    assert "3 attempt(s) in the last 1d (budget 3)" in verdict.reason


def test_backoff_waits_until_exactly_backoff_after_the_last_attempt():
    last = PastAttempt(NOW - timedelta(minutes=4), NOW - timedelta(minutes=3), "failed")
    verdict = guards.budget(replace(BASE, attempts=(last,), backoff=timedelta(minutes=10)))
    assert verdict.decision == GuardDecision.WAIT
    assert verdict.until == NOW + timedelta(minutes=7)
    later = guards.budget(
        replace(BASE, now=NOW + timedelta(minutes=7), attempts=(last,), backoff=timedelta(minutes=10))
    )
    assert later.decision == GuardDecision.PASS and later.reason == "attempt 2 of 3"


def test_cooldown_after_a_recovery():
    recovery = PastAttempt(NOW - timedelta(minutes=20), NOW - timedelta(minutes=10), "recovered")
    facts = replace(BASE, last_recovery=recovery, alert_starts_at=NOW, cooldown=timedelta(minutes=30))
    verdict = guards.cooldown(facts)
    assert verdict.decision == GuardDecision.WAIT and verdict.until == NOW + timedelta(minutes=20)
    assert guards.cooldown(replace(facts, now=NOW + timedelta(minutes=20))).decision == GuardDecision.PASS


def test_stale_signal_ignores_an_alert_older_than_our_last_success():
    recovery = PastAttempt(NOW - timedelta(hours=2), NOW - timedelta(hours=1, minutes=50), "recovered")
    stale = replace(BASE, last_recovery=recovery, alert_starts_at=NOW - timedelta(hours=3))
    assert (guards.stale_signal(stale).decision, guards.stale_signal(stale).outcome) == (
        GuardDecision.STOP,
        "ignored",
    )
    fresh = replace(stale, alert_starts_at=NOW - timedelta(minutes=5))
    assert guards.stale_signal(fresh).decision == GuardDecision.PASS


def test_recheck_verdicts():
    defer = timedelta(seconds=30)
    assert guards.recheck(None, None, None, NOW, defer).decision == GuardDecision.PASS
    assert guards.recheck("up", 2, None, NOW, defer).decision == GuardDecision.PASS
    gone = guards.recheck("up", 0, None, NOW, defer)
    assert (gone.decision, gone.outcome) == (GuardDecision.STOP, "resolved")
    blind = guards.recheck("up", None, "connection refused", NOW, defer)
    assert blind.decision == GuardDecision.WAIT and "not acting blind" in blind.reason
