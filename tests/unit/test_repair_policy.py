"""The node repair lifecycle's decisions as pure functions: each step's outcome, bounds, lemon rule, operator."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.domain import repair_policy as policy
from app.domain.repair_policy import RETURN, TAKE_OUT, VALIDATE, Limits, Result
from app.domain.states import RepairState, StepStatus
from tests.fakes import START

OK = Result(StepStatus.OK)
LIMITS = Limits(retry_limit=2, lemon_repairs=3, lemon_window=timedelta(days=7))


def after(step: str, result: Result, **kw: object) -> policy.Next:
    options: dict[str, object] = {"now": START, "repair_steps": 1, "retries": 0, "limits": LIMITS}
    options.update(kw)
    return policy.after_step(step, result, **options)  # type: ignore[arg-type]


def test_happy_path_take_out_repair_validate_return():
    taken = after(TAKE_OUT, OK, repair_steps=2)
    assert (taken.state, taken.step, taken.taken_out) == (RepairState.REPAIRING, "repair:0", True)
    assert after("repair:0", OK, repair_steps=2).step == "repair:1"
    done = after("repair:1", OK, repair_steps=2)
    assert (done.state, done.step) == (RepairState.VALIDATING, VALIDATE)
    valid = after(VALIDATE, OK)
    assert (valid.state, valid.step) == (RepairState.RETURNING, RETURN)
    back = after(RETURN, OK)
    assert (back.state, back.step, back.settled) == (RepairState.RETURNED, None, True)


def test_no_repair_steps_goes_straight_to_validation():
    assert after(TAKE_OUT, OK, repair_steps=0).state == RepairState.VALIDATING


def test_someone_elses_take_out_is_never_ours():
    foreign = after(TAKE_OUT, Result(StepStatus.OK, reason="drained by alice: disk", changed=False))
    assert foreign.state == RepairState.NOT_OURS and not foreign.taken_out
    assert "drained by alice" in foreign.note


def test_a_node_no_longer_ours_at_return_is_left_alone():
    gone = after(RETURN, Result(StepStatus.OK, reason="cordoned by bob", changed=False))
    assert gone.state == RepairState.NOT_OURS


def test_validation_failure_and_timeout_hold_the_node():
    failed = after(VALIDATE, Result(StepStatus.FAILED, reason="dcgmi diag exited 226"))
    assert (failed.state, failed.held_reason) == (
        RepairState.HELD,
        "validation failed: dcgmi diag exited 226",
    )
    timed_out = after(VALIDATE, Result(StepStatus.FAILED, reason="timed out after 900s: counts as failed"))
    assert timed_out.state == RepairState.HELD


def test_waiting_for_the_node_is_bounded_by_the_deadline_not_a_count():
    deadline = START + timedelta(minutes=30)
    rebooting = Result(StepStatus.RETRY, reason="node1 is rebooting", after=15)
    wait = after(VALIDATE, rebooting, retries=50, deadline=deadline)
    assert (wait.state, wait.run_at) == (RepairState.VALIDATING, START + timedelta(seconds=15))
    # The last look is at the deadline, never past it.
    near = after(VALIDATE, rebooting, now=deadline - timedelta(seconds=5), deadline=deadline)
    assert near.run_at == deadline
    late = after(VALIDATE, rebooting, now=deadline, deadline=deadline)
    assert late.state == RepairState.HELD and "not back and validated" in (late.held_reason or "")


def test_other_steps_retry_a_bounded_number_of_times():
    busy = Result(StepStatus.RETRY, reason="slurmctld busy", after=0)
    again = after(TAKE_OUT, busy, retries=1)
    assert (again.state, again.step, again.run_at) == (
        RepairState.TAKING_OUT,
        TAKE_OUT,
        START + timedelta(seconds=1),
    )
    assert after(TAKE_OUT, busy, retries=2).state == RepairState.HELD


@pytest.mark.parametrize("status", [StepStatus.FAILED, StepStatus.AMBIGUOUS, StepStatus.CREDENTIAL_ERROR])
def test_any_failed_step_holds_the_node(status: StepStatus):
    for step in (TAKE_OUT, "repair:0", RETURN):
        assert after(step, Result(status, reason="boom")).state == RepairState.HELD


def test_lemon_rule_holds_after_taking_the_node_out():
    assert policy.lemon_reason(2, LIMITS) is None
    reason = policy.lemon_reason(3, LIMITS)
    assert reason == "lemon node: repaired 3 time(s) in the last 7d (limit 3); held instead of repaired again"
    lemon = after(TAKE_OUT, OK, lemon=reason)
    assert (lemon.state, lemon.taken_out, lemon.held_reason) == (RepairState.HELD, True, reason)


def test_a_step_in_flight_at_a_crash_is_held_except_validation():
    assert policy.in_flight("repair:0", StepStatus.RUNNING).state == RepairState.HELD  # type: ignore[union-attr]
    assert policy.in_flight(TAKE_OUT, StepStatus.RUNNING) is not None
    assert policy.in_flight(RETURN, StepStatus.RUNNING) is not None
    assert policy.in_flight(VALIDATE, StepStatus.RUNNING) is None  # only a check: it runs again
    assert policy.in_flight("repair:0", StepStatus.PENDING) is None
    assert policy.in_flight(None, None) is None


def test_operator_release_and_hold():
    ours = policy.release(RepairState.HELD, taken_out_by_us=True, by="alice")
    assert (ours.state, ours.step) == (RepairState.RETURNING, RETURN)
    assert policy.release(RepairState.HELD, taken_out_by_us=False, by="alice").state == RepairState.RELEASED
    with pytest.raises(ValueError, match="not held"):
        policy.release(RepairState.VALIDATING, taken_out_by_us=True, by="alice")
    hold = policy.hold(RepairState.VALIDATING, by="bob", note="bad fan")
    assert (hold.state, hold.held_reason) == (RepairState.HELD, "held by bob: bad fan")
    assert policy.hold(None, by="bob", note="").held_reason == "held by bob"
    with pytest.raises(ValueError, match="already held"):
        policy.hold(RepairState.HELD, by="bob", note="")
    # A released node's return settles as released, not returned.
    assert after(RETURN, OK, released_by="alice").state == RepairState.RELEASED


def test_plan_problems():
    assert policy.plan_problem([("drain", "pending", ""), ("resume", "pending", "")]) is None
    state, reason = policy.plan_problem(
        [("drain", "would_run", "no grant"), ("resume", "would_run", "")]
    ) or ("", "")
    assert state == RepairState.ADVISORY and "drain, resume" in reason
    invalid = policy.plan_problem([("drain", "invalid", "node 'ALL' refused"), ("x", "would_run", "")])
    assert invalid == (RepairState.HELD, "step drain: node 'ALL' refused")


def test_unknown_step_is_held():
    assert after("bogus", OK).state == RepairState.HELD
