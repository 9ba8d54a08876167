"""Alerts in, incidents opened or attached, inside the caller's transaction.

Alerts naming the same training job join one job incident, whatever their playbook, rank or node; a node-scoped
alert on a node with no job opens a node incident; anything else is keyed by (playbook, target)
(:mod:`app.domain.episodes`). Duplicate deliveries, Alertmanager repeats and HA peers attach to the open incident (the
open key is unique in the store); a resolved alert closes an incident that has not started acting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.domain import episodes, paging, schedulers
from app.domain.alertmanager import Alert, Notification
from app.domain.errors import ParamError
from app.domain.playbooks import Playbook
from app.domain.states import NOT_ACTED, IncidentKind, IncidentOutcome, LedgerKind, State
from app.engine import fleet_hold, transitions
from app.engine.deps import EngineDeps, Target, render_target
from app.engine.effects import tell
from app.store import records, repairs
from app.store.rows import Incident
from app.workloads import Resolution

# Notices of unmatched alerts per ingestion (a storm of them is one ledger row each, not a message each).
MAX_UNMATCHED_NOTICES = 5


@dataclass
class IngestResult:
    alerts: int = 0
    opened: list[int] = field(default_factory=list)
    attached: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    unmatched: int = 0
    # The playbook of each opened incident, in order: labels the metric without another trip to the store.
    opened_playbooks: list[str] = field(default_factory=list)
    # New alerts no playbook matched, for people (bounded: the first MAX_UNMATCHED_NOTICES of one ingestion).
    unmatched_notices: list[paging.Notice] = field(default_factory=list)

    def add(self, other: IngestResult) -> None:
        self.alerts += other.alerts
        self.opened += other.opened
        self.attached += other.attached
        self.closed += other.closed
        self.unmatched += other.unmatched
        self.opened_playbooks += other.opened_playbooks
        room = MAX_UNMATCHED_NOTICES - len(self.unmatched_notices)
        self.unmatched_notices += other.unmatched_notices[: max(room, 0)]


def ingest(deps: EngineDeps, notification: Notification) -> IngestResult:
    """Ingest a whole notification in one transaction (``replay``, tests). Raises StoreUnavailable.

    The webhook does not call this: it queues the notification in the inbox (:mod:`app.engine.inbox`), whose
    worker calls :func:`ingest_alerts` a batch at a time.
    """
    result = IngestResult()
    prefetch_workloads(deps, notification.alerts)
    with deps.store.transaction() as conn:
        entries = [(notification, alert) for alert in notification.alerts]
        ingest_alerts(deps, conn, entries, deps.clock.now(), result)
    publish(deps, result)
    return result


def ingest_alerts(
    deps: EngineDeps,
    conn: Connection,
    entries: Sequence[tuple[Notification, Alert]],
    now: datetime,
    result: IngestResult,
) -> None:
    """Record these alerts (each with its notification) and open/attach/close incidents, inside the caller's
    transaction, in order. What each firing alert matches is worked out first, so that the batch reads its
    alerts and the open incidents of their episodes once (:func:`records.alert_batch_of`)."""
    matches = [_matches(deps, alert) if alert.status == "firing" else None for _, alert in entries]
    open_keys = [
        t.episode.open_key for m in matches if m is not None for t in m.targets if t.episode is not None
    ]
    with records.ledger_batch(conn), records.alert_batch_of(conn, entries, now, open_keys):
        for (notification, alert), matched in zip(entries, matches, strict=True):
            _ingest_alert(deps, conn, notification, alert, matched, now, result)
            result.alerts += 1


@dataclass(frozen=True)
class _Target:
    """One playbook an alert matches, and the target it renders (or why it cannot)."""

    playbook: Playbook
    target: Target | None
    episode: episodes.Episode | None
    error: ParamError | None = None


@dataclass(frozen=True)
class _Matches:
    """What a firing alert matches: no store read, so worked out for a whole batch before it reads the store."""

    workload: Resolution | None
    targets: tuple[_Target, ...]
    resolves_workloads: bool


def _matches(deps: EngineDeps, alert: Alert) -> _Matches:
    matched = deps.playbooks.match(alert.labels)
    workload = deps.workload_of(alert.labels) if matched else None
    targets = []
    for playbook in matched:
        try:
            target = render_target(playbook, alert.labels, alert.annotations, workload)
        except ParamError as exc:
            targets.append(_Target(playbook, None, None, exc))
            continue
        targets.append(_Target(playbook, target, episodes.episode_of(playbook, target.values, target.key)))
    return _Matches(workload, tuple(targets), any(_resolves_workloads(p) for p in matched))


def prefetch_workloads(deps: EngineDeps, alerts: Sequence[Alert]) -> None:
    """Ask the Kubernetes API which job each alert's pod belongs to (:mod:`app.workloads`), before the ingestion's
    transaction: the ingestion itself reads the answers from the resolver's cache and makes no network call."""
    if deps.workloads is not None:
        deps.workloads.prefetch(alerts)


def publish(deps: EngineDeps, result: IngestResult) -> None:
    """Count what a committed ingestion did in the self-metrics, and tell people of the alerts no playbook
    matched (after the commit: never a network call inside a transaction; at most :data:`MAX_UNMATCHED_NOTICES`)."""
    for playbook in result.opened_playbooks:
        deps.metrics.incidents_opened.labels(playbook).inc()
    for _ in result.closed:
        deps.metrics.incidents.labels(IncidentOutcome.RESOLVED).inc()
    for notice in result.unmatched_notices:
        tell(deps, None, notice)


def _ingest_alert(
    deps: EngineDeps,
    conn: Connection,
    notification: Notification,
    alert: Alert,
    matched: _Matches | None,
    now: datetime,
    result: IngestResult,
) -> None:
    alert_id, previous = records.upsert_alert(conn, alert, now)
    name = alert.labels.get("alertname", "")
    facts = {
        "fingerprint": alert.fingerprint,
        "status": alert.status,
        "starts_at": alert.starts_at.isoformat(),
    }
    if previous == "resolved" and alert.status == "firing":
        transitions.note(
            conn,
            now,
            None,
            LedgerKind.ALERT_OUT_OF_ORDER,
            f"{name}: firing notification after this instance resolved; ignored",
            facts,
        )
        return
    if previous is None:
        received = {**facts, "labels": dict(alert.labels), "receiver": notification.receiver}
        transitions.note(conn, now, None, LedgerKind.ALERT_RECEIVED, f"{name} {alert.status}", received)
    if matched is None:  # resolved
        _resolve(deps, conn, alert_id, name, now, result)
        return
    if not matched.targets:
        if previous is None:
            result.unmatched += 1
            transitions.note(conn, now, None, LedgerKind.UNMATCHED, f"{name}: no playbook matches", facts)
            if len(result.unmatched_notices) < MAX_UNMATCHED_NOTICES:
                result.unmatched_notices.append(
                    paging.unmatched_alert(
                        alertname=name,
                        fingerprint=alert.fingerprint,
                        labels=alert.labels,
                        annotations=alert.annotations,
                    )
                )
        return
    workload = matched.workload
    if workload is not None and matched.resolves_workloads:
        facts["job_lookup"] = workload.note
    for t in matched.targets:
        if t.target is None or t.episode is None:
            invalid = f"{name}: playbook {t.playbook.name}: {t.error}; no incident"
            transitions.note(
                conn, now, None, LedgerKind.TARGET_INVALID, invalid, {**facts, "labels": dict(alert.labels)}
            )
            continue
        # An instance already tied to an incident of this episode (or, per target, of this playbook) is a repeat:
        # attached already when that incident is open, and not a new fault when it has closed.
        if previous is not None and _had_incident(conn, alert_id, t.playbook.name, t.episode):
            continue
        _join(deps, conn, alert_id, alert, t.playbook, t.target, t.episode, now, facts, result)


def _join(
    deps: EngineDeps,
    conn: Connection,
    alert_id: int,
    alert: Alert,
    playbook: Playbook,
    target: Target,
    episode: episodes.Episode,
    now: datetime,
    facts: dict[str, Any],
    result: IngestResult,
) -> None:
    """Open the episode's incident, or attach the alert to the open one (naming its culprit, and letting a
    higher-priority playbook plan a job's recovery that has not started)."""
    name = alert.labels.get("alertname", "")
    incident = records.find_open_incident(conn, episode.open_key)
    if incident is None and episode.kind == IncidentKind.NODE:
        scheduler = schedulers.of_incident(target.values).name
        repair = repairs.open_repair(conn, scheduler, episode.culprit or "")
        if repair is not None:  # already out of service or on its way: the alert is evidence for that repair
            transitions.note(
                conn,
                now,
                repair.incident_id,
                LedgerKind.ALERT_ABSORBED,
                f"{name} on node {episode.culprit}: the node is already in repair #{repair.id} ({repair.state})",
                {**facts, "node": episode.culprit, "repair_id": repair.id},
            )
            return
    if incident is None:
        incident_id = transitions.open_incident(
            conn,
            now,
            _incident_values(deps, alert, playbook, target, episode, now),
            alert_id,
            f"{episode.kind} incident {episode.open_key}: playbook {playbook.name} on {target.key}"
            + (f"; culprit {episode.culprit}" if episode.culprit else "")
            + (f"; job from the API: {facts['job_lookup']}" if facts.get("job_lookup") else ""),
            {**facts, "target": dict(target.values), "kind": episode.kind, "culprit": episode.culprit},
        )
        if incident_id is not None:
            result.opened.append(incident_id)
            result.opened_playbooks.append(playbook.name)
            return
        incident = records.find_open_incident(conn, episode.open_key)  # a concurrent writer opened it first
        if incident is None:
            return
    notes = []
    named = None
    if episode.culprit:
        named = episodes.add_culprit(
            incident.culprits, episode.culprit, name, _culprit_reason(alert), playbook.name
        )
        if named is not None:
            notes.append(f"culprit {episode.culprit}")
    leading = None
    if episode.kind == IncidentKind.JOB and not incident.acted and _leads(deps, playbook, incident):
        leading = _leading(playbook, target, alert)
        notes.append(f"playbook {playbook.name} now plans the recovery")
    message = (
        f"{name} attached to open incident"
        + (f" ({'; '.join(notes)})" if notes else "")
        + (f"; job from the API: {facts['job_lookup']}" if facts.get("job_lookup") else "")
    )
    data = {**facts, "playbook": playbook.name, "node": target.node}
    # A known culprit ends the correlation wait of an incident that has not acted.
    act_now = named is not None and not incident.acted
    if transitions.attach(
        conn, now, incident, alert_id, message, data, culprits=named, act_now=act_now, leading=leading
    ):
        result.attached.append(incident.id)


def _incident_values(
    deps: EngineDeps,
    alert: Alert,
    playbook: Playbook,
    target: Target,
    episode: episodes.Episode,
    now: datetime,
) -> dict[str, Any]:
    job = episode.kind == IncidentKind.JOB
    return {
        **_leading(playbook, target, alert).columns(),
        "job": target.job,
        "kind": episode.kind,
        "open_key": episode.open_key,
        "state": State.OPEN,
        "culprits": episodes.add_culprit(
            (), episode.culprit, alert.labels.get("alertname", ""), _culprit_reason(alert), playbook.name
        )
        if episode.culprit
        else (),
        "act_after": episodes.correlation_end(now, deps.settings.episodes.correlation_seconds)
        if job
        else None,
        "alert_starts_at": alert.starts_at,
        "generator_url": alert.generator_url,
        "opened_at": now,
        "updated_at": now,
        "next_run_at": now,
    }


def _leading(playbook: Playbook, target: Target, alert: Alert) -> transitions.Leading:
    """What the playbook that plans the incident's recovery, and the alert it matched, set. A job incident's node
    is the culprit's (its ``culprits``), not the reporting rank's; its target key is the job."""
    episode = episodes.episode_of(playbook, target.values, target.key)
    job = episode.kind == IncidentKind.JOB
    return transitions.Leading(
        playbook=playbook.name,
        target_key=episode.open_key.removeprefix("job:") if job else target.key,
        target=target.values,
        node=None if job else target.node,
        serialize_key=None if job else target.serialize_key,
        labels=alert.labels,
        annotations=alert.annotations,
    )


def _leads(deps: EngineDeps, playbook: Playbook, incident: Incident) -> bool:
    current = deps.playbooks.get(incident.playbook)
    if current is None or current.name == playbook.name:
        return current is None
    return episodes.leading_playbook((current, playbook)) is playbook


def _culprit_reason(alert: Alert) -> str:
    """What the alert says of its node, beside its name (the culprit's ``source``): ``xid=79 gpu=3``."""
    labels = alert.labels
    detail = " ".join(f"{k}={labels[k]}" for k in ("xid", "gpu", "error_class") if labels.get(k))
    return (detail or labels.get("summary", "") or "named by the alert")[:300]


def _resolve(
    deps: EngineDeps, conn: Connection, alert_id: int, name: str, now: datetime, result: IngestResult
) -> None:
    for incident in records.incidents_for_alert(conn, alert_id):
        if records.firing_alert_count(conn, incident.id) > 0:
            continue  # other alerts of this incident still fire
        if incident.open_key is None:
            if incident.acted and incident.on_resolved_state is None and _has_on_resolved(deps, incident):
                transitions.schedule_undo(conn, now, incident, f"{name} resolved: undo steps scheduled")
            continue
        if fleet_hold.waits_for_restart(incident):
            # A job held by a shared cause or the storm guard died: its recovery waits on (the hold sees the cause
            # clear, the guard its turn).
            transitions.fleet_released(conn, now, incident)
            continue
        if incident.state in NOT_ACTED and not incident.acted and incident.claimed_by is None:
            outcome = IncidentOutcome.BLOCKED if incident.held_by_guard else IncidentOutcome.RESOLVED
            transitions.resolved_before_acting(
                conn, now, incident, outcome, f"{name} resolved before any action"
            )
            result.closed.append(incident.id)
        else:
            transitions.alert_resolved(
                conn, now, incident, f"{name} resolved while the incident is {incident.state}"
            )


def _resolves_workloads(playbook: Playbook) -> bool:
    """Whether the playbook's target is a scheduler's whose jobs are looked up from their pods (Kubernetes)."""
    scheduler = schedulers.of(playbook.target)
    return scheduler is not None and scheduler.resolves_workloads


def _has_on_resolved(deps: EngineDeps, incident: Incident) -> bool:
    playbook = deps.playbooks.get(incident.playbook)
    return bool(playbook and playbook.on_resolved)


def _had_incident(conn: Connection, alert_id: int, playbook: str, episode: episodes.Episode) -> bool:
    for incident in records.incidents_for_alert(conn, alert_id):
        if episode.kind != IncidentKind.TARGET and incident.kind == episode.kind:
            return True
        if incident.playbook == playbook:
            return True
    return False
