"""The vocabulary of the lifecycles, declared once: incident states and outcomes, step statuses, node-repair states.

Each is a ``StrEnum``: members compare equal to their string values, so rows read back from the store (plain strings)
compare with members directly, and JSON serialisation writes the value. Pure: no I/O.
"""

from __future__ import annotations

from enum import StrEnum


class IncidentKind(StrEnum):
    """What an incident is about: one training job (all its ranks' and nodes' alerts), one node, or one alert target."""

    JOB = "job"  # a failure episode of one training job: one diagnosis, one recovery, culprit nodes excluded
    NODE = "node"  # a node-scoped fault on a node that runs no job: repaired through the node lifecycle
    TARGET = "target"  # neither job nor node identity: keyed by (playbook, target) as before


class State(StrEnum):
    """Where an open incident is; a closed incident's state is its :class:`Outcome`."""

    OPEN = "open"
    DIAGNOSING = "diagnosing"
    WAITING = "waiting"  # held by a guard, backing off, or inside the correlation window
    ACTING = "acting"
    VERIFYING = "verifying"
    WAITING_FOR_RESOURCES = "waiting_for_resources"  # requeued; the scheduler has not started it yet
    REPAIRING = "repairing"  # a node incident whose node is in the repair lifecycle


class Outcome(StrEnum):
    """How an incident closed."""

    RECOVERED = "recovered"
    ADVISORY = "advisory"
    NEEDS_HUMAN = "needs_human"
    FAILED = "failed"
    CREDENTIAL_ERROR = "credential_error"
    UNVERIFIED = "unverified"
    BLOCKED = "blocked"
    RESOLVED = "resolved"
    IGNORED = "ignored"
    HANDLED = "handled"
    BENIGN = "benign"  # the diagnosis found no fault to act on
    COMPLETED = "completed"  # the scheduler says the job ended (done, cancelled, time limit): nothing to do
    SELF_RECOVERED = (
        "self_recovered"  # the job's own launcher restarted it and it trains again: nothing to do
    )


class UndoState(StrEnum):
    """A closed incident's ``on_resolved`` steps: owed once its alert resolves after it acted, then done."""

    PENDING = "pending"
    DONE = "done"


# States in which nothing has been done to the target yet: a resolved alert may still close the incident.
NOT_ACTED = frozenset({State.OPEN, State.DIAGNOSING, State.WAITING})


class StepStatus(StrEnum):
    PENDING = "pending"  # will run
    RUNNING = "running"  # marked before the action starts: found so by a later claimer, it is ambiguous
    OK = "ok"
    FAILED = "failed"
    RETRY = "retry"
    AMBIGUOUS = "ambiguous"
    CREDENTIAL_ERROR = "credential_error"
    WOULD_RUN = "would_run"  # not whitelisted: recorded only
    SKIPPED = "skipped"  # its ``when:`` did not hold
    INVALID = "invalid"  # a rendered value failed the action's schema; never passed on
    AWAITING_APPROVAL = "awaiting_approval"


DONE_STEP_STATUSES = frozenset({StepStatus.OK, StepStatus.WOULD_RUN, StepStatus.SKIPPED})


class AttemptOutcome(StrEnum):
    RECOVERED = "recovered"
    FAILED = "failed"
    NEEDS_HUMAN = "needs_human"
    UNVERIFIED = "unverified"
    CREDENTIAL_ERROR = "credential_error"
    HANDLED = "handled"
    ABANDONED = "abandoned"  # the incident closed (resolved, operator) while the attempt had no outcome


class RepairState(StrEnum):
    """A node's way through repair: taken out by us → repaired → validated → returned, or held for a person."""

    REQUESTED = "requested"
    TAKING_OUT = "taking_out"
    REPAIRING = "repairing"
    VALIDATING = "validating"
    RETURNING = "returning"  # validated, or released by an operator: the return to service is due
    RETURNED = "returned"  # back in service (we resumed/uncordoned what we took out)
    HELD = "held"  # out of service until a person releases it
    ADVISORY = "advisory"  # not whitelisted: the plan was recorded, nothing done
    RELEASED = "released"  # an operator released a held node
    NOT_OURS = "not_ours"  # someone else had taken the node out: we never put it back


# The worker has nothing more to do (a held node waits for a person).
REPAIR_SETTLED = frozenset(
    {RepairState.RETURNED, RepairState.HELD, RepairState.ADVISORY, RepairState.RELEASED, RepairState.NOT_OURS}
)
# The node is out of service or on its way through repair: one such record per node (its open key).
REPAIR_OPEN = frozenset(
    {
        RepairState.REQUESTED,
        RepairState.TAKING_OUT,
        RepairState.REPAIRING,
        RepairState.VALIDATING,
        RepairState.RETURNING,
        RepairState.HELD,
    }
)
