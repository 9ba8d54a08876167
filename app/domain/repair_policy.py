"""What comes next for a node repair: pure decisions over its state, a step's result, the clock and settings.

The lifecycle of one repair (app/engine/repair.py sequences the I/O, one transaction per transition)::

    requested --(guards pass)--> taking_out --(ours)--> repairing --> validating --(pass)--> returning --> returned
                                     |  (someone else's) -> not_ours          |  (fail, timeout,    |
                                     |  (lemon) -> held                       |   not back in time) |  (no longer
                                     v                                        v                     v   ours) not_ours
                                   held  <------------- any step failed / found in flight ---------  held
    held --(operator release)--> returning (taken out by us) | released (nothing of ours to undo)

Nothing here reads the store, the clock or a backend: every input is a value. No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.domain.guards import human_duration
from app.domain.states import REPAIR_OPEN, RepairState, StepStatus

TAKE_OUT, VALIDATE, RETURN = "take_out", "validate", "return"
REPAIR_PREFIX = "repair:"


def repair_step(index: int) -> str:
    """The step marker of the playbook's ``index``-th repair step."""
    return f"{REPAIR_PREFIX}{index}"


def repair_index(step: str) -> int | None:
    """The index of a ``repair:<i>`` marker; None for the other steps."""
    if not step.startswith(REPAIR_PREFIX):
        return None
    return int(step.removeprefix(REPAIR_PREFIX))


@dataclass(frozen=True)
class Result:
    """One run of a step, as the policy needs it (the engine builds it from an :class:`app.domain.outcome.Outcome`).

    ``changed``: whether the run changed the node (take-out: drained/cordoned it now or earlier by us; return:
    resumed/uncordoned it). ``False`` means the node carried someone else's mark, or none of ours.
    """

    status: StepStatus
    reason: str = ""
    after: float = 0.0  # a Retry's wait, seconds
    changed: bool = True


@dataclass(frozen=True)
class Next:
    """Where the repair goes: its next state and step (None once settled), when to look again, and why."""

    state: RepairState
    step: str | None
    note: str
    run_at: datetime | None = None
    held_reason: str | None = None
    taken_out: bool = False  # the take-out step has just taken the node out

    @property
    def settled(self) -> bool:
        return self.state not in REPAIR_OPEN or self.state == RepairState.HELD


@dataclass(frozen=True)
class Limits:
    """The bounds a repair runs under (from settings)."""

    retry_limit: int = 5  # Retry outcomes of one step before it counts as failed (worker.step_retry_limit)
    lemon_repairs: int = 3
    lemon_window: timedelta = timedelta(days=7)


def held(reason: str) -> Next:
    return Next(RepairState.HELD, None, f"held: {reason}", held_reason=reason)


def lemon_reason(earlier_repairs: int, limits: Limits) -> str | None:
    """Why the node is held instead of repaired again (the lemon rule), or None when it may be repaired."""
    if earlier_repairs < limits.lemon_repairs:
        return None
    return (
        f"lemon node: repaired {earlier_repairs} time(s) in the last {human_duration(limits.lemon_window)} "
        f"(limit {limits.lemon_repairs}); held instead of repaired again"
    )


def first_after_take_out(repair_steps: int) -> str:
    """The step that follows a successful take-out: the first repair step, or validation when there is none."""
    return repair_step(0) if repair_steps else VALIDATE


def after_step(
    step: str,
    result: Result,
    *,
    now: datetime,
    repair_steps: int,
    retries: int,
    limits: Limits,
    deadline: datetime | None = None,
    lemon: str | None = None,
    released_by: str | None = None,
) -> Next:
    """The transition that follows one run of ``step`` with ``result``.

    ``repair_steps``: how many repair steps the playbook has; ``retries``: Retry outcomes of this step so far;
    ``deadline``: when a node still not back (or not yet validated) is held; ``lemon``: the lemon rule's reason,
    applied once the node is out; ``released_by``: the operator who released a held node (its return then
    settles as ``released``).
    """
    if result.status == StepStatus.RETRY:
        return _retry(step, result, now=now, retries=retries, limits=limits, deadline=deadline)
    if step == TAKE_OUT:
        return _after_take_out(result, repair_steps=repair_steps, lemon=lemon)
    if step == VALIDATE:
        if result.status == StepStatus.OK:
            return Next(RepairState.RETURNING, RETURN, "validation passed: returning the node to service")
        return held(f"validation failed: {result.reason}")
    if step == RETURN:
        if result.status != StepStatus.OK:
            return held(f"return to service failed: {result.reason}")
        if not result.changed:
            return Next(
                RepairState.NOT_OURS,
                None,
                f"not returned: the node no longer carries our mark ({result.reason or 'changed by someone else'})",
            )
        if released_by:
            return Next(RepairState.RELEASED, None, f"released by {released_by}: node back in service")
        return Next(RepairState.RETURNED, None, "node back in service")
    index = repair_index(step)
    if index is None:
        return held(f"unknown step {step!r}")
    if result.status != StepStatus.OK:
        return held(f"repair step {index + 1} failed: {result.reason}")
    if index + 1 < repair_steps:
        return Next(RepairState.REPAIRING, repair_step(index + 1), f"repair step {index + 1} done")
    return Next(RepairState.VALIDATING, VALIDATE, "repair done: validating the node")


def _after_take_out(result: Result, *, repair_steps: int, lemon: str | None) -> Next:
    if result.status != StepStatus.OK:
        return held(f"take-out failed: {result.reason}")
    if not result.changed:
        return Next(
            RepairState.NOT_OURS,
            None,
            f"someone else had taken the node out ({result.reason or 'not our mark'}): never touched again",
        )
    if lemon is not None:
        return Next(RepairState.HELD, None, f"taken out; {lemon}", held_reason=lemon, taken_out=True)
    step = first_after_take_out(repair_steps)
    state = RepairState.VALIDATING if step == VALIDATE else RepairState.REPAIRING
    return Next(state, step, "taken out of service", taken_out=True)


def _retry(
    step: str, result: Result, *, now: datetime, retries: int, limits: Limits, deadline: datetime | None
) -> Next:
    """Not yet (a rebooting node, a validation pod still running, a busy backend): look again, within bounds."""
    state = state_for_step(step)
    if step == VALIDATE:
        # Waiting for the node to come back is bounded by the deadline, not by a count.
        if deadline is not None and now >= deadline:
            return held(f"node not back and validated by {deadline.isoformat()}: {result.reason}")
    elif retries >= limits.retry_limit:
        return held(f"step {step} still not done after {retries} retries: {result.reason}")
    run_at = now + timedelta(seconds=max(result.after, 1.0))
    if deadline is not None and step == VALIDATE:
        run_at = min(run_at, deadline)
    return Next(
        state, step, f"{step}: not yet ({result.reason}); again at {run_at.isoformat()}", run_at=run_at
    )


def state_for_step(step: str) -> RepairState:
    """The repair state in which ``step`` runs."""
    if step == TAKE_OUT:
        return RepairState.TAKING_OUT
    if step == VALIDATE:
        return RepairState.VALIDATING
    if step == RETURN:
        return RepairState.RETURNING
    return RepairState.REPAIRING


def in_flight(step: str | None, step_status: str | None) -> Next | None:
    """A step a dead worker left ``running``: validation is only a check and runs again; any other step may have
    changed the node, so the repair is held for a person (never re-run blind). None when nothing was in flight."""
    if step is None or step_status != StepStatus.RUNNING or step == VALIDATE:
        return None
    return held(f"step {step} was in flight when its worker stopped: outcome unknown, not re-run")


def release(state: RepairState, taken_out_by_us: bool, by: str) -> Next:
    """An operator releases a held node: what we took out is returned by the worker; otherwise nothing to do.

    Raises ValueError for a repair that is not held."""
    if state != RepairState.HELD:
        raise ValueError(f"the repair is {state}, not held")
    if taken_out_by_us:
        return Next(RepairState.RETURNING, RETURN, f"released by {by}: returning the node to service")
    return Next(RepairState.RELEASED, None, f"released by {by}: nothing of ours to undo")


def hold(state: RepairState | None, by: str, note: str) -> Next:
    """An operator holds a node: an open repair stops where it is (the node stays as it is now); a node with no
    open repair gets a held record, so that no later request repairs or returns it until released.

    Raises ValueError for a node already held."""
    if state == RepairState.HELD:
        raise ValueError("the node is already held")
    reason = f"held by {by}" + (f": {note}" if note else "")
    return held(reason)


def plan_problem(statuses: Sequence[tuple[str, str, str]]) -> tuple[RepairState, str] | None:
    """Whether a repair's plan (``(name, status, reason)`` per step, take-out to return) can run: a step whose
    values fail its action's schema holds the node for a person; a step not whitelisted makes the repair advisory
    (its plan recorded, nothing done). None when every step will run."""
    for name, status, reason in statuses:
        if status == StepStatus.INVALID:
            return RepairState.HELD, f"step {name}: {reason}"
    ungranted = [name for name, status, _ in statuses if status == StepStatus.WOULD_RUN]
    if ungranted:
        return RepairState.ADVISORY, f"not whitelisted: {', '.join(ungranted)}; plan recorded, nothing done"
    return None
