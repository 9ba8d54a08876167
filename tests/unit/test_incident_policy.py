"""The incident policy as a table: a subject and its facts in, one decision out (no store, no backend)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.actions.base import Action, ActionContext, Plan
from app.domain import guards
from app.domain import incident_policy as policy
from app.domain.culprits import Culprit
from app.domain.incident_policy import (
    Blame,
    Facts,
    FleetHold,
    JobAssumed,
    JobUnread,
    Need,
    Recheck,
    RepairView,
    Subject,
)
from app.domain.job_phase import JobPhase, JobStatus
from app.domain.outcome import Outcome
from app.domain.planning import INVALID, RUN, WOULD_RUN, PlannedStep
from app.domain.states import GuardDecision, IncidentKind, IncidentOutcome, RepairState, State

NOW = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)
XID = Culprit("node2", "GpuXidError on node2", "xid=79", playbook="xid")


class Requeue(Action):
    """Stands for a mutating step in a plan (the policy never runs one)."""

    name = "slurm.requeue_job"

    def plan(self, params: Mapping[str, Any]) -> Plan:
        raise AssertionError("the policy plans nothing")

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        raise AssertionError("the policy runs nothing")


def step(status: str = RUN, **values: Any) -> PlannedStep:
    return PlannedStep(idx=0, name="requeue", action=Requeue(), status=status, **values)


PLAN = (step(),)


def job(**values: Any) -> Subject:
    base: dict[str, Any] = {
        "kind": IncidentKind.JOB,
        "state": State.DIAGNOSING,
        "job": "4242",
        "culprits": (XID,),
        "diagnosis": {"category": "gpu_hardware", "summary": "Xid 79"},
    }
    return Subject(**{**base, **values})


def node(**values: Any) -> Subject:
    base: dict[str, Any] = {
        "kind": IncidentKind.NODE,
        "state": State.DIAGNOSING,
        "node": "node3",
        "diagnosis": {"category": "gpu_hardware", "summary": "Xid 79"},
        "has_recheck": True,
        "alertname": "GpuXidError",
    }
    return Subject(**{**base, **values})


def chain(**values: Any) -> guards.GuardFacts:
    base: dict[str, Any] = {
        "now": NOW,
        "playbook": "xid",
        "node": None,
        "alert_starts_at": NOW - timedelta(minutes=2),
        "granted_mutating": 1,
    }
    return guards.GuardFacts(**{**base, **values})


def facts(**values: Any) -> Facts:
    base: dict[str, Any] = {
        "now": NOW,
        "diagnosed": True,
        "job": JobStatus(JobPhase.DIED, ("node1", "node2"), "FAILED"),
        "planned": PLAN,
        "guards": chain(),
        "fleet": FleetHold(),
        "blame": Blame(),
    }
    return Facts(**{**base, **values})


FIRING = Recheck("ALERTS{}", samples=({"labels": {}, "value": 1},))
GONE = Recheck("ALERTS{}", samples=())
SPENT = guards.PastAttempt(NOW, NOW, "failed")
BACK = RepairView(4, RepairState.RETURNED, "back")
HELD = RepairView(4, RepairState.HELD, "lemon")


@pytest.mark.parametrize(
    ("subject", "given", "expected"),
    [
        # Asking for facts, in order.
        (job(state=State.OPEN, act_after=NOW + timedelta(seconds=30), culprits=()), facts(), policy.Wait),
        (job(state=State.OPEN), facts(diagnosed=False), Need.DIAGNOSIS),
        (job(), facts(job=None), Need.JOB_STATUS),
        (job(), facts(fleet=None), Need.FLEET),
        (job(), facts(blame=None), Need.BLAME),
        (job(), facts(planned=None), Need.PLAN),
        (job(), facts(guards=None), Need.GUARDS),
        (job(has_recheck=True), facts(), Need.RECHECK),
        (node(), facts(job=None, planned=None), Need.PLAN),
        (node(), facts(job=None, guards=None), Need.GUARDS),
        (node(), facts(job=None), Need.RECHECK),
        (node(state=State.REPAIRING), facts(), Need.REPAIR),
        # States past deciding.
        (job(state=State.ACTING), facts(), policy.Act),
        (job(state=State.VERIFYING), facts(), policy.Verify),
        (job(state=State.WAITING_FOR_RESOURCES), facts(), policy.Verify),
        # Decisions.
        (job(has_recheck=True), facts(recheck=FIRING), policy.StartAttempt),
        (job(), facts(), policy.StartAttempt),
        (node(), facts(job=None, recheck=FIRING), policy.HandToRepair),
    ],
)
def test_what_is_asked_and_decided(subject: Subject, given: Facts, expected: Any) -> None:
    decision = policy.decide(subject, given)
    if isinstance(expected, Need):
        assert isinstance(decision, policy.Gather) and decision.need == expected
    else:
        assert isinstance(decision, expected), decision


@pytest.mark.parametrize(
    ("subject", "given", "outcome", "reason"),
    [
        (job(diagnosis={"category": "benign", "summary": "planned stop"}), facts(), IncidentOutcome.BENIGN, "no fault"),
        (job(), facts(job=JobStatus(JobPhase.COMPLETED, (), "COMPLETED")), IncidentOutcome.COMPLETED, "on purpose"),
        (job(), facts(planned=(step(INVALID, reason="bad node"),)), IncidentOutcome.NEEDS_HUMAN, "bad node"),
        (job(has_recheck=True), facts(recheck=GONE), IncidentOutcome.RESOLVED, "no longer holds"),
        (job(), facts(guards=chain(granted_mutating=0)), IncidentOutcome.ADVISORY, "advisory"),
        (job(), facts(guards=chain(attempts=(SPENT,) * 3)), IncidentOutcome.NEEDS_HUMAN, "budget"),
        (node(state=State.REPAIRING), facts(repair=RepairView(4, None)), IncidentOutcome.NEEDS_HUMAN, "is gone"),
        (node(state=State.REPAIRING), facts(repair=BACK), IncidentOutcome.RECOVERED, "repair #4 returned"),
        (node(state=State.REPAIRING), facts(repair=HELD), IncidentOutcome.NEEDS_HUMAN, "held"),
    ],
)  # fmt: skip
def test_closes(subject: Subject, given: Facts, outcome: IncidentOutcome, reason: str) -> None:
    decision = policy.decide(subject, given)
    assert isinstance(decision, policy.Close), decision
    assert decision.outcome == outcome and reason in decision.reason


def test_a_node_alert_older_than_the_last_repair_is_stale_and_never_takes_the_node_out() -> None:
    """The reproduction of issue 20: a node incident goes through the stale-signal guard like a job's."""
    repaired = guards.PastAttempt(
        started_at=NOW - timedelta(hours=2), finished_at=NOW - timedelta(hours=1), outcome="returned"
    )
    old = chain(
        node="node3",
        alert_starts_at=datetime(1970, 1, 1, tzinfo=UTC),
        last_recovery=repaired,
        cooldown=timedelta(0),
    )
    decision = policy.decide(node(), facts(job=None, guards=old))
    assert isinstance(decision, policy.Close) and decision.outcome == IncidentOutcome.IGNORED
    assert [v.guard for v in decision.learned.verdicts][-1] == "stale_signal"


def test_a_node_alert_prometheus_no_longer_fires_is_resolved_not_repaired() -> None:
    decision = policy.decide(node(), facts(job=None, recheck=GONE))
    assert isinstance(decision, policy.Close) and decision.outcome == IncidentOutcome.RESOLVED
    assert decision.learned.recheck == GONE


def test_a_node_incident_waits_for_the_incident_ahead_and_its_budget() -> None:
    ahead = policy.decide(node(), facts(job=None, guards=chain(ahead="incident #3")))
    assert isinstance(ahead, policy.Wait) and ahead.guard is not None and ahead.guard.guard == "serialisation"
    spent = chain(
        attempts=(guards.PastAttempt(NOW - timedelta(hours=1), NOW, "returned"),) * 2, budget_attempts=2
    )
    decision = policy.decide(node(), facts(job=None, guards=spent))
    assert isinstance(decision, policy.Close) and decision.outcome == IncidentOutcome.NEEDS_HUMAN


def test_a_node_incident_not_whitelisted_is_handed_to_its_repair_which_records_the_advisory_plan() -> None:
    decision = policy.decide(node(), facts(job=None, guards=chain(granted_mutating=0)))
    assert isinstance(decision, policy.HandToRepair) and decision.node == "node3"
    assert decision.reason == "GpuXidError: Xid 79"


def test_a_node_incidents_take_out_is_left_to_its_repairs_blast_radius() -> None:
    verdict = guards.blast_radius(
        chain(repair_takes_out=frozenset({"node3"}), taken_out=frozenset({"a", "b", "c"}))
    )
    assert verdict.decision == GuardDecision.PASS and "counted by its repair" in verdict.reason


def test_culprits_are_confirmed_against_the_allocation_and_excluded() -> None:
    outside = replace(XID, node="node9")
    decision = policy.decide(job(culprits=(XID, outside)), facts())
    assert isinstance(decision, policy.StartAttempt)
    assert decision.exclude == ("node2",) and decision.note == "excluding node2"
    learned = decision.learned
    assert [c.confirmed for c in learned.culprits or ()] == [True, False]
    assert (
        learned.culprit_node == "node2"
        and "outside the allocation (evidence only): node9" in learned.culprit_message
    )


def test_too_many_culprits_go_to_a_person() -> None:
    many = tuple(replace(XID, node=f"node{i}") for i in range(1, 4))
    status = JobStatus(JobPhase.DIED, ("node1", "node2", "node3", "node4"), "FAILED")
    decision = policy.decide(job(culprits=many), facts(job=status))
    assert isinstance(decision, policy.Close) and decision.outcome == IncidentOutcome.NEEDS_HUMAN
    assert "exceed the limit" in decision.reason


def test_the_plan_is_asked_for_with_the_exclusion_and_the_job_phase() -> None:
    decision = policy.decide(job(), facts(planned=None))
    assert isinstance(decision, policy.Gather)
    assert (decision.exclude, decision.job_phase) == (("node2",), JobPhase.DIED)
    unknown = policy.decide(job(), facts(planned=None, job=JobUnread("timeout", tries=3)))
    assert isinstance(unknown, policy.Gather) and (unknown.exclude, unknown.job_phase) == (
        (),
        JobPhase.UNKNOWN,
    )


@pytest.mark.parametrize(
    ("tries", "configured", "waits"), [(1, True, True), (2, True, True), (3, True, False), (1, False, False)]
)
def test_an_unread_scheduler_is_asked_again_a_bounded_number_of_times(
    tries: int, configured: bool, waits: bool
) -> None:
    decision = policy.decide(
        job(), facts(job=JobUnread("ssh: timeout", tries=tries, configured=configured), planned=None)
    )
    if waits:
        assert (
            isinstance(decision, policy.Wait)
            and decision.guard is None
            and decision.until == NOW + timedelta(seconds=30)
        )
        assert "will ask again" in (decision.learned.job_unread or "")
    else:
        assert isinstance(decision, policy.Gather) and decision.exclude == ()
        assert "without excluding any node" in (decision.learned.job_unread or "")


def test_explain_without_a_scheduler_assumes_the_culprits_in_an_allocation_of_unknown_size() -> None:
    two = (XID, replace(XID, node="node1"))
    decision = policy.decide(job(culprits=two), facts(job=JobAssumed("no slurm.host")))
    assert isinstance(decision, policy.StartAttempt) and decision.exclude == ("node1", "node2")


def test_a_guard_wait_carries_its_verdict_and_when_to_look_again() -> None:
    paused = chain(paused=True, pause_reason="maintenance", defer=timedelta(seconds=30))
    decision = policy.decide(job(), facts(guards=paused))
    assert isinstance(decision, policy.Wait) and decision.guard is not None
    assert (decision.guard.guard, decision.until) == ("kill_switch", NOW + timedelta(seconds=30))


def test_advisory_records_the_plan_and_the_culprits_repairs() -> None:
    planned = (step(WOULD_RUN),)
    decision = policy.decide(job(), facts(planned=planned, guards=chain(granted_mutating=0)))
    assert isinstance(decision, policy.Close) and decision.advisory
    assert decision.planned == planned and decision.exclude == ("node2",)


def test_the_recheck_failing_waits_never_acts_blind() -> None:
    decision = policy.decide(job(has_recheck=True), facts(recheck=Recheck("up", error="connection refused")))
    assert (
        isinstance(decision, policy.Wait) and decision.guard is not None and decision.guard.guard == "recheck"
    )


def test_a_repair_still_under_way_is_polled() -> None:
    decision = policy.decide(node(state=State.REPAIRING), facts(repair=RepairView(4, RepairState.VALIDATING)))
    assert isinstance(decision, policy.Wait) and decision.guard is None


def test_a_decision_is_a_value() -> None:
    decision = policy.decide(job(), facts())
    assert decision == policy.decide(job(), replace(facts()))


def test_a_recovery_held_by_a_shared_cause_waits_on_the_fleet_hold() -> None:
    decision = policy.decide(job(), facts(fleet=FleetHold(NOW + timedelta(minutes=5))))
    assert (
        isinstance(decision, policy.Wait)
        and decision.elsewhere
        and decision.until == NOW + timedelta(minutes=5)
    )


def test_a_leaf_to_blame_is_excluded_instead_of_its_culprits() -> None:
    leaf = Blame(("node1", "node2", "node3"), "3 jobs failing behind leaf s1: excluding s1's 3 nodes")
    decision = policy.decide(job(), facts(blame=leaf))
    assert isinstance(decision, policy.StartAttempt) and decision.exclude == leaf.nodes
    assert decision.learned.blame == leaf.message
    asked = policy.decide(job(), facts(blame=None))
    assert isinstance(asked, policy.Gather) and asked.exclude == ("node2",)


# -- the job itself at fault; the job's own launcher recovering it ---------------------------------------------------
APP_ERROR = {"category": "application_error", "summary": "ValueError in rank 1"}
GRACE = timedelta(minutes=3)
RUNNING = JobStatus(JobPhase.RUNNING, ("node1", "node2"), "RUNNING")
FAULT = NOW - timedelta(minutes=1)


def relaunchable(**values: Any) -> Subject:
    """A running job's incident whose playbook gives its launcher ``GRACE`` (no node's own alert named a culprit)."""
    return job(**{"culprits": (), "fault_at": FAULT, "self_recovery": GRACE, **values})


@pytest.mark.parametrize(
    "subject",
    [
        job(culprits=(), diagnosis=APP_ERROR),
        job(culprits=(replace(XID, playbook=None),), diagnosis=APP_ERROR),  # named by the diagnosis only
        job(kind=IncidentKind.TARGET, job=None, culprits=(), diagnosis=APP_ERROR),
    ],
)
def test_an_application_error_goes_to_a_person_without_a_restart(subject: Subject) -> None:
    decision = policy.decide(subject, facts())
    assert isinstance(decision, policy.Close) and decision.outcome == IncidentOutcome.NEEDS_HUMAN
    assert "a restart alone will not help" in decision.reason and "ValueError in rank 1" in decision.reason


def test_an_application_error_beside_a_node_s_own_alert_is_recovered_off_that_node() -> None:
    """A GPU fault's alert named the culprit: the tracebacks it caused do not make it the code's fault."""
    decision = policy.decide(job(diagnosis=APP_ERROR), facts())
    assert isinstance(decision, policy.StartAttempt) and decision.exclude == ("node2",)


def test_an_application_error_of_a_job_that_ended_on_purpose_is_completed_not_paged() -> None:
    ended = facts(job=JobStatus(JobPhase.COMPLETED, (), "CANCELLED"))
    decision = policy.decide(job(culprits=(), diagnosis=APP_ERROR), ended)
    assert isinstance(decision, policy.Close) and decision.outcome == IncidentOutcome.COMPLETED


def test_a_running_job_s_progress_is_asked_for_only_when_its_playbook_gives_its_launcher_time() -> None:
    ask = policy.decide(relaunchable(), facts(job=RUNNING))
    assert isinstance(ask, policy.Gather) and ask.need == Need.PROGRESS
    for subject, status in [
        (relaunchable(self_recovery=None), RUNNING),  # the playbook acts at once
        (relaunchable(), facts().job),  # the job died: nothing restarts it but us
        (relaunchable(culprits=(XID,)), RUNNING),  # a node's own alert: restarting on it is futile
    ]:
        decision = policy.decide(subject, facts(job=status))
        assert isinstance(decision, policy.StartAttempt), (subject, decision)


@pytest.mark.parametrize(
    ("progress", "now", "expected", "reason"),
    [
        # Trained over the last minute, all of it after the fault: its launcher brought it back.
        (policy.Progress(now=120, before=80), NOW, IncidentOutcome.SELF_RECOVERED, "step 80 -> 120"),
        # Not yet: the grace runs until three minutes after the fault.
        (policy.Progress(now=80, before=80), NOW, policy.Wait, "until 03:02:00"),
        (
            policy.Progress(),
            NOW,
            policy.Wait,
            "no training step seen after the fault",
        ),  # between a crash and its restart
        (policy.Progress(error="prometheus down"), NOW, policy.Wait, "progress unreadable: prometheus down"),
        # The minute of growth reaches back before the fault: progress of the run that failed, not a restart.
        (
            policy.Progress(now=120, before=80),
            FAULT + timedelta(seconds=30),
            policy.Wait,
            "no training step seen after the fault",
        ),
        # The grace is over and it does not train: recover it.
        (policy.Progress(now=80, before=80), FAULT + GRACE, policy.StartAttempt, "did not train again"),
        (policy.Progress(error="down"), FAULT + GRACE, policy.StartAttempt, "could not be read (down)"),
    ],
)
def test_a_running_job_is_left_to_its_own_launcher_until_the_grace_ends(
    progress: policy.Progress, now: datetime, expected: Any, reason: str
) -> None:
    decision = policy.decide(relaunchable(), facts(now=now, job=RUNNING, progress=progress))
    if isinstance(expected, IncidentOutcome):
        assert isinstance(decision, policy.Close) and decision.outcome == expected
        assert reason in decision.reason
    elif expected is policy.Wait:
        assert isinstance(decision, policy.Wait) and reason in decision.reason
        assert decision.until == FAULT + GRACE and not decision.correlating
    else:
        assert isinstance(decision, expected) and reason in decision.learned.progress


def test_a_fault_dated_in_the_future_counts_from_now() -> None:
    decision = policy.decide(
        relaunchable(fault_at=NOW + timedelta(days=1)), facts(job=RUNNING, progress=policy.Progress())
    )
    assert isinstance(decision, policy.Wait) and decision.until == NOW + GRACE
