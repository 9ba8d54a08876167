"""What retention may delete, read and deleted in bounded batches: query functions over an open connection.

The engine's pass (:mod:`app.engine.retention`) decides when; ``nightshift export --prunable`` reads the same
selection without deleting. Never selected: an open incident, an open or held node repair, a row an open incident
or repair references, a notification still waiting to be ingested, an alert still being notified.

Groups, each deleted with what depends on it (docs/reliability.md, "Retention"):

- ``alerts``: alert instances not notified since the alerts cutoff and linked to no open incident, with their
  links to closed incidents (those keep their own labels and ledger);
- ``inbox``: notifications set aside (their ingestion failed) before the alerts cutoff, with the new alert
  instances they carried (``inbox_alerts``);
- ``incidents``: incidents closed before the incidents cutoff, with their links, attempts, steps and ledger rows
  and the exclusions they added (app/domain/exclusions.py: a node whose row is gone is never dropped from its job),
  unless one of their alerts is still notified or a repair they asked for is open or settled after the cutoff;
- ``node_repairs``: repairs settled before the incidents cutoff whose incident is closed;
- ``ledger``: rows of no incident, per-alert ones (received, unmatched...) after the alerts cutoff, the rest
  (operator actions, retention's own rows) after the incidents cutoff, never one about a repair still open.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, and_, delete, exists, func, or_, select

from app.domain.retention import Cutoffs
from app.store import records
from app.store.schema import (
    alerts,
    attempts,
    controls,
    inbox,
    inbox_alerts,
    incident_alerts,
    incidents,
    job_exclusions,
    ledger,
    node_repairs,
    steps,
)

Row = dict[str, Any]
GROUPS = ("alerts", "inbox", "incidents", "node_repairs", "ledger")
# Ledger rows of no incident that are about one alert or notification: as short-lived as the alerts.
PER_ALERT_KINDS = (
    "alert_received",
    "alert_out_of_order",
    "unmatched",
    "target_invalid",
    "inbox_failed",
    "notification",
)


@dataclass(frozen=True)
class Batch:
    """One group's rows to delete, by table (the group's own rows and what depends on them)."""

    group: str
    rows: Mapping[str, Sequence[Row]]

    @property
    def counts(self) -> dict[str, int]:
        return {table: len(rows) for table, rows in self.rows.items() if rows}


def _all(conn: Connection, stmt: Any) -> list[Row]:
    return [dict(row._mapping) for row in conn.execute(stmt)]


def _open_incident(incident_id: Any) -> Any:
    return exists().where(incidents.c.id == incident_id, incidents.c.open_key.is_not(None))


def _alerts_ids(cut: Cutoffs, after: int) -> Any:
    linked_open = exists().where(
        incident_alerts.c.alert_id == alerts.c.id, _open_incident(incident_alerts.c.incident_id)
    )
    return select(alerts.c.id).where(
        alerts.c.id > after, alerts.c.last_received_at < cut.alerts, ~linked_open
    )


def _inbox_ids(cut: Cutoffs, after: int) -> Any:
    return select(inbox.c.id).where(
        inbox.c.id > after, inbox.c.failed_at.is_not(None), inbox.c.received_at < cut.alerts
    )


def _incident_ids(cut: Cutoffs, after: int) -> Any:
    still_notified = exists().where(
        incident_alerts.c.incident_id == incidents.c.id,
        incident_alerts.c.alert_id == alerts.c.id,
        alerts.c.last_received_at >= cut.alerts,
    )
    repair_kept = exists().where(
        node_repairs.c.incident_id == incidents.c.id,
        or_(node_repairs.c.open_key.is_not(None), node_repairs.c.closed_at >= cut.incidents),
    )
    return select(incidents.c.id).where(
        incidents.c.id > after,
        incidents.c.open_key.is_(None),
        func.coalesce(incidents.c.closed_at, incidents.c.updated_at) < cut.incidents,
        ~still_notified,
        ~repair_kept,
    )


def _repair_ids(cut: Cutoffs, after: int) -> Any:
    return select(node_repairs.c.id).where(
        node_repairs.c.id > after,
        node_repairs.c.open_key.is_(None),
        func.coalesce(node_repairs.c.closed_at, node_repairs.c.updated_at) < cut.incidents,
        or_(node_repairs.c.incident_id.is_(None), ~_open_incident(node_repairs.c.incident_id)),
    )


def _ledger_ids(cut: Cutoffs, after: int) -> Any:
    return select(ledger.c.id, ledger.c.data).where(
        ledger.c.id > after,
        ledger.c.incident_id.is_(None),
        or_(
            and_(ledger.c.kind.in_(PER_ALERT_KINDS), ledger.c.ts < cut.alerts),
            ledger.c.ts < cut.incidents,
        ),
    )


_SELECTORS = {
    "alerts": (alerts, _alerts_ids),
    "inbox": (inbox, _inbox_ids),
    "incidents": (incidents, _incident_ids),
    "node_repairs": (node_repairs, _repair_ids),
    "ledger": (ledger, _ledger_ids),
}


def _open_repair_ids(conn: Connection) -> set[int]:
    return {
        row.id for row in conn.execute(select(node_repairs.c.id).where(node_repairs.c.open_key.is_not(None)))
    }


def next_ids(
    conn: Connection, group: str, cut: Cutoffs, limit: int, *, after: int = 0, lock: bool
) -> list[int]:
    """Ids of up to ``limit`` rows of ``group`` that may go, in id order after ``after``. ``lock``: FOR UPDATE SKIP
    LOCKED (PostgreSQL; SQLite's BEGIN IMMEDIATE serialises writers), so that two workers never both take one."""
    table, selector = _SELECTORS[group]
    open_repairs: set[int] | None = None
    while True:
        stmt = selector(cut, after).order_by(table.c.id).limit(limit)
        if lock:
            stmt = stmt.with_for_update(of=table, skip_locked=True)
        rows = conn.execute(stmt).all()
        if group != "ledger" or not rows:
            return [row.id for row in rows]
        if open_repairs is None:
            open_repairs = _open_repair_ids(conn)
        # A row about a repair still open (held for a person, say) stays with it, however old.
        kept = [row.id for row in rows if (row.data or {}).get("repair_id") not in open_repairs]
        if kept or len(rows) < limit:
            return kept
        after = rows[-1].id


def _rows(conn: Connection, table: Table, column: Any, ids: Sequence[int]) -> list[Row]:
    return (
        _all(conn, select(table).where(column.in_(ids)).order_by(*table.primary_key.columns)) if ids else []
    )


def batch(conn: Connection, group: str, ids: Sequence[int]) -> Batch:
    """The rows that deleting ``ids`` of ``group`` deletes, by table (the export writes them first)."""
    table = _SELECTORS[group][0]
    found: dict[str, list[Row]] = {group: _rows(conn, table, table.c.id, ids)}
    if group == "alerts":
        found["incident_alerts"] = _rows(conn, incident_alerts, incident_alerts.c.alert_id, ids)
    elif group == "inbox":
        found["inbox_alerts"] = _rows(conn, inbox_alerts, inbox_alerts.c.inbox_id, ids)
    elif group == "incidents":
        found["incident_alerts"] = _rows(conn, incident_alerts, incident_alerts.c.incident_id, ids)
        found["attempts"] = _rows(conn, attempts, attempts.c.incident_id, ids)
        found["steps"] = _rows(conn, steps, steps.c.incident_id, ids)
        found["ledger"] = _rows(conn, ledger, ledger.c.incident_id, ids)
        found["job_exclusions"] = _rows(conn, job_exclusions, job_exclusions.c.incident_id, ids)
    return Batch(group, found)


def delete_batch(conn: Connection, group: str, ids: Sequence[int]) -> dict[str, int]:
    """Delete ``ids`` of ``group`` and what depends on them; rows deleted, by table."""
    if not ids:
        return {}
    counts: dict[str, int] = {}

    def drop(table: Table, column: Any) -> None:
        deleted = conn.execute(delete(table).where(column.in_(ids))).rowcount
        if deleted:
            counts[table.name] = counts.get(table.name, 0) + deleted

    if group == "alerts":
        drop(incident_alerts, incident_alerts.c.alert_id)
    elif group == "inbox":
        drop(inbox_alerts, inbox_alerts.c.inbox_id)  # the new alerts a set-aside notification carried
    elif group == "incidents":
        for child, column in (
            (incident_alerts, incident_alerts.c.incident_id),
            (attempts, attempts.c.incident_id),
            (steps, steps.c.incident_id),
            (ledger, ledger.c.incident_id),
            (job_exclusions, job_exclusions.c.incident_id),  # forgotten: such a node is never dropped then
        ):
            drop(child, column)
    table = _SELECTORS[group][0]
    drop(table, table.c.id)
    return counts


def prunable(conn: Connection, cut: Cutoffs, batch_rows: int) -> Iterator[Batch]:
    """Every row that a pass with these cutoffs would delete now, group by group, ``batch_rows`` ids at a time,
    each row once (read-only: ``nightshift export --prunable``; a pass deletes an alert's links with the alert,
    before the incident's group would list them again)."""
    seen: dict[str, set[Any]] = {}
    for group in GROUPS:
        after = 0
        while ids := next_ids(conn, group, cut, batch_rows, after=after, lock=False):
            found = batch(conn, group, ids)
            fresh = {}
            for table, rows in found.rows.items():
                keys = seen.setdefault(table, set())
                fresh[table] = [row for row in rows if _key(table, row) not in keys]
                keys.update(_key(table, row) for row in rows)
            yield Batch(group, fresh)
            after = ids[-1]


def _key(table: str, row: Row) -> Any:
    if table == "inbox_alerts":
        return (row["inbox_id"], row["fingerprint"], row["starts_at"])
    if table == "job_exclusions":
        return (row["job"], row["node"])
    return (row["incident_id"], row["alert_id"]) if table == "incident_alerts" else row["id"]


def jsonl(found: Batch) -> Iterator[str]:
    """The rows of ``found`` as export lines: one ``{"table": ..., "row": {...}}`` JSON object each."""
    for table, rows in found.rows.items():
        for row in rows:
            yield json.dumps({"table": table, "row": row}, default=str, sort_keys=True)


PASS_CONTROL = "retention"


def claim_pass(conn: Connection, now: datetime, next_at: datetime, worker: str) -> bool:
    """Start a pass unless one started within the interval (the control row ``retention`` says when the next is
    due): one worker a pass, whatever the replicas. The row is locked (PostgreSQL) until the transaction ends."""
    row = conn.execute(
        select(controls.c.value).where(controls.c.key == PASS_CONTROL).with_for_update()
    ).first()
    due = row is None or datetime.fromisoformat(row.value["next_at"]) <= now
    if due:
        records.set_control(
            conn,
            PASS_CONTROL,
            {"next_at": next_at.isoformat(), "by": worker, "started_at": now.isoformat()},
            now,
        )
    return due
