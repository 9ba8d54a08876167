"""What one ingestion transaction knows of its alerts and their incidents: read with a few statements as it
starts, kept current by its own writes, written with one statement per table as it ends.

An ingestion takes a batch of alerts (several notifications) and, alert by alert, records the instance, finds the
open incident of its episode, links it, and on a resolve counts what still fires. Done one statement at a time that
is three to four statements an alert, and SQLAlchemy spends about ten times what SQLite does on each
(bench/README.md, "Storms"). Here the batch's reads are made up front:

* its alert instances (:func:`read_instances`), the new ones inserted at once (each with the values of its
  first occurrence in the batch: a later one is an update, as it would have been);
* the incidents its known instances are linked to, locked as :func:`records.incidents_for_alert` locks them;
* the open incidents of the episodes its firing alerts fall in (the caller names their open keys);
* how many firing alerts each of those incidents holds;

and what the ingestion writes through :mod:`app.store.records` while the batch is open updates that picture:
an instance's status changes (buffered), a link (buffered), an incident inserted or updated (written at once, the
row kept as written). The buffered writes are flushed when the batch ends, and before any read the picture cannot
answer (an open key it did not read: an incident another writer opened meanwhile), so a read never misses a write.

Only the store's own functions see the batch (``records.upsert_alert``, ``find_open_incident``,
``incidents_for_alert``, ``firing_alert_count``, ``link_alert``, ``insert_incident``, ``update_incident``): a
block that holds a batch must read alerts, links and incidents through them alone (the ingestion does).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from app.store.rows import Incident
from app.store.schema import alerts, incident_alerts, incidents

_KEY = "nightshift_alert_batch"  # Connection.info key: the open batch
CHUNK = 1000  # ids or keys bound per statement (SQLite allows 32,766 bound parameters; PostgreSQL 65,535)

InstanceKey = tuple[str, datetime]  # an alert instance: (fingerprint, startsAt)

# A batch's instances: two IN lists, not a row-value IN (SQLite searches the (fingerprint, starts_at) index with
# both, where it scans the whole index for (fingerprint, starts_at) IN (...)). Their cross product may find an
# instance the batch does not hold: read_instances leaves it out.
_INSTANCES = (
    select(alerts.c.id, alerts.c.fingerprint, alerts.c.starts_at, alerts.c.status)
    .where(
        alerts.c.fingerprint.in_(bindparam("fingerprints_", expanding=True)),
        alerts.c.starts_at.in_(bindparam("starts_", expanding=True)),
    )
    .with_for_update()
)
_LINKS = select(incident_alerts.c.alert_id, incident_alerts.c.incident_id).where(
    incident_alerts.c.alert_id.in_(bindparam("alert_ids_", expanding=True))
)
# The incidents of the batch's alerts are locked until the transaction ends, as records.incidents_for_alert locks
# them: closing one on a resolved alert must not race a worker claiming it (``claim_next`` skips locked rows).
_INCIDENTS = (
    select(incidents).where(incidents.c.id.in_(bindparam("incident_ids_", expanding=True))).with_for_update()
)
_OPEN = select(incidents).where(incidents.c.open_key.in_(bindparam("open_keys_", expanding=True)))
_FIRING = (
    select(incident_alerts.c.incident_id, func.count())
    .select_from(alerts.join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id))
    .where(
        incident_alerts.c.incident_id.in_(bindparam("incident_ids_", expanding=True)),
        alerts.c.status == "firing",
    )
    .group_by(incident_alerts.c.incident_id)
)
_NEW_ALERTS = {
    name: dialect.insert(alerts)
    .on_conflict_do_nothing(index_elements=[alerts.c.fingerprint, alerts.c.starts_at])
    .returning(alerts.c.id, alerts.c.fingerprint, alerts.c.starts_at)
    for name, dialect in (("sqlite", sqlite), ("postgresql", postgresql))
}
_NEW_LINKS = {
    name: dialect.insert(incident_alerts).on_conflict_do_nothing()
    for name, dialect in (("sqlite", sqlite), ("postgresql", postgresql))
}
# Incremented in SQL: replicas updating the same row under READ COMMITTED must not lose a delivery.
_UPDATE_ALERT = (
    update(alerts)
    .where(alerts.c.id == bindparam("alert_id_"))
    .values(notifications=alerts.c.notifications + 1)
)


@dataclass
class AlertBatch:
    """The batch's picture of its alerts and their incidents (one source while it is open: the store is behind it
    by the buffered writes until :meth:`flush`)."""

    conn: Connection
    # Each instance's row id, and each row's status as the batch has left it.
    instances: dict[InstanceKey, int] = field(default_factory=dict)
    status: dict[int, str] = field(default_factory=dict)
    # Instances inserted as the batch opened whose first occurrence has not been recorded yet.
    fresh: set[InstanceKey] = field(default_factory=set)
    # Each alert's incidents (by id), the incidents read or written, the open incident of each open key read
    # (None: none open), and how many firing alerts each incident holds.
    links: defaultdict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    incidents: dict[int, Incident] = field(default_factory=dict)
    open_keys: dict[str, int | None] = field(default_factory=dict)
    firing: dict[int, int] = field(default_factory=dict)
    _updates: list[dict[str, Any]] = field(default_factory=list)
    _new_links: list[dict[str, int]] = field(default_factory=list)

    # --- opening --------------------------------------------------------------------------------------------

    def read(
        self,
        keys: Iterable[InstanceKey],
        new_row: Callable[[InstanceKey], dict[str, Any]],
        open_keys: Iterable[str],
    ) -> None:
        """Read the batch's instances (``keys``), insert those the store does not hold (``new_row``: an instance's
        columns, its first occurrence's values), then read what the batch needs of the store."""
        conn = self.conn
        keys = list(keys)
        self._known(read_instances(conn, keys))
        self._insert([new_row(key) for key in keys if key not in self.instances])
        # Every instance the batch did not insert itself, those a concurrent writer inserted first included.
        inserted = {self.instances[key] for key in self.fresh}
        known = sorted(alert_id for alert_id in self.status if alert_id not in inserted)
        for chunk in _chunks(known):
            for alert_id, incident_id in conn.execute(_LINKS, {"alert_ids_": chunk}):
                self.links[alert_id].add(incident_id)
        linked = sorted({incident_id for ids in self.links.values() for incident_id in ids})
        for chunk in _chunks(linked):
            self._incidents(conn.execute(_INCIDENTS, {"incident_ids_": chunk}))
        wanted = sorted(set(open_keys))
        self.open_keys.update(dict.fromkeys(wanted))
        for chunk in _chunks(wanted):
            self._incidents(conn.execute(_OPEN, {"open_keys_": chunk}))
        for incident in self.incidents.values():
            if incident.open_key is not None:
                self.open_keys[incident.open_key] = incident.id
        self._count_firing(sorted(self.incidents))

    def _incidents(self, rows: Iterable[Any]) -> None:
        for row in rows:
            incident = Incident.from_row(dict(row._mapping))
            self.incidents.setdefault(incident.id, incident)

    def _known(self, stored: dict[InstanceKey, tuple[int, str]]) -> None:
        for key, (alert_id, status) in stored.items():
            self.instances[key] = alert_id
            self.status[alert_id] = status

    def _insert(self, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        inserted = {
            (r.fingerprint, r.starts_at): r.id
            for r in self.conn.execute(_NEW_ALERTS[self.conn.dialect.name], list(rows))
        }
        for row in rows:
            key = (row["fingerprint"], row["starts_at"])
            if key in inserted:
                self._known({key: (inserted[key], row["status"])})
                self.fresh.add(key)
        missed = [(r["fingerprint"], r["starts_at"]) for r in rows]
        missed = [key for key in missed if key not in inserted]
        if missed:  # a concurrent replica inserted them first: they are known instances
            self._known(read_instances(self.conn, missed))

    def _count_firing(self, incident_ids: Sequence[int]) -> None:
        self.firing.update(dict.fromkeys(incident_ids, 0))
        for chunk in _chunks(incident_ids):
            rows = self.conn.execute(_FIRING, {"incident_ids_": chunk})
            self.firing.update((incident_id, count) for incident_id, count in rows)

    # --- what the store's functions ask and tell it -----------------------------------------------------------

    def recorded(self, key: InstanceKey, changes: Callable[[str], dict[str, Any]]) -> tuple[int, str | None]:
        """One occurrence of a batch's instance: its row id and its status before it (None: new, inserted as the
        batch opened). ``changes``: the columns an occurrence of a known instance sets, given its status."""
        alert_id = self.instances[key]
        if key in self.fresh:
            self.fresh.discard(key)
            return alert_id, None
        previous = self.status[alert_id]
        columns = changes(previous)
        status = columns.get("status", previous)
        self._updates.append({**columns, "alert_id_": alert_id})
        self.status[alert_id] = status
        if status != previous:
            change = (status == "firing") - (previous == "firing")
            for incident_id in self.links.get(alert_id, ()):
                self.firing[incident_id] += change
        return alert_id, previous

    def link(self, incident_id: int, alert_id: int) -> bool:
        """Link an alert of the batch to an incident; False when it was."""
        if incident_id in self.links[alert_id]:
            return False
        self.links[alert_id].add(incident_id)
        self._new_links.append({"incident_id": incident_id, "alert_id": alert_id})
        if incident_id in self.firing and self.status.get(alert_id) == "firing":
            self.firing[incident_id] += 1
        return True

    def open_incident(self, open_key: str) -> tuple[bool, Incident | None]:
        """(known, the open incident of the key): not known when the batch did not read the key."""
        if open_key not in self.open_keys:
            return False, None
        incident_id = self.open_keys[open_key]
        return True, (self.incidents[incident_id] if incident_id is not None else None)

    def incident_read(self, open_key: str, incident: Incident | None, firing: int) -> None:
        """The open incident of a key the batch had not read, read after a flush, and its firing alerts."""
        self.open_keys[open_key] = incident.id if incident is not None else None
        if incident is not None:
            self.incidents[incident.id] = incident
            self.firing[incident.id] = firing

    def incident_inserted(self, incident: Incident) -> None:
        self.incidents[incident.id] = incident
        self.firing[incident.id] = 0
        if incident.open_key is not None:
            self.open_keys[incident.open_key] = incident.id

    def open_key_taken(self, open_key: str) -> None:
        """Another writer holds the key (an insert conflicted): the batch no longer knows its incident."""
        self.open_keys.pop(open_key, None)

    def incident_updated(self, incident_id: int, values: dict[str, Any]) -> None:
        current = self.incidents.get(incident_id)
        if current is None:
            return
        updated = replace(current, **values)
        self.incidents[incident_id] = updated
        if current.open_key != updated.open_key:
            if current.open_key is not None and self.open_keys.get(current.open_key) == incident_id:
                self.open_keys[current.open_key] = None
            if updated.open_key is not None:
                self.open_keys[updated.open_key] = incident_id

    def incidents_of(self, alert_id: int) -> list[Incident] | None:
        """The alert's incidents, oldest first; None when the batch does not hold the alert."""
        if alert_id not in self.status:
            return None
        return [self.incidents[i] for i in sorted(self.links.get(alert_id, ()))]

    def firing_count(self, incident_id: int) -> int | None:
        return self.firing.get(incident_id)

    # --- closing --------------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write the buffered instance updates and links (one statement per shape of update, one for the links)."""
        shapes: defaultdict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for row in self._updates:
            shapes[tuple(sorted(row))].append(row)
        for rows in shapes.values():
            self.conn.execute(_UPDATE_ALERT, rows)
        if self._new_links:
            self.conn.execute(_NEW_LINKS[self.conn.dialect.name], self._new_links)
        self._updates, self._new_links = [], []


def read_instances(conn: Connection, keys: Iterable[InstanceKey]) -> dict[InstanceKey, tuple[int, str]]:
    """The stored row id and status of these alert instances, locked until the transaction ends (FOR UPDATE on
    PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers): a replica that read a row before another one
    resolved it must not write its stale status back."""
    wanted = sorted(set(keys))
    found: dict[InstanceKey, tuple[int, str]] = {}
    for params in instance_lists(wanted):
        found.update(
            ((r.fingerprint, r.starts_at), (r.id, r.status)) for r in conn.execute(_INSTANCES, params)
        )
    return {key: found[key] for key in wanted if key in found}


def instance_lists(keys: Sequence[InstanceKey]) -> Iterable[dict[str, list[Any]]]:
    """The two IN lists (``fingerprints_``, ``starts_``) that find these instances, a chunk of them at a time."""
    for chunk in _chunks(keys):
        yield {"fingerprints_": sorted({f for f, _ in chunk}), "starts_": sorted({at for _, at in chunk})}


def _chunks(values: Sequence[Any]) -> Iterable[list[Any]]:
    for start in range(0, len(values), CHUNK):
        yield list(values[start : start + CHUNK])


def current(conn: Connection) -> AlertBatch | None:
    """The batch the connection's transaction holds open, if any."""
    return conn.info.get(_KEY)


def hold(conn: Connection, batch: AlertBatch | None) -> None:
    """Open (a batch) or end (None) the connection's batch."""
    if batch is None:
        conn.info.pop(_KEY, None)
    else:
        conn.info[_KEY] = batch
