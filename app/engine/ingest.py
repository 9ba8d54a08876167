"""Alerts in, incidents opened or attached, inside the caller's transaction.

The idempotency key of an incident is (playbook, target): duplicate deliveries, Alertmanager repeats and HA peers
attach to the open incident; a resolved alert closes an incident that has not started acting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection

from app.alertmanager import Alert, Notification
from app.engine.deps import EngineDeps, render_target
from app.errors import ParamError
from app.store import records

NOT_ACTED_STATES = ("open", "diagnosing", "waiting")


@dataclass
class IngestResult:
    alerts: int = 0
    opened: list[int] = field(default_factory=list)
    attached: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    unmatched: int = 0
    # The playbook of each opened incident, in order: labels the metric without another trip to the store.
    opened_playbooks: list[str] = field(default_factory=list)

    def add(self, other: IngestResult) -> None:
        self.alerts += other.alerts
        self.opened += other.opened
        self.attached += other.attached
        self.closed += other.closed
        self.unmatched += other.unmatched
        self.opened_playbooks += other.opened_playbooks


def ingest(deps: EngineDeps, notification: Notification) -> IngestResult:
    """Ingest a whole notification in one transaction (``replay``, tests). Raises StoreUnavailable.

    The webhook does not call this: it queues the notification in the inbox (:mod:`app.engine.inbox`), whose
    worker calls :func:`ingest_alerts` a batch at a time.
    """
    result = IngestResult()
    with deps.store.transaction() as conn:
        ingest_alerts(deps, conn, notification, notification.alerts, deps.clock.now(), result)
    publish(deps, result)
    return result


def ingest_alerts(
    deps: EngineDeps,
    conn: Connection,
    notification: Notification,
    alerts: Sequence[Alert],
    now: datetime,
    result: IngestResult,
) -> None:
    """Record these alerts of the notification and open/attach/close incidents, inside the caller's transaction."""
    for alert in alerts:
        _ingest_alert(deps, conn, notification, alert, now, result)
        result.alerts += 1


def publish(deps: EngineDeps, result: IngestResult) -> None:
    """Count what a committed ingestion did in the self-metrics."""
    for playbook in result.opened_playbooks:
        deps.metrics.incidents_opened.labels(playbook).inc()
    for _ in result.closed:
        deps.metrics.incidents.labels("resolved").inc()


def _ingest_alert(
    deps: EngineDeps,
    conn: Connection,
    notification: Notification,
    alert: Alert,
    now: datetime,
    result: IngestResult,
) -> None:
    row, previous = records.upsert_alert(conn, alert, notification, now)
    name = alert.labels.get("alertname", "")
    facts = {
        "fingerprint": alert.fingerprint,
        "status": alert.status,
        "starts_at": alert.starts_at.isoformat(),
    }
    if previous == "resolved" and alert.status == "firing":
        records.record(
            conn,
            now,
            "alert_out_of_order",
            f"{name}: firing notification after this instance resolved; ignored",
            data=facts,
        )
        return
    if previous is None:
        records.record(
            conn,
            now,
            "alert_received",
            f"{name} {alert.status}",
            data={**facts, "labels": dict(alert.labels), "receiver": notification.receiver},
        )
    if alert.status == "resolved":
        _resolve(deps, conn, row, name, now, result)
        return
    matched = deps.playbooks.match(alert.labels)
    if not matched:
        if previous is None:
            result.unmatched += 1
            records.record(conn, now, "unmatched", f"{name}: no playbook matches", data=facts)
        return
    for playbook in matched:
        try:
            target = render_target(playbook, alert.labels, alert.annotations)
        except ParamError as exc:
            records.record(
                conn,
                now,
                "target_invalid",
                f"{name}: playbook {playbook.name}: {exc}; no incident",
                data={**facts, "labels": dict(alert.labels)},
            )
            continue
        # An instance already tied to an incident of this playbook is a repeat: attached already when that incident
        # is open, and not a new fault when it has closed. Either way it never joins a second one.
        if previous is not None and _had_incident(conn, row["id"], playbook.name):
            continue
        open_key = f"{playbook.name}|{target.key}"
        incident = records.find_open_incident(conn, open_key)
        if incident is None:
            incident_id = records.insert_incident(
                conn,
                {
                    "playbook": playbook.name,
                    "target_key": target.key,
                    "target": dict(target.values),
                    "node": target.node,
                    "job": target.job,
                    "open_key": open_key,
                    "serialize_key": target.serialize_key,
                    "state": "open",
                    "labels": dict(alert.labels),
                    "annotations": dict(alert.annotations),
                    "alert_starts_at": alert.starts_at,
                    "generator_url": alert.generator_url,
                    "opened_at": now,
                    "updated_at": now,
                    "next_run_at": now,
                },
            )
            if incident_id is not None:
                records.link_alert(conn, incident_id, row["id"])
                records.record(
                    conn,
                    now,
                    "incident_opened",
                    f"playbook {playbook.name} on {target.key}",
                    incident_id=incident_id,
                    data={**facts, "target": dict(target.values)},
                )
                result.opened.append(incident_id)
                result.opened_playbooks.append(playbook.name)
                continue
            incident = records.find_open_incident(conn, open_key)  # a concurrent writer opened it first
            if incident is None:
                continue
        if records.link_alert(conn, incident["id"], row["id"]):
            records.record(
                conn,
                now,
                "alert_attached",
                f"{name} attached to open incident",
                incident_id=incident["id"],
                data=facts,
            )
            result.attached.append(incident["id"])


def _resolve(deps: EngineDeps, conn: Connection, alert_row, name: str, now, result: IngestResult) -> None:
    for incident in records.incidents_for_alert(conn, alert_row["id"]):
        if records.firing_alert_count(conn, incident["id"]) > 0:
            continue  # other alerts of this incident still fire
        if incident["open_key"] is None:
            if (
                incident["acted"]
                and incident["on_resolved_state"] is None
                and _has_on_resolved(deps, incident)
            ):
                records.update_incident(
                    conn, incident["id"], on_resolved_state="pending", next_run_at=now, updated_at=now
                )
                records.record(
                    conn,
                    now,
                    "on_resolved_scheduled",
                    f"{name} resolved: undo steps scheduled",
                    incident_id=incident["id"],
                )
            continue
        if incident["state"] in NOT_ACTED_STATES and not incident["acted"] and incident["claimed_by"] is None:
            outcome = "blocked" if incident["held_by_guard"] else "resolved"
            records.update_incident(
                conn,
                incident["id"],
                state=outcome,
                outcome=outcome,
                open_key=None,
                closed_at=now,
                updated_at=now,
                next_run_at=now,
                alert_resolved=True,
                finalize_pending=True,
                reason=f"{name} resolved before any action",
            )
            records.record(
                conn,
                now,
                "incident_closed",
                f"{outcome}: alert resolved before any action",
                incident_id=incident["id"],
                data={"outcome": outcome},
            )
            result.closed.append(incident["id"])
        else:
            records.update_incident(conn, incident["id"], alert_resolved=True, updated_at=now)
            records.record(
                conn,
                now,
                "alert_resolved",
                f"{name} resolved while the incident is {incident['state']}",
                incident_id=incident["id"],
            )


def _has_on_resolved(deps: EngineDeps, incident) -> bool:
    playbook = deps.playbooks.get(incident["playbook"])
    return bool(playbook and playbook.on_resolved)


def _had_incident(conn: Connection, alert_id: int, playbook: str) -> bool:
    return any(incident["playbook"] == playbook for incident in records.incidents_for_alert(conn, alert_id))
