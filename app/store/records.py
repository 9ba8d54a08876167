"""Query functions over an open connection, composed by the engine into transactions. No decisions here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    CursorResult,
    String,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from app.domain.alertmanager import Alert, Notification
from app.domain.fleet import JobFailure
from app.domain.states import AttemptOutcome, IncidentKind, LedgerKind, StepStatus
from app.ledger_log import log_entry
from app.store import alert_batch
from app.store.rows import AlertRow, Attempt, Incident, LedgerEntry, StepRow
from app.store.schema import (
    UtcDateTime,
    alerts,
    attempts,
    controls,
    inbox,
    inbox_alerts,
    inbox_counter,
    incident_alerts,
    incidents,
    job_exclusions,
    ledger,
    steps,
)

_ALERTNAME_CHARS = cast(String, alerts.c.alertname.type).length


def inserted_id(result: CursorResult[Any]) -> int:
    """The primary key of the row an INSERT just wrote."""
    key = result.inserted_primary_key
    assert key is not None, "an INSERT of one row"
    return int(key[0])


Row = dict[str, Any]


def _one(conn: Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> Row | None:
    row = conn.execute(stmt, params).first()
    return dict(row._mapping) if row is not None else None


def _all(conn: Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> list[Row]:
    return [dict(row._mapping) for row in conn.execute(stmt, params)]


def _incident(conn: Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> Incident | None:
    row = conn.execute(stmt, params).first()
    return Incident.from_row(dict(row._mapping)) if row is not None else None


def _incidents(conn: Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> list[Incident]:
    return [Incident.from_row(dict(row._mapping)) for row in conn.execute(stmt, params)]


# Statements on the per-alert path of the webhook, built once with bound parameters. Building a statement with
# its values inline, and computing its cache key, costs SQLAlchemy several times what SQLite spends running it
# (bench/README.md, "Profile"); a prebuilt statement is compiled once and only its parameters change.
_OPEN_INCIDENT = select(incidents).where(incidents.c.open_key == bindparam("open_key_"))
# An incident whose open key another writer holds is skipped in the statement (no savepoint: two round trips
# fewer); the row comes back as written, defaults included.
_INSERT_INCIDENT = {
    name: dialect.insert(incidents)
    .on_conflict_do_nothing(index_elements=[incidents.c.open_key])
    .returning(incidents)
    for name, dialect in (("sqlite", sqlite), ("postgresql", postgresql))
}
_NEW_LINK = {
    name: dialect.insert(incident_alerts).on_conflict_do_nothing().returning(incident_alerts.c.alert_id)
    for name, dialect in (("sqlite", sqlite), ("postgresql", postgresql))
}
_INCIDENTS_OF_ALERT = (
    select(incidents)
    .join(incident_alerts, incident_alerts.c.incident_id == incidents.c.id)
    .where(incident_alerts.c.alert_id == bindparam("alert_id_"))
    .order_by(incidents.c.id)
    .with_for_update(of=incidents)
)
_INSERT_LEDGER = insert(ledger)
_LEDGER_BATCH = "nightshift_ledger_batch"  # Connection.info key: rows a ledger_batch block holds
# The worker's statements, built once for the same reason: an advisory incident runs about 30 of them.
_INCIDENT = select(incidents).where(incidents.c.id == bindparam("incident_id_"))
# SET takes the columns named by the parameters of each call (SQLAlchemy compiles and caches one form per set).
_UPDATE_INCIDENT = update(incidents).where(incidents.c.id == bindparam("incident_id_"))
_FIRING_ALERTS = (
    select(func.count())
    .select_from(alerts.join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id))
    .where(incident_alerts.c.incident_id == bindparam("incident_id_"), alerts.c.status == "firing")
)
_EARLIER_OPEN_ON = (
    select(incidents)
    .where(
        incidents.c.serialize_key == bindparam("serialize_key_"),
        incidents.c.open_key.is_not(None),
        incidents.c.id != bindparam("incident_id_"),
        or_(incidents.c.id < bindparam("incident_id_"), incidents.c.state.in_(("acting", "verifying"))),
    )
    .order_by(incidents.c.id)
    .limit(1)
)
_STEPS = {
    (by_attempt, by_phase): select(steps)
    .where(
        steps.c.incident_id == bindparam("incident_id_"),
        *([steps.c.attempt == bindparam("attempt_")] if by_attempt else []),
        *([steps.c.phase == bindparam("phase_")] if by_phase else []),
    )
    .order_by(steps.c.attempt, steps.c.phase, steps.c.idx)
    for by_attempt in (False, True)
    for by_phase in (False, True)
}
_INSERT_STEP = insert(steps)
_UPDATE_STEP = update(steps).where(steps.c.id == bindparam("step_id_"))
_INSERT_ATTEMPT = insert(attempts)
_FINISH_ATTEMPT = (
    update(attempts)
    .where(
        attempts.c.incident_id == bindparam("incident_id_"),
        attempts.c.number == bindparam("number_"),
        attempts.c.finished_at.is_(None),
    )
    .values(finished_at=bindparam("now_", type_=UtcDateTime()), outcome=bindparam("outcome_"))
)
# Keyed by whether one playbook's attempts are asked for; False: every playbook's (a job's whole history).
_ATTEMPTS_FOR_TARGET = {
    by_playbook: select(attempts)
    .where(
        *([attempts.c.playbook == bindparam("playbook_")] if by_playbook else []),
        attempts.c.target_key == bindparam("target_key_"),
        attempts.c.started_at >= bindparam("since_"),
    )
    .order_by(attempts.c.started_at)
    for by_playbook in (False, True)
}
_LAST_RECOVERY = {
    by_playbook: select(attempts)
    .where(
        *([attempts.c.playbook == bindparam("playbook_")] if by_playbook else []),
        attempts.c.target_key == bindparam("target_key_"),
        attempts.c.outcome == AttemptOutcome.RECOVERED,
    )
    .order_by(attempts.c.finished_at.desc())
    .limit(1)
    for by_playbook in (False, True)
}
_CONTROL = select(controls.c.value).where(controls.c.key == bindparam("key_"))
_CONTROL_FOR_UPDATE = _CONTROL.with_for_update()
_INSERT_INBOX = insert(inbox)
# New alerts first (lane 0), then repeats; oldest first within a lane. Not their bodies: the worker parses a body
# once, for all its batches, and reads only the bodies of the notifications a batch takes.
_QUEUED = (
    select(inbox.c.id, inbox.c.lane, inbox.c.next_alert, inbox.c.alert_count)
    .where(inbox.c.failed_at.is_(None))
    .order_by(inbox.c.lane, inbox.c.id)
    .limit(bindparam("limit_"))
)
_NEXT_INBOX = _QUEUED.with_for_update(skip_locked=True)
_INBOX_BODIES = select(inbox.c.id, inbox.c.body).where(
    inbox.c.id.in_(bindparam("inbox_ids_", expanding=True))
)
_INBOX_BACKLOG = select(inbox_counter.c.alerts).where(inbox_counter.c.id == 1)
_BACKLOG_CHANGE = (
    update(inbox_counter)
    .where(inbox_counter.c.id == 1)
    .values(alerts=inbox_counter.c.alerts + bindparam("alerts_"))
)
# The instances a notification carries that the store holds, or a queued notification carried as new: two IN lists
# per table (see alert_batch._INSTANCES); their cross product may find more, which known_instances leaves out.
_KNOWN = union_all(
    *(
        select(table.c.fingerprint, table.c.starts_at).where(
            table.c.fingerprint.in_(bindparam("fingerprints_", expanding=True)),
            table.c.starts_at.in_(bindparam("starts_", expanding=True)),
        )
        for table in (alerts, inbox_alerts)
    )
)
_REMAINING = inbox.c.alert_count - inbox.c.next_alert
_ADVANCE_INBOX = (
    update(inbox).where(inbox.c.id == bindparam("inbox_id_")).values(next_alert=bindparam("done_"))
)
_DELETE_INBOX = inbox.delete().where(inbox.c.id.in_(bindparam("inbox_ids_", expanding=True)))
_DELETE_INBOX_ALERTS = inbox_alerts.delete().where(
    inbox_alerts.c.inbox_id.in_(bindparam("inbox_ids_", expanding=True))
)


# --- alerts -------------------------------------------------------------------------------------------------


InstanceKey = alert_batch.InstanceKey


@contextmanager
def alert_batch_of(
    conn: Connection, entries: Sequence[tuple[Notification, Alert]], now: datetime, open_keys: Iterable[str]
) -> Iterator[None]:
    """Record a batch of alerts (``entries``: each with its notification) inside the block, through
    :func:`upsert_alert` (:mod:`app.store.alert_batch`): their instances are read and the new ones inserted as the
    block starts, with the open incidents of ``open_keys``; what the block writes to instances and links is
    written as it ends. When the block raises, nothing more is written (its transaction rolls back)."""
    batch = alert_batch.AlertBatch(conn)
    first: dict[InstanceKey, tuple[Notification, Alert]] = {}
    for notification, alert in entries:
        first.setdefault((alert.fingerprint, alert.starts_at), (notification, alert))
    batch.read(first, lambda key: _new_alert(first[key][1], first[key][0], now), open_keys)
    alert_batch.hold(conn, batch)
    try:
        yield
    finally:
        alert_batch.hold(conn, None)
    batch.flush()


def _new_alert(alert: Alert, notification: Notification, now: datetime) -> dict[str, Any]:
    return {
        "fingerprint": alert.fingerprint,
        "starts_at": alert.starts_at,
        "status": alert.status,
        "ends_at": alert.ends_at,
        # The column is a short copy for display (String(200), enforced by PostgreSQL); labels keep it whole.
        "alertname": alert.labels.get("alertname", "")[:_ALERTNAME_CHARS],
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "generator_url": alert.generator_url,
        "receiver": notification.receiver,
        "group_key": notification.group_key,
        "first_received_at": now,
        "last_received_at": now,
        "notifications": 1,
    }


def upsert_alert(conn: Connection, alert: Alert, now: datetime) -> tuple[int, str | None]:
    """Record one alert of the open batch (:func:`alert_batch_of`); return its row id and its status before this
    occurrence (None when new). A resolved instance never goes back to firing: a late firing notification for it
    is out of order, and changes only when it was last received."""
    batch = alert_batch.current(conn)
    assert batch is not None, "alerts are recorded in a batch"

    def changes(previous: str) -> dict[str, Any]:
        if previous == "resolved" and alert.status == "firing":
            return {"last_received_at": now}
        return {
            "last_received_at": now,
            "status": alert.status,
            "ends_at": alert.ends_at,
            "annotations": dict(alert.annotations),
        }

    return batch.recorded((alert.fingerprint, alert.starts_at), changes)


def get_alerts_for_incident(conn: Connection, incident_id: int) -> list[AlertRow]:
    stmt = (
        select(alerts)
        .join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
        .where(incident_alerts.c.incident_id == incident_id)
        .order_by(alerts.c.id)
    )
    return [AlertRow.from_row(row) for row in _all(conn, stmt)]


def get_alert(conn: Connection, alert_id: int) -> AlertRow | None:
    row = _one(conn, select(alerts).where(alerts.c.id == alert_id))
    return AlertRow.from_row(row) if row is not None else None


# --- incidents ----------------------------------------------------------------------------------------------


def find_open_incident(conn: Connection, open_key: str) -> Incident | None:
    batch = alert_batch.current(conn)
    if batch is None:
        return _incident(conn, _OPEN_INCIDENT, {"open_key_": open_key})
    known, incident = batch.open_incident(open_key)
    if not known:  # a key the batch did not read: the store, once it holds what the batch wrote
        batch.flush()
        incident = _incident(conn, _OPEN_INCIDENT, {"open_key_": open_key})
        firing = _firing(conn, incident.id) if incident is not None else 0
        batch.incident_read(open_key, incident, firing)
    return incident


def insert_incident(conn: Connection, values: Mapping[str, Any]) -> int | None:
    """Insert an open incident; None when another writer holds the same open key (then attach to theirs)."""
    row = _one(conn, _INSERT_INCIDENT[conn.dialect.name], dict(values))
    batch = alert_batch.current(conn)
    if row is None:
        if batch is not None:
            batch.open_key_taken(values["open_key"])
        return None
    if batch is not None:
        batch.incident_inserted(Incident.from_row(row))
    return int(row["id"])


def link_alert(conn: Connection, incident_id: int, alert_id: int) -> bool:
    """Attach an alert to an incident; False when it already was."""
    batch = alert_batch.current(conn)
    if batch is not None:
        return batch.link(incident_id, alert_id)
    linked = conn.execute(_NEW_LINK[conn.dialect.name], {"incident_id": incident_id, "alert_id": alert_id})
    return linked.first() is not None  # RETURNING: a row only when it was inserted (rowcount is not portable)


def incidents_for_alert(conn: Connection, alert_id: int) -> list[Incident]:
    """The alert's incidents, locked until the transaction ends: closing one on a resolved alert must not race
    a worker claiming it (``claim_next`` skips locked rows)."""
    batch = alert_batch.current(conn)
    held = batch.incidents_of(alert_id) if batch is not None else None
    return held if held is not None else _incidents(conn, _INCIDENTS_OF_ALERT, {"alert_id_": alert_id})


def firing_alert_count(conn: Connection, incident_id: int) -> int:
    batch = alert_batch.current(conn)
    held = batch.firing_count(incident_id) if batch is not None else None
    return held if held is not None else _firing(conn, incident_id)


def _firing(conn: Connection, incident_id: int) -> int:
    return int(conn.execute(_FIRING_ALERTS, {"incident_id_": incident_id}).scalar_one())


def get_incident(conn: Connection, incident_id: int) -> Incident | None:
    return _incident(conn, _INCIDENT, {"incident_id_": incident_id})


def update_incident(conn: Connection, incident_id: int, **values: Any) -> None:
    conn.execute(_UPDATE_INCIDENT, {"incident_id_": incident_id, **values})
    batch = alert_batch.current(conn)
    if batch is not None:
        batch.incident_updated(incident_id, values)


def wake_incident(conn: Connection, incident_id: int, at: datetime) -> None:
    """An open incident is looked at again at ``at`` (a closed one is left alone)."""
    conn.execute(
        update(incidents)
        .where(incidents.c.id == incident_id, incidents.c.open_key.is_not(None))
        .values(next_run_at=at)
    )


def list_incidents(
    conn: Connection,
    *,
    state: str | None = None,
    outcome: str | None = None,
    playbook: str | None = None,
    node: str | None = None,
    job: str | None = None,
    open_only: bool = False,
    limit: int = 100,
    before_id: int | None = None,
) -> list[Incident]:
    """Newest first. ``node``: the incident's node, or any culprit named in it (a job incident's ``node`` column
    holds only its first confirmed culprit)."""
    stmt = select(incidents).order_by(incidents.c.id.desc()).limit(limit)
    filters = {"state": state, "outcome": outcome, "playbook": playbook, "job": job}
    for column, value in filters.items():
        if value:
            stmt = stmt.where(incidents.c[column] == value)
    if node:
        stmt = stmt.where(or_(incidents.c.node == node, _names_culprit(conn.dialect.name, node)))
    if open_only:
        stmt = stmt.where(incidents.c.open_key.is_not(None))
    if before_id:
        stmt = stmt.where(incidents.c.id < before_id)
    return _incidents(conn, stmt)


def open_job_failures(conn: Connection, limit: int) -> list[JobFailure]:
    """The newest ``limit`` open job incidents as the fleet compares them, read from the six columns that takes
    (the diagnosis's category and the alert's error class extracted in SQL), not as whole rows: a storm compares
    each new job with every other, and decoding whole rows made that quadratic in their size."""
    stmt = (
        select(
            incidents.c.id,
            incidents.c.job,
            incidents.c.opened_at,
            incidents.c.diagnosis["category"].as_string(),
            incidents.c.labels["error_class"].as_string(),
            incidents.c.culprits,
        )
        .where(incidents.c.open_key.is_not(None), incidents.c.kind == IncidentKind.JOB)
        .order_by(incidents.c.id.desc())
        .limit(limit)
    )
    return [JobFailure.of(*row) for row in conn.execute(stmt)]


def open_node_incidents(conn: Connection, limit: int) -> list[tuple[str | None, datetime]]:
    """The newest ``limit`` open node incidents' node and opening time."""
    stmt = (
        select(incidents.c.node, incidents.c.opened_at)
        .where(incidents.c.open_key.is_not(None), incidents.c.kind == IncidentKind.NODE)
        .order_by(incidents.c.id.desc())
        .limit(limit)
    )
    return [(node, opened_at) for node, opened_at in conn.execute(stmt)]


# Whether an incident's culprits (a JSON list of {node, ...}; JSON null when none) name :culprit_node, per backend.
_CULPRIT_NAMED = {
    "sqlite": "EXISTS (SELECT 1 FROM json_each(incidents.culprits) AS c "
    "WHERE json_extract(c.value, '$.node') = :culprit_node)",
    "postgresql": "EXISTS (SELECT 1 FROM json_array_elements(CASE WHEN json_typeof(incidents.culprits) = 'array' "
    "THEN incidents.culprits ELSE '[]'::json END) AS c WHERE c ->> 'node' = :culprit_node)",
}


def _names_culprit(dialect: str, node: str) -> Any:
    return text(_CULPRIT_NAMED[dialect]).bindparams(culprit_node=node)


def open_incidents_by_state(conn: Connection) -> dict[str, int]:
    """Open incidents, counted per state (states with none are absent)."""
    stmt = (
        select(incidents.c.state, func.count())
        .where(incidents.c.open_key.is_not(None))
        .group_by(incidents.c.state)
    )
    return {str(state): int(n) for state, n in conn.execute(stmt)}


def count_incidents_by(conn: Connection, column: str) -> dict[str, int]:
    col = incidents.c[column]
    return {str(k): int(n) for k, n in conn.execute(select(col, func.count()).group_by(col))}


def earlier_open_on(conn: Connection, serialize_key: str, incident_id: int) -> Incident | None:
    """The oldest other open incident on the same node/job, if it is ahead of this one."""
    return _incident(conn, _EARLIER_OPEN_ON, {"serialize_key_": serialize_key, "incident_id_": incident_id})


# --- steps --------------------------------------------------------------------------------------------------


def get_steps(
    conn: Connection, incident_id: int, *, attempt: int | None = None, phase: str | None = None
) -> list[StepRow]:
    stmt = _STEPS[(attempt is not None, phase is not None)]
    params = {"incident_id_": incident_id, "attempt_": attempt, "phase_": phase}
    return [StepRow.from_row(dict(row._mapping)) for row in conn.execute(stmt, params)]


def insert_step(conn: Connection, values: Mapping[str, Any]) -> int | None:
    """Create a step row; None when that (incident, attempt, phase, idx) already exists."""
    try:
        with conn.begin_nested():
            return inserted_id(conn.execute(_INSERT_STEP, dict(values)))
    except IntegrityError:
        return None


def update_step(conn: Connection, step_id: int, **values: Any) -> None:
    conn.execute(_UPDATE_STEP, {"step_id_": step_id, **values})


# --- attempts -----------------------------------------------------------------------------------------------


def insert_attempt(conn: Connection, values: Mapping[str, Any]) -> None:
    conn.execute(_INSERT_ATTEMPT, dict(values))


def finish_attempt(conn: Connection, incident_id: int, number: int, outcome: str, now: datetime) -> None:
    conn.execute(
        _FINISH_ATTEMPT, {"incident_id_": incident_id, "number_": number, "outcome_": outcome, "now_": now}
    )


def attempts_for_target(
    conn: Connection, playbook: str | None, target_key: str, since: datetime
) -> list[Attempt]:
    stmt = _ATTEMPTS_FOR_TARGET[playbook is not None]
    params = {"playbook_": playbook, "target_key_": target_key, "since_": since}
    return [Attempt.from_row(dict(row._mapping)) for row in conn.execute(stmt, params)]


def last_recovery(conn: Connection, playbook: str | None, target_key: str) -> Attempt | None:
    stmt = _LAST_RECOVERY[playbook is not None]
    row = conn.execute(stmt, {"playbook_": playbook, "target_key_": target_key}).first()
    return Attempt.from_row(dict(row._mapping)) if row is not None else None


# --- inbox --------------------------------------------------------------------------------------------------


def enqueue_notification(
    conn: Connection,
    now: datetime,
    receiver: str,
    alert_count: int,
    body: str,
    lane: int = 0,
    new_instances: Iterable[tuple[str, datetime]] = (),
) -> int:
    """Queue a notification as received; ``lane`` 0 (new alerts) is ingested before lane 1 (repeats).
    ``new_instances``: its firing alert instances the store did not know, remembered while it waits."""
    result = conn.execute(
        _INSERT_INBOX,
        {
            "received_at": now,
            "receiver": receiver,
            "alert_count": alert_count,
            "next_alert": 0,
            "body": body,
            "lane": lane,
        },
    )
    inbox_id = inserted_id(result)
    rows = [{"inbox_id": inbox_id, "fingerprint": f, "starts_at": at} for f, at in new_instances]
    if rows:
        conn.execute(insert(inbox_alerts), rows)
    _backlog_changed(conn, alert_count)
    return inbox_id


def inbox_backlog(conn: Connection) -> int:
    """Alerts queued and not yet ingested (set-aside notifications not counted): the counter the queue's writes
    keep (schema.inbox_counter), one row read whatever the queue holds."""
    return int(conn.execute(_INBOX_BACKLOG).scalar_one())


def _backlog_changed(conn: Connection, alerts: int) -> None:
    if alerts:
        conn.execute(_BACKLOG_CHANGE, {"alerts_": alerts})


def known_instances(conn: Connection, instances: Iterable[tuple[str, datetime]]) -> set[tuple[str, datetime]]:
    """Which of the alert instances (fingerprint, startsAt) the store already holds, or a queued notification
    carried as new."""
    wanted = sorted(set(instances))
    found: set[tuple[str, datetime]] = set()
    for params in alert_batch.instance_lists(wanted):
        found.update((row.fingerprint, row.starts_at) for row in conn.execute(_KNOWN, params))
    return found.intersection(wanted)


def next_inbox(conn: Connection, limit: int) -> list[Row]:
    """The next ``limit`` notifications to ingest (``id``, ``lane``, ``next_alert``, ``alert_count``), locked (SKIP
    LOCKED on PostgreSQL; SQLite serialises writers)."""
    return _all(conn, _NEXT_INBOX, {"limit_": limit})


def peek_inbox(conn: Connection, limit: int) -> list[Row]:
    """The next ``limit`` notifications to ingest, as :func:`next_inbox` gives them, without a lock: a read
    transaction's look ahead, which spares an idle worker a write transaction."""
    return _all(conn, _QUEUED, {"limit_": limit})


def inbox_bodies(conn: Connection, inbox_ids: Sequence[int]) -> dict[int, str]:
    """Queued notifications' bodies by id; one that is gone is left out (on PostgreSQL each statement of a read
    sees what committed before it: another worker may have ingested it since the same read found it)."""
    return {row.id: str(row.body) for row in conn.execute(_INBOX_BODIES, {"inbox_ids_": list(inbox_ids)})}


def ingested(conn: Connection, portions: Sequence[tuple[int, int, int, int]]) -> None:
    """Each notification's alerts ``start`` to ``done`` are in (``portions``: (inbox id, start, done, alert count)):
    it advances, or leaves the queue with its last."""
    finished = [inbox_id for inbox_id, _, done, count in portions if done >= count]
    if finished:
        conn.execute(_DELETE_INBOX, {"inbox_ids_": finished})
        conn.execute(_DELETE_INBOX_ALERTS, {"inbox_ids_": finished})
    for inbox_id, _, done, count in portions:
        if done < count:
            conn.execute(_ADVANCE_INBOX, {"inbox_id_": inbox_id, "done_": done})
    _backlog_changed(conn, sum(start - min(done, count) for _, start, done, count in portions))


def fail_inbox(conn: Connection, inbox_id: int, now: datetime, error: str) -> None:
    """Set the notification aside with its error: its alerts not ingested leave the backlog."""
    remaining = conn.execute(
        update(inbox)
        .where(inbox.c.id == inbox_id, inbox.c.failed_at.is_(None))
        .values(failed_at=now, error=error)
        .returning(_REMAINING)
    ).scalar()
    _backlog_changed(conn, -(remaining or 0))


def retry_failed_inbox(conn: Connection) -> int:
    """Put every failed notification back in the queue, from the alert where it stopped. Returns how many."""
    remaining = (
        conn.execute(
            update(inbox)
            .where(inbox.c.failed_at.is_not(None))
            .values(failed_at=None, error=None)
            .returning(_REMAINING)
        )
        .scalars()
        .all()
    )
    _backlog_changed(conn, sum(remaining))
    return len(remaining)


def inbox_stats(conn: Connection) -> Row:
    """Pending and failed notifications, and when the oldest pending one arrived (None when none waits)."""
    pending = inbox.c.failed_at.is_(None)
    row = conn.execute(
        select(
            func.count().filter(pending).label("pending"),
            func.count().filter(~pending).label("failed"),
            func.min(inbox.c.received_at).filter(pending).label("oldest_pending_at"),
        )
    ).one()
    return {"pending": row.pending, "failed": row.failed, "oldest_pending_at": row.oldest_pending_at}


def failed_inbox(conn: Connection, limit: int = 100) -> list[Row]:
    stmt = (
        select(
            inbox.c.id,
            inbox.c.received_at,
            inbox.c.receiver,
            inbox.c.alert_count,
            inbox.c.next_alert,
            inbox.c.failed_at,
            inbox.c.error,
        )
        .where(inbox.c.failed_at.is_not(None))
        .order_by(inbox.c.id)
        .limit(limit)
    )
    return _all(conn, stmt)


# --- exclusions ---------------------------------------------------------------------------------------------


def note_exclusions(
    conn: Connection, job: str, added: Iterable[str], dropped: Iterable[str], incident_id: int, now: datetime
) -> None:
    """Nightshift added ``added`` to job ``job``'s exclusion list (they were not on it) and dropped ``dropped``."""
    gone = sorted(set(dropped))
    if gone:
        conn.execute(
            delete(job_exclusions).where(job_exclusions.c.job == job, job_exclusions.c.node.in_(gone))
        )
    for node in sorted(set(added) - set(gone)):
        try:
            with conn.begin_nested():
                conn.execute(
                    insert(job_exclusions).values(job=job, node=node, incident_id=incident_id, added_at=now)
                )
        except IntegrityError:
            pass  # added already (by an earlier recovery): it stays ours since then


def exclusions_of_job(conn: Connection, job: str) -> list[Row]:
    """The nodes Nightshift added to ``job``'s exclusion list and has not dropped, oldest first."""
    stmt = select(job_exclusions).where(job_exclusions.c.job == job).order_by(job_exclusions.c.added_at)
    return _all(conn, stmt)


# --- ledger -------------------------------------------------------------------------------------------------


def record(
    conn: Connection,
    now: datetime,
    kind: LedgerKind,
    message: str,
    *,
    incident_id: int | None = None,
    data: Mapping[str, Any] | None = None,
) -> None:
    row = {"ts": now, "kind": kind, "message": message, "incident_id": incident_id, "data": dict(data or {})}
    batch = conn.info.get(_LEDGER_BATCH)
    if batch is not None:
        batch.append(row)
    else:
        conn.execute(_INSERT_LEDGER, row)
    log_entry(kind, message, incident_id, data or {})


@contextmanager
def ledger_batch(conn: Connection) -> Iterator[None]:
    """Ledger rows recorded inside the block are inserted together as it ends, in the order they were recorded
    (one statement for all of them: a storm's ingestion records two rows an alert). For a block that writes and
    does not read the ledger (ingestion); when the block raises, nothing is inserted (its transaction rolls back).
    Nested blocks insert with the outermost."""
    if _LEDGER_BATCH in conn.info:
        yield
        return
    rows: list[dict[str, Any]] = []
    conn.info[_LEDGER_BATCH] = rows
    try:
        yield
    finally:
        # Connection.info outlives the checkout (it is the pooled DBAPI connection's): never leave the batch there.
        del conn.info[_LEDGER_BATCH]
    if rows:
        conn.execute(_INSERT_LEDGER, rows)


def ledger_for(conn: Connection, incident_id: int) -> list[LedgerEntry]:
    stmt = select(ledger).where(ledger.c.incident_id == incident_id).order_by(ledger.c.id)
    return [LedgerEntry.from_row(row) for row in _all(conn, stmt)]


def iter_ledger(conn: Connection, *, after_id: int = 0, batch: int = 1000) -> Iterator[LedgerEntry]:
    while True:
        stmt = select(ledger).where(ledger.c.id > after_id).order_by(ledger.c.id).limit(batch)
        entries = [LedgerEntry.from_row(row) for row in _all(conn, stmt)]
        if not entries:
            return
        yield from entries
        after_id = entries[-1].id


# --- controls -----------------------------------------------------------------------------------------------


def get_control(conn: Connection, key: str, *, for_update: bool = False) -> Any:
    """A control row's value (None: absent); ``for_update``: locked until the transaction ends (PostgreSQL)."""
    row = conn.execute(_CONTROL_FOR_UPDATE if for_update else _CONTROL, {"key_": key}).first()
    return None if row is None else row.value


def controls_with_prefix(conn: Connection, prefix: str) -> dict[str, Any]:
    stmt = select(controls.c.key, controls.c.value).where(controls.c.key.startswith(prefix, autoescape=True))
    return {row.key[len(prefix) :]: row.value for row in conn.execute(stmt)}


def delete_control(conn: Connection, key: str) -> None:
    conn.execute(delete(controls).where(controls.c.key == key))


def set_control(conn: Connection, key: str, value: Any, now: datetime) -> None:
    updated = conn.execute(update(controls).where(controls.c.key == key).values(value=value, updated_at=now))
    if updated.rowcount == 0:
        try:
            with conn.begin_nested():
                conn.execute(insert(controls).values(key=key, value=value, updated_at=now))
        except IntegrityError:
            conn.execute(update(controls).where(controls.c.key == key).values(value=value, updated_at=now))


# --- views (operator UI; read-only) -------------------------------------------------------------------------


def latest_incident_per_job(conn: Connection, limit: int = 200) -> list[Row]:
    """The newest incident of each job seen in incidents, newest first, at most ``limit``; each row also carries
    ``firing_alerts``, how many of its alerts still fire."""
    newest = (
        select(func.max(incidents.c.id).label("id"))
        .where(incidents.c.job.is_not(None))
        .group_by(incidents.c.job)
        .subquery()
    )
    firing = (
        select(func.count())
        .select_from(alerts.join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id))
        .where(incident_alerts.c.incident_id == incidents.c.id, alerts.c.status == "firing")
        .scalar_subquery()
    )
    stmt = (
        select(incidents, firing.label("firing_alerts"))
        .join(newest, newest.c.id == incidents.c.id)
        .order_by(incidents.c.id.desc())
        .limit(limit)
    )
    return _all(conn, stmt)


def attempts_by_node(conn: Connection, since: datetime) -> list[Row]:
    """Remediation attempts started since ``since``, counted per (node, outcome); outcome None = in progress."""
    stmt = (
        select(attempts.c.node, attempts.c.outcome, func.count().label("count"))
        .where(attempts.c.started_at >= since, attempts.c.node.is_not(None))
        .group_by(attempts.c.node, attempts.c.outcome)
    )
    return _all(conn, stmt)


def incidents_by_node(conn: Connection, since: datetime) -> dict[str, int]:
    """Incidents opened since ``since``, counted per node (acted on or not)."""
    stmt = (
        select(incidents.c.node, func.count())
        .where(incidents.c.opened_at >= since, incidents.c.node.is_not(None))
        .group_by(incidents.c.node)
    )
    return {str(node): int(n) for node, n in conn.execute(stmt)}


# Incidents read at most when counting a node's exclusions (a storm's window is bounded by this, newest first).
MAX_EXCLUSION_SCAN = 5000


def exclusions_of(
    conn: Connection, node: str, playbooks: Iterable[str], since: datetime, *, other_than: int
) -> int:
    """Job incidents opened since ``since`` (not ``other_than``) whose confirmed culprits name ``node`` by one of
    ``playbooks`` and that excluded it: a step of theirs that ran ``ok`` with ``node`` in its ``exclude_nodes``
    (an incident whose requeue never ran, its job not answering a checkpoint request, excluded nothing). How often
    the node was excluded from a job by them (newest :data:`MAX_EXCLUSION_SCAN` read)."""
    names = set(playbooks)
    stmt = (
        select(incidents.c.id, incidents.c.culprits)
        .where(
            incidents.c.opened_at >= since,
            incidents.c.id != other_than,
            incidents.c.kind == IncidentKind.JOB,
            incidents.c.culprits.is_not(None),
        )
        .order_by(incidents.c.id.desc())
        .limit(MAX_EXCLUSION_SCAN)
    )
    named = [
        incident_id
        for incident_id, culprits in conn.execute(stmt)
        if any(c.node == node and c.confirmed and c.playbook in names for c in culprits)
    ]
    if not named:
        return 0
    ran = conn.execute(
        select(steps.c.incident_id, steps.c.params).where(
            steps.c.incident_id.in_(named), steps.c.phase == "steps", steps.c.status == StepStatus.OK
        )
    )
    return len(
        {
            incident_id
            for incident_id, params in ran
            if node in str((params or {}).get("exclude_nodes") or "").split(",")
        }
    )


def job_failures_since(conn: Connection, since: datetime) -> int:
    """Job incidents opened since ``since`` that Nightshift acted on (at least one recovery attempt): the job
    failures it measured, for the checkpoint-interval advice."""
    stmt = select(func.count()).where(
        incidents.c.kind == IncidentKind.JOB, incidents.c.opened_at >= since, incidents.c.attempt >= 1
    )
    return int(conn.execute(stmt).scalar_one())
