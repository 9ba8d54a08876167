"""The vocabulary of the lifecycles, declared once: incident states and outcomes, step statuses, node-repair states,
guards and their verdicts, ledger kinds and notice kinds.

Each is a ``StrEnum`` (``@unique``: no value named twice): members compare equal to their string values, so rows read
back from the store (plain strings) compare with members directly, and JSON serialisation writes the value. Pure: no
I/O.
"""

from __future__ import annotations

from enum import StrEnum, unique


@unique
class IncidentKind(StrEnum):
    """What an incident is about: one training job (all its ranks' and nodes' alerts), one node, or one alert target."""

    JOB = "job"  # a failure episode of one training job: one diagnosis, one recovery, culprit nodes excluded
    NODE = "node"  # a node-scoped fault on a node that runs no job: repaired through the node lifecycle
    TARGET = "target"  # neither job nor node identity: keyed by (playbook, target) as before


@unique
class State(StrEnum):
    """Where an open incident is; a closed incident's state is its :class:`IncidentOutcome`."""

    OPEN = "open"
    DIAGNOSING = "diagnosing"
    WAITING = "waiting"  # held by a guard, backing off, or inside the correlation window
    ACTING = "acting"
    VERIFYING = "verifying"
    WAITING_FOR_RESOURCES = "waiting_for_resources"  # requeued; the scheduler has not started it yet
    REPAIRING = "repairing"  # a node incident whose node is in the repair lifecycle


@unique
class IncidentOutcome(StrEnum):
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


@unique
class Guard(StrEnum):
    """The guards of the chain (app/domain/guards.py), in its order; the live re-check is the engine's last."""

    KILL_SWITCH = "kill_switch"
    PERMISSION = "permission"
    BLAST_RADIUS = "blast_radius"
    SERIALISATION = "serialisation"
    BUDGET = "budget"
    JOB_BUDGET = "job_budget"
    COOLDOWN = "cooldown"
    STALE_SIGNAL = "stale_signal"
    RECHECK = "recheck"


@unique
class GuardDecision(StrEnum):
    """A guard's verdict (app/domain/guards.py): go on to the next guard, hold the incident until the verdict's
    ``until`` (re-decided then), or stop it with the verdict's outcome."""

    PASS = "pass"
    WAIT = "wait"
    STOP = "stop"


@unique
class UndoState(StrEnum):
    """A closed incident's ``on_resolved`` steps: owed once its alert resolves after it acted, then done."""

    PENDING = "pending"
    DONE = "done"


# States in which nothing has been done to the target yet: a resolved alert may still close the incident.
NOT_ACTED = frozenset({State.OPEN, State.DIAGNOSING, State.WAITING})


@unique
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


@unique
class AttemptOutcome(StrEnum):
    RECOVERED = "recovered"
    FAILED = "failed"
    NEEDS_HUMAN = "needs_human"
    UNVERIFIED = "unverified"
    CREDENTIAL_ERROR = "credential_error"
    HANDLED = "handled"
    ABANDONED = "abandoned"  # the incident closed (resolved, operator) while the attempt had no outcome


@unique
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


@unique
class LedgerKind(StrEnum):
    """What a ledger row records (the audit trail: ``GET /api/v1/incidents/<id>``, ``nightshift export``)."""

    # alerts in, incidents opened and joined
    ALERT_RECEIVED = "alert_received"
    ALERT_OUT_OF_ORDER = "alert_out_of_order"  # a firing copy after its instance resolved: ignored
    UNMATCHED = "unmatched"  # no playbook matches
    TARGET_INVALID = "target_invalid"  # a rendered target value failed its pattern: no incident
    ALERT_ABSORBED = "alert_absorbed"  # evidence for a node already in repair
    INCIDENT_OPENED = "incident_opened"
    ALERT_ATTACHED = "alert_attached"
    ALERT_RESOLVED = "alert_resolved"
    INBOX_FAILED = "inbox_failed"  # a notification set aside
    INBOX_RETRY = "inbox_retry"  # set-aside notifications queued again (nightshift inbox --retry)
    # deciding
    DIAGNOSIS = "diagnosis"
    CULPRITS = "culprits"  # culprits checked against the job's allocation
    CULPRIT_EXCLUDED_ONLY = "culprit_excluded_only"  # a straggler excluded, not repaired (yet)
    BLAME = "blame"  # a leaf/rack/block blamed instead of its nodes
    JOB_STATUS_UNKNOWN = "job_status_unknown"  # the scheduler could not say what the job does
    JOB_STATUS_ERROR = "job_status_error"
    SELF_RECOVERY = "self_recovery"  # the job's own launcher is left to recover it
    STEP_INVALID = "step_invalid"
    STEP_WOULD_RUN = "step_would_run"
    STEP_SKIPPED = "step_skipped"
    GUARD = "guard"  # a guard's verdict
    RECHECK = "recheck"  # the live re-check's samples
    # acting and verifying
    ATTEMPT_STARTED = "attempt_started"
    STEP = "step"  # a step's outcome, command and output
    STEP_AMBIGUOUS = "step_ambiguous"  # found running after its worker stopped
    APPROVAL_REQUESTED = "approval_requested"
    APPROVED = "approved"
    VERIFYING = "verifying"
    VERIFY_SAMPLE = "verify_sample"
    WAITING_FOR_RESOURCES = "waiting_for_resources"
    ATTEMPT_FAILED = "attempt_failed"
    INCIDENT_CLOSED = "incident_closed"
    ENGINE_ERROR = "engine_error"  # a tick raised
    ON_RESOLVED_SCHEDULED = "on_resolved_scheduled"
    # what an action reports while it runs (ActionContext.record)
    VALIDATION_STARTED = "validation_started"
    VALIDATION_POD = "validation_pod"
    CHECKPOINT_POLL = "checkpoint_poll"
    JOB_RECREATED = "job_recreated"
    JOB_SUSPENDED = "job_suspended"
    JOB_RESUMED = "job_resumed"
    JOB_DELETED = "job_deleted"
    POLL_FAILED = "poll_failed"
    ROLLBACK_JOB = "rollback_job"  # a checkpoint rollback Job created, finished, deleted (Kubernetes)
    # effects owed around an incident
    ANNOTATION = "annotation"
    ANNOTATION_ERROR = "annotation_error"
    NOTIFICATION = "notification"
    FINALIZE_RETRY = "finalize_retry"
    # fleet incidents (app/engine/fleet_hold.py)
    FLEET_WAIT = "fleet_wait"
    FLEET_HOLD = "fleet_hold"
    FLEET_STORM = "fleet_storm"
    FLEET_INCIDENT = "fleet_incident"
    FLEET_CLEARED = "fleet_cleared"
    FLEET_PROBE = "fleet_probe"  # a held job restarted alone to test the shared cause
    FLEET_PROBE_FAILED = "fleet_probe_failed"  # it failed again: the cause persists
    FLEET_TOPOLOGY = "fleet_topology"  # the topology could not be read, or was refused
    # node repairs
    REPAIR_REQUESTED = "repair_requested"
    REPAIR_ABSORBED = "repair_absorbed"
    REPAIR_PLAN = "repair_plan"
    REPAIR_STARTED = "repair_started"
    REPAIR_STEP = "repair_step"
    REPAIR_RETRY = "repair_retry"
    REPAIR_HELD = "repair_held"
    REPAIR_RELEASED = "repair_released"
    REPAIR_AMBIGUOUS = "repair_ambiguous"
    # operators and housekeeping
    PAUSE = "pause"
    RESUME = "resume"
    RETENTION = "retention"
    RETENTION_EXPORT_FAILED = "retention_export_failed"


@unique
class NoticeKind(StrEnum):
    """What a notice to people is about (app/domain/paging.py): it decides whether, and how, it pages."""

    OUTCOME = "outcome"  # an incident closed: its outcome and plan (pages when a person is needed)
    NODE_HELD = "node_held"  # a node out of service, held for a person (pages)
    NODE_NOT_TAKEN_OUT = "node_not_taken_out"  # a repair held before it took its node out (evidence, no page)
    UNMATCHED_ALERT = "unmatched_alert"  # no playbook matches an alert (pages)
    BLAST_RADIUS = "blast_radius"  # destructive actions paused (pages)
    APPROVAL = "approval"  # a step waits for an operator's approval (pages)
    FLEET_INCIDENT = (
        "fleet_incident"  # a shared cause holds job recoveries (pages as its incident's needs_human)
    )
    FLEET_STORM = (
        "fleet_storm"  # the fleet's restart storm guard tripped (pages as its incident's needs_human)
    )
