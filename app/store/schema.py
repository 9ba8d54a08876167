"""Tables (SQLAlchemy 2 Core), the same on SQLite and PostgreSQL. Bump SCHEMA_VERSION with every change."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)

from app.domain.culprits import Culprit

# 2: the inbox; 3: job episodes (incident columns) and node repairs; 4: ui_sessions; 5: inbox lane, inbox_alerts;
# 6: node_repairs.tick_errors; 7: the incidents' retry counters (finalize_tries, job_status_tries, delivered);
# 8: job_exclusions; 9: poked (incidents, node_repairs); 10: ix_inbox_queue; 11: ix_inbox_backlog;
# 12: inbox_counter (the backlog's counter)
SCHEMA_VERSION = 12

# Columns added to existing tables since version 2, by the version that added them: an older store gets them with
# ALTER TABLE ... ADD COLUMN (each nullable or with a server default), new tables come from create_all.
ADDED_COLUMNS: dict[int, tuple[tuple[str, str], ...]] = {
    3: (
        ("incidents", "kind"),
        ("incidents", "culprits"),
        ("incidents", "act_after"),
        ("incidents", "tick_errors"),
        ("incidents", "verify_from"),
    ),
    5: (("inbox", "lane"),),
    6: (("node_repairs", "tick_errors"),),
    7: (("incidents", "finalize_tries"), ("incidents", "job_status_tries"), ("incidents", "delivered")),
    9: (("incidents", "poked"), ("node_repairs", "poked")),
}

# Indexes added to existing tables since version 9, by the version that added them (created where missing).
ADDED_INDEXES: dict[int, tuple[str, ...]] = {10: ("ix_inbox_queue",), 11: ("ix_inbox_backlog",)}


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every backend (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Culprits(TypeDecorator[tuple[Culprit, ...]]):
    """An incident's culprits in and out (:class:`app.domain.culprits.Culprit`), a JSON list of objects in the
    column as every version wrote it; NULL (a row from before version 3) reads as none."""

    impl = JSON
    cache_ok = True

    def process_bind_param(
        self, value: Sequence[Culprit] | None, dialect: Any
    ) -> list[dict[str, Any]] | None:
        return None if value is None else [c.to_json() for c in value]

    def process_result_value(self, value: list[dict[str, Any]] | None, dialect: Any) -> tuple[Culprit, ...]:
        return tuple(Culprit.from_json(c) for c in value or ())


metadata = MetaData()

# NEVER_REUSED: ids people and tools see (incident, alert, step and repair ids, ledger ids that `nightshift export
# --after-id` resumes from) are never given twice. Without AUTOINCREMENT, SQLite numbers a new row after the highest
# id present, so a retention pass that deleted a table's newest rows would hand their ids out again. Stores created
# before this keep their tables as they were (docs/reliability.md, "Retention"); PostgreSQL's sequences never reuse.

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", UtcDateTime, nullable=False),
)

# Notifications as received, committed before the webhook answers 200; the worker ingests them alert by alert
# (``next_alert`` counts those done, in the same transactions) and deletes the row once all are in. A row whose
# ingestion raised is kept with ``failed_at`` and ``error`` and skipped, so one bad body cannot stall the rest.
# ``lane``: 0 for a notification carrying a firing alert the store had not seen when it arrived, 1 for pure repeats;
# the worker takes lane 0 first, so a new alert never waits behind a flood of repeats (app/engine/inbox.py).
inbox = Table(
    "inbox",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("received_at", UtcDateTime, nullable=False),
    Column("receiver", Text, nullable=False, default=""),
    Column("alert_count", Integer, nullable=False),
    Column("next_alert", Integer, nullable=False, default=0),
    Column("body", Text, nullable=False),
    Column("failed_at", UtcDateTime),
    Column("error", Text),
    Column("lane", Integer, nullable=False, default=0, server_default="0"),
    sqlite_autoincrement=True,  # ids never reused: the ledger names them
)
# The queue's order (pending, new alerts first, oldest first): the worker's next batch and the prefetch's peek are
# one index seek, not a sort of every queued notification (a 10,000-node storm queues thousands of them).
Index("ix_inbox_queue", inbox.c.failed_at, inbox.c.lane, inbox.c.id)
# The backlog summed from the queue (when its counter below is created, and by the tests that check the counter):
# from this index alone, never from the rows, whose first page each holds a notification's body.
Index("ix_inbox_backlog", inbox.c.failed_at, inbox.c.alert_count, inbox.c.next_alert)

# The alerts queued and not yet ingested (set-aside notifications not counted): the backlog the webhook checks on
# every accept (app/engine/inbox.py). One row (id 1), changed in the transactions that change the queue
# (app/store/records.py); summing the queue on every accept was quadratic in a storm (a 10,000-node storm queues
# 10,000 notifications). Created with the sum of what is queued when a store gets it.
inbox_counter = Table(
    "inbox_counter",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("alerts", Integer, nullable=False),
)

# The new firing alert instances of queued lane-0 notifications, kept while they wait (deleted with their inbox
# row): Alertmanager re-sending the same group before the worker got to it is a repeat, not new alerts.
inbox_alerts = Table(
    "inbox_alerts",
    metadata,
    Column("inbox_id", Integer, primary_key=True),
    Column("fingerprint", String(16), primary_key=True),
    Column("starts_at", UtcDateTime, primary_key=True),
)
Index("ix_inbox_alerts_fingerprint", inbox_alerts.c.fingerprint)

# One row per alert instance: Alertmanager's fingerprint (a hash of the label set) plus startsAt (a re-fire).
alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("fingerprint", String(16), nullable=False),
    Column("starts_at", UtcDateTime, nullable=False),
    Column("status", String(16), nullable=False),
    Column("ends_at", UtcDateTime),
    Column("alertname", String(200), nullable=False),
    Column("labels", JSON, nullable=False),
    Column("annotations", JSON, nullable=False),
    Column("generator_url", Text, nullable=False, default=""),
    Column("receiver", Text, nullable=False, default=""),
    Column("group_key", Text, nullable=False, default=""),
    Column("first_received_at", UtcDateTime, nullable=False),
    Column("last_received_at", UtcDateTime, nullable=False),
    Column("notifications", Integer, nullable=False, default=1),
    UniqueConstraint("fingerprint", "starts_at", name="uq_alert_instance"),
    sqlite_autoincrement=True,  # AUTOINCREMENT: see NEVER_REUSED
)

incidents = Table(
    "incidents",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("playbook", String(200), nullable=False),
    Column("target_key", Text, nullable=False),
    Column("target", JSON, nullable=False),
    Column("node", String(255)),
    Column("job", String(255)),
    # app.domain.states.IncidentKind: a job's failure episode, a node's fault, or one (playbook, target).
    Column("kind", String(16), nullable=False, default="target", server_default="target"),
    # Job incidents: the nodes named as culprits, each {node, source, reason, playbook, confirmed}; confirmed = in
    # the job's allocation (only confirmed culprits are excluded and repaired). A node incident's one culprit is its
    # node, {node, source, reason, confirmed, repair_id}: the repair it was handed to.
    Column("culprits", Culprits),
    # End of the correlation window: no action before it, unless a culprit is known.
    Column("act_after", UtcDateTime),
    # Consecutive failed ticks; at worker.max_tick_errors the incident goes to a person.
    Column("tick_errors", Integer, nullable=False, default=0, server_default="0"),
    # Failed reads of the job's allocation (app.domain.incident_policy.ALLOCATION_TRIES).
    Column("job_status_tries", Integer, nullable=False, default=0, server_default="0"),
    # Finalisations retried (app.engine.effects.FINALIZE_TRIES), and the channels that delivered the outcome notice.
    Column("finalize_tries", Integer, nullable=False, default=0, server_default="0"),
    Column("delivered", JSON),
    # Verification counts only samples after this (the action, or the job running again).
    Column("verify_from", UtcDateTime),
    # Set while the incident is open, NULL once closed: the unique constraint makes (playbook, target) idempotent
    # across workers and replicas (NULLs never collide on SQLite or PostgreSQL).
    Column("open_key", Text, unique=True),
    Column("serialize_key", Text),
    Column("state", String(32), nullable=False),
    Column("outcome", String(32)),
    Column("reason", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False),
    Column("annotations", JSON, nullable=False),
    Column("alert_starts_at", UtcDateTime, nullable=False),
    Column("generator_url", Text, nullable=False, default=""),
    Column("diagnosis", JSON),
    Column("attempt", Integer, nullable=False, default=0),
    Column("acted", Boolean, nullable=False, default=False),
    Column("held_by_guard", Boolean, nullable=False, default=False),
    Column("alert_resolved", Boolean, nullable=False, default=False),
    Column("on_resolved_state", String(16)),  # NULL | pending | done
    Column(
        "finalize_pending", Boolean, nullable=False, default=False
    ),  # annotation close + notification owed
    Column("verify_deadline", UtcDateTime),
    Column("annotation_id", Integer),
    Column("opened_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("closed_at", UtcDateTime),
    Column("next_run_at", UtcDateTime),
    Column("claimed_by", String(200)),
    Column("claim_expires_at", UtcDateTime),
    # Set by whatever wakes the row from outside its worker (a culprit joined, an approval, a release) while a
    # worker may hold it: the claim's release then looks again at once (app/store/claims.py).
    Column("poked", Boolean, nullable=False, default=False, server_default="0"),
    sqlite_autoincrement=True,  # AUTOINCREMENT: see NEVER_REUSED
)
Index("ix_incidents_due", incidents.c.next_run_at)
Index("ix_incidents_serialize", incidents.c.serialize_key)
Index("ix_incidents_target", incidents.c.playbook, incidents.c.target_key)

incident_alerts = Table(
    "incident_alerts",
    metadata,
    Column("incident_id", Integer, ForeignKey("incidents.id"), primary_key=True),
    Column("alert_id", Integer, ForeignKey("alerts.id"), primary_key=True),
)
Index("ix_incident_alerts_alert", incident_alerts.c.alert_id)

# One row per execution of a playbook's steps on a target: budgets, backoff, cooldown, blast radius read these.
attempts = Table(
    "attempts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("incident_id", Integer, ForeignKey("incidents.id"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("playbook", String(200), nullable=False),
    Column("target_key", Text, nullable=False),
    Column("node", String(255)),
    Column("destructive", Boolean, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime),
    Column("outcome", String(32)),
    UniqueConstraint("incident_id", "number", name="uq_attempt"),
    sqlite_autoincrement=True,  # AUTOINCREMENT: see NEVER_REUSED
)
Index("ix_attempts_target", attempts.c.playbook, attempts.c.target_key, attempts.c.started_at)
Index("ix_attempts_started", attempts.c.started_at)

steps = Table(
    "steps",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("incident_id", Integer, ForeignKey("incidents.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("phase", String(16), nullable=False),  # collect | steps | on_resolved
    Column("idx", Integer, nullable=False),
    Column("name", String(200), nullable=False),
    Column("action", String(200), nullable=False),
    Column("params", JSON, nullable=False),
    Column("status", String(32), nullable=False),
    Column("summary", Text, nullable=False, default=""),
    Column("command", Text, nullable=False, default=""),
    Column("exit_code", Integer),
    Column("output", Text, nullable=False, default=""),
    Column("reason", Text, nullable=False, default=""),
    Column("retries", Integer, nullable=False, default=0),
    Column("approval", Boolean, nullable=False, default=False),  # `approval: required` in the playbook
    Column("approved_by", String(200)),
    Column("approved_at", UtcDateTime),
    Column("started_at", UtcDateTime),
    Column("finished_at", UtcDateTime),
    Column("duration", JSON),
    # Each step of each attempt exists once: two workers can never both run it.
    UniqueConstraint("incident_id", "attempt", "phase", "idx", name="uq_step"),
    sqlite_autoincrement=True,  # AUTOINCREMENT: see NEVER_REUSED
)

# The nodes Nightshift added to a job's exclusion list (they were not on it before: a node already there is someone
# else's), one row per job and node, deleted when Nightshift drops the node again (app/domain/exclusions.py).
job_exclusions = Table(
    "job_exclusions",
    metadata,
    Column(
        "job", String(512), primary_key=True
    ),  # the job identity: slurm/4242, kubernetes/<namespace>/<job>
    Column("node", String(255), primary_key=True),
    Column("incident_id", Integer, nullable=False),
    Column("added_at", UtcDateTime, nullable=False),
)

ledger = Table(
    "ledger",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("ts", UtcDateTime, nullable=False),
    Column("incident_id", Integer),
    Column("kind", String(40), nullable=False),
    Column("message", Text, nullable=False),
    Column("data", JSON, nullable=False),
    sqlite_autoincrement=True,  # AUTOINCREMENT: see NEVER_REUSED
)
Index("ix_ledger_incident", ledger.c.incident_id, ledger.c.id)

controls = Table(
    "controls",
    metadata,
    Column("key", String(100), primary_key=True),
    Column("value", JSON, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

# One row that /readyz writes (Store.check_writable): ready means a write commits, not only that a read answers.
store_probe = Table(
    "store_probe",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("written_at", UtcDateTime, nullable=False),
)

# One row per repair of a node: taken out by us -> repaired -> validated -> returned, or held for a person
# (app/engine/repair.py). ``open_key`` is ``<scheduler>/<node>`` while the repair is open (RepairState REPAIR_OPEN,
# held included) and NULL once settled: one open repair per node across workers and replicas.
node_repairs = Table(
    "node_repairs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("node", String(255), nullable=False),
    Column("scheduler", String(16), nullable=False),  # slurm | kubernetes
    Column("state", String(16), nullable=False),  # app.domain.states.RepairState
    Column("open_key", String(300), unique=True),
    Column("playbook", String(200)),  # whose node_repair section plans the repair; NULL: the defaults
    Column("incident_id", Integer),  # the incident that asked for it (ledger rows carry it)
    Column("reason", Text, nullable=False, default=""),
    Column("taken_out_by_us", Boolean, nullable=False, default=False),
    Column("taken_out_at", UtcDateTime),
    # This node's repairs within the lemon window, this one included.
    Column("repairs", Integer, nullable=False, default=1),
    Column("step", String(32)),  # the step under way: take_out | repair:<i> | validate | return
    Column("step_status", String(16)),  # pending | running (found running by a later claimer: ambiguous)
    Column("retries", Integer, nullable=False, default=0),
    Column("steps", JSON, nullable=False, default=list),  # finished steps: action, command, status, output
    Column("validation", JSON),  # command, exit code, output tail, verdict
    Column("held_reason", Text),
    Column("released_by", String(100)),
    Column("deadline", UtcDateTime),  # back and validated by then, else held (repair.return_timeout_seconds)
    # Consecutive failed ticks; at worker.max_tick_errors the node is held for a person.
    Column("tick_errors", Integer, nullable=False, default=0, server_default="0"),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("closed_at", UtcDateTime),
    Column("next_run_at", UtcDateTime),
    Column("claimed_by", String(200)),
    Column("claim_expires_at", UtcDateTime),
    # Set by whatever wakes the row from outside its worker (a culprit joined, an approval, a release) while a
    # worker may hold it: the claim's release then looks again at once (app/store/claims.py).
    Column("poked", Boolean, nullable=False, default=False, server_default="0"),
    sqlite_autoincrement=True,  # AUTOINCREMENT: see NEVER_REUSED
)
Index("ix_node_repairs_due", node_repairs.c.next_run_at)
Index("ix_node_repairs_node", node_repairs.c.node, node_repairs.c.created_at)
Index("ix_node_repairs_taken_out", node_repairs.c.taken_out_at)

# UI logins, so that logging out ends a session server-side: a cookie kept from before is refused once its row is
# revoked or expired. ``id`` is the SHA-256 of the random session id the signed cookie carries, never the id itself.
ui_sessions = Table(
    "ui_sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(100), nullable=False),
    Column("role", String(16), nullable=False),  # operator | viewer
    Column("created_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
    Column("revoked_at", UtcDateTime),
)
