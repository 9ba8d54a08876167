"""View models of the operator UI: pure functions from the engine's rows to what the templates show.

No Flask, no store, no clock: each function takes rows (as :class:`app.engine.Engine` returns them) and plain values,
and returns frozen dataclasses. The rules live here, so they are unit-tested without a server: a job's state, the
lemon-node ranking, which links are safe to render, and how times are written (UTC, ISO 8601, ``Z``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from app.domain import schedulers
from app.domain.states import IncidentOutcome, LedgerKind, State, StepStatus

Row = Mapping[str, Any]

# Outcomes after which a job is healthy again: fixed, gone before we acted, deliberately ignored, taken over, or
# nothing to fix.
GOOD_OUTCOMES = frozenset(
    {
        IncidentOutcome.RECOVERED,
        IncidentOutcome.RESOLVED,
        IncidentOutcome.IGNORED,
        IncidentOutcome.HANDLED,
        IncidentOutcome.BENIGN,
        IncidentOutcome.SELF_RECOVERED,
    }
)
# Every outcome an incident closes with (the history filter offers these).
OUTCOMES = tuple(sorted(IncidentOutcome))
# Step statuses the UI styles; any other value (a newer engine) is shown as text with a neutral style.
STEP_STATUSES = frozenset(StepStatus)
GRAFANA_PAD = timedelta(minutes=15)  # context either side of the incident's region on the dashboard


def utc(value: datetime | str | None) -> str:
    """A time as UTC ISO 8601 to the second (``2026-12-02T03:00:00Z``); ``-`` for none; unparsable text as is."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        text = value
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            return text
    if value.tzinfo is None:  # the store hands out aware datetimes; a naive one here is UTC by convention
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def safe_url(url: str | None) -> str | None:
    """``url`` when it is an absolute http(s) URL, else None: alert-derived links never become ``javascript:``."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return url if parts.scheme in ("http", "https") and parts.netloc else None


# --- overview -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    job: str
    state: str  # enabled | recovering | needs_human | credential_error
    why: str
    incident_id: int  # the incident that decides the state
    playbook: str
    node: str | None
    since: datetime | None


def job_state(
    latest: Row, open_incidents: Sequence[Row], credentials: Mapping[str, Any]
) -> tuple[str, str, Row]:
    """The state of one job, why, and the incident that decides it.

    - an open incident (any open state): ``credential_error`` when the backend of its target's scheduler has its
      credentials rejected right now (nothing can act), else ``recovering``;
    - else by the newest incident: ``enabled`` after a good outcome (recovered, resolved, ignored, handled) or once
      its alerts have resolved (DESIGN: needs_human "until the alert resolves"); ``credential_error`` after an
      incident that ended on rejected credentials; ``needs_human`` after any other outcome (advisory, failed,
      needs_human, blocked, unverified).

    ``latest`` rows come from ``Engine.job_incidents()`` and carry ``firing_alerts``; without it the alerts are
    taken as still firing. ``pending``: an open incident not yet past its correlation window and its look at the
    scheduler (state ``open``); ``completed``: the newest incident found that the scheduler says the job finished.
    """
    if open_incidents:
        incident = min(open_incidents, key=lambda row: row["id"])
        scheduler = schedulers.of(incident.get("target") or {})
        backend = scheduler.name if scheduler is not None else ""
        credential = credentials.get(backend) or {}
        if credential.get("state") == "credential_error":
            return (
                "credential_error",
                f"{backend} credentials rejected: {credential.get('reason', '')}",
                incident,
            )
        reason = f": {incident['reason']}" if incident.get("reason") else ""
        state = "pending" if incident["state"] == State.OPEN else "recovering"
        return state, f"incident #{incident['id']} {incident['state']}{reason}", incident
    outcome = latest.get("outcome") or latest["state"]
    if outcome == IncidentOutcome.COMPLETED:
        return "completed", latest.get("reason") or outcome, latest
    if outcome in GOOD_OUTCOMES:
        return "enabled", f"last incident {outcome}", latest
    if latest.get("firing_alerts", 1) == 0:
        return "enabled", f"last incident {outcome}; its alerts have resolved since", latest
    if outcome == "credential_error":
        return "credential_error", latest.get("reason") or outcome, latest
    reason = latest.get("reason") or ""
    return IncidentOutcome.NEEDS_HUMAN, f"{outcome}: {reason}" if reason else outcome, latest


def job_views(
    latest: Iterable[Row], open_incidents: Iterable[Row], credentials: Mapping[str, Any]
) -> list[JobView]:
    """One row per job seen in incidents, in the order of ``latest`` (newest first)."""
    open_by_job: dict[str, list[Row]] = {}
    for row in open_incidents:
        if row.get("job"):
            open_by_job.setdefault(row["job"], []).append(row)
    views = []
    for row in latest:
        state, why, decisive = job_state(row, open_by_job.get(row["job"], []), credentials)
        views.append(
            JobView(
                job=row["job"],
                state=state,
                why=why,
                incident_id=decisive["id"],
                playbook=decisive["playbook"],
                node=decisive.get("node"),
                since=decisive.get("closed_at") or decisive.get("opened_at"),
            )
        )
    return views


@dataclass(frozen=True)
class GuardView:
    paused: bool
    kill_switch_setting: bool
    paused_by: str
    reason: str
    changed_at: str | None
    blast_used: int
    blast_limit: int
    blast_nodes: tuple[str, ...]
    blast_window: str
    whitelisted: tuple[str, ...]


def guard_view(status: Mapping[str, Any], blast: Mapping[str, Any]) -> GuardView:
    """Kill switch and blast radius as the guard chain sees them now, from ``Engine.status()`` and
    ``Engine.blast_radius()``."""
    pause = status.get("pause") or {}
    seconds = int(blast["window_seconds"])
    return GuardView(
        paused=bool(status.get("paused")),
        kill_switch_setting=bool(status.get("kill_switch_setting")),
        paused_by=str(pause.get("by", "")),
        reason=str(pause.get("reason", "")),
        changed_at=pause.get("at"),
        blast_used=len(blast["nodes"]),
        blast_limit=int(blast["limit"]),
        blast_nodes=tuple(blast["nodes"]),
        blast_window=f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s",
        whitelisted=tuple(status.get("whitelisted_actions") or ()),
    )


@dataclass(frozen=True)
class CredentialView:
    backend: str
    state: str  # app.domain.schedulers.CREDENTIAL_STATES: unset | configured | credential_error
    reason: str
    at: str | None


def credential_views(credentials: Mapping[str, Any]) -> list[CredentialView]:
    return [
        CredentialView(
            backend=backend,
            state=str(value.get("state", "unknown")),
            reason=str(value.get("reason", "")),
            at=value.get("at"),
        )
        for backend, value in sorted(credentials.items())
    ]


# --- incident -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlertView:
    alertname: str
    status: str
    starts_at: datetime
    ends_at: datetime | None
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    prometheus_url: str | None  # generatorURL, only when it is an http(s) link
    generator_url: str  # as received, shown as text when it is not a safe link
    notifications: int


@dataclass(frozen=True)
class DiagnosisView:
    category: str
    confidence: float
    summary: str
    evidence: tuple[str, ...]
    xid: str | None


@dataclass(frozen=True)
class VerdictView:
    at: datetime
    guard: str
    decision: str  # pass | wait | stop
    reason: str


@dataclass(frozen=True)
class StepView:
    id: int
    attempt: int
    phase: str
    name: str
    action: str
    status: str
    css: str  # a known status, or "other"
    summary: str
    command: str
    exit_code: int | None
    output: str
    reason: str
    approval: bool
    approved_by: str | None
    approved_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    duration: float | None

    @property
    def awaiting_approval(self) -> bool:
        return self.status == StepStatus.AWAITING_APPROVAL


@dataclass(frozen=True)
class SampleView:
    at: datetime
    expr: str
    series: tuple[tuple[str, Any], ...]  # (labels as text, value)
    error: str | None


@dataclass(frozen=True)
class EventView:
    at: datetime
    kind: str
    message: str


@dataclass(frozen=True)
class IncidentView:
    incident: Row
    is_open: bool
    alerts: tuple[AlertView, ...]
    diagnosis: DiagnosisView | None
    verdicts: tuple[VerdictView, ...]
    steps: tuple[StepView, ...]
    samples: tuple[SampleView, ...]
    timeline: tuple[EventView, ...]
    grafana_url: str | None


def _pairs(mapping: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in sorted((mapping or {}).items()))


def _labels_text(labels: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def alert_view(row: Row) -> AlertView:
    return AlertView(
        alertname=row["alertname"],
        status=row["status"],
        starts_at=row["starts_at"],
        ends_at=row.get("ends_at"),
        labels=_pairs(row["labels"]),
        annotations=_pairs(row["annotations"]),
        prometheus_url=safe_url(row.get("generator_url")),
        generator_url=row.get("generator_url") or "",
        notifications=int(row.get("notifications") or 1),
    )


def diagnosis_view(diagnosis: Mapping[str, Any] | None) -> DiagnosisView | None:
    if not diagnosis:
        return None
    return DiagnosisView(
        category=str(diagnosis.get("category", "")),
        confidence=float(diagnosis.get("confidence") or 0.0),
        summary=str(diagnosis.get("summary", "")),
        evidence=tuple(str(line) for line in diagnosis.get("evidence") or ()),
        xid=None if diagnosis.get("xid") is None else str(diagnosis["xid"]),
    )


def step_view(row: Row) -> StepView:
    return StepView(
        id=row["id"],
        attempt=row["attempt"],
        phase=row["phase"],
        name=row["name"],
        action=row["action"],
        status=row["status"],
        css=row["status"] if row["status"] in STEP_STATUSES else "other",
        summary=row.get("summary") or "",
        command=row.get("command") or "",
        exit_code=row.get("exit_code"),
        output=row.get("output") or "",
        reason=row.get("reason") or "",
        approval=bool(row.get("approval")),
        approved_by=row.get("approved_by"),
        approved_at=row.get("approved_at"),
        started_at=row.get("started_at"),
        finished_at=row.get("finished_at"),
        duration=row.get("duration"),
    )


def grafana_link(
    url: str | None, dashboard_uid: str | None, opened_at: datetime, closed_at: datetime | None, now: datetime
) -> str | None:
    """The dashboard that carries the incident's annotation region, over the incident's time range (padded).

    Only with a dashboard UID: the engine then posts the annotation on that dashboard. Without one the annotation
    is an organisation annotation, shown by tag queries on any dashboard, and Grafana has no page to link to.
    """
    base = safe_url(url)
    if base is None or not dashboard_uid:
        return None
    start = int((opened_at - GRAFANA_PAD).timestamp() * 1000)
    end = int(((closed_at or now) + GRAFANA_PAD).timestamp() * 1000)
    return f"{base.rstrip('/')}/d/{dashboard_uid}?{urlencode({'from': start, 'to': end})}"


def incident_view(detail: Mapping[str, Any], grafana_url: str | None) -> IncidentView:
    """The incident page from ``Engine.incident(id)``; ``grafana_url`` comes from :func:`grafana_link`."""
    ledger = detail["ledger"]
    verdicts = tuple(
        VerdictView(
            at=row["ts"],
            guard=str(row["data"].get("guard", "")),
            decision=str(row["data"].get("decision", "")),
            reason=str(row["data"].get("reason", "")),
        )
        for row in ledger
        if row["kind"] == LedgerKind.GUARD
    )
    samples = tuple(
        SampleView(
            at=row["ts"],
            expr=str(row["data"].get("expr", "")),
            series=tuple(
                (_labels_text(sample.get("labels") or {}), sample.get("value"))
                for sample in row["data"].get("samples") or ()
            ),
            error=row["data"].get("error"),
        )
        for row in ledger
        if row["kind"] == LedgerKind.VERIFY_SAMPLE
    )
    incident = detail["incident"]
    return IncidentView(
        incident=incident,
        is_open=incident["open_key"] is not None,
        alerts=tuple(alert_view(row) for row in detail["alerts"]),
        diagnosis=diagnosis_view(incident.get("diagnosis")),
        verdicts=verdicts,
        steps=tuple(step_view(row) for row in detail["steps"]),
        samples=samples,
        timeline=tuple(EventView(at=row["ts"], kind=row["kind"], message=row["message"]) for row in ledger),
        grafana_url=grafana_url,
    )


# --- history and lemon nodes --------------------------------------------------------------------------------


def page(rows: Sequence[Row], limit: int) -> tuple[list[Row], int | None]:
    """The first ``limit`` of ``rows`` (fetched as ``limit + 1``, newest first), and the ``before`` id of the next
    page (None on the last)."""
    shown = list(rows[:limit])
    return shown, (shown[-1]["id"] if len(rows) > limit and shown else None)


@dataclass(frozen=True)
class NodeView:
    node: str
    remediations: int
    by_outcome: tuple[tuple[str, int], ...]  # outcome (``in_progress`` while unfinished) -> attempts
    incidents: int


def lemon_nodes(attempt_counts: Iterable[Row], incident_counts: Mapping[str, int]) -> list[NodeView]:
    """Nodes ranked by remediation attempts in the window, then by incidents opened, then by name.

    ``attempt_counts`` are ``(node, outcome, count)`` rows; nodes with incidents but no attempt (advisory mode,
    guards held) are listed after, with zero remediations.
    """
    outcomes: dict[str, dict[str, int]] = {}
    for row in attempt_counts:
        per_node = outcomes.setdefault(row["node"], {})
        key = row["outcome"] or "in_progress"
        per_node[key] = per_node.get(key, 0) + int(row["count"])
    nodes = set(outcomes) | set(incident_counts)
    views = [
        NodeView(
            node=node,
            remediations=sum(outcomes.get(node, {}).values()),
            by_outcome=tuple(sorted(outcomes.get(node, {}).items())),
            incidents=int(incident_counts.get(node, 0)),
        )
        for node in nodes
    ]
    return sorted(views, key=lambda v: (-v.remediations, -v.incidents, v.node))


@dataclass(frozen=True)
class RepairView:
    """A node's latest repair on the nodes page (``Engine.repairs.nodes()``)."""

    node: str
    scheduler: str
    state: str
    repair: int  # this node's repair number within the lemon window
    taken_out_at: str
    why: str  # the held reason, else the last step's outcome, else the request's reason
    verdict: str  # the validation's: pass | fail | "" (not validated)
    updated_at: str

    @property
    def held(self) -> bool:
        return self.state == "held"


def repair_view(row: Row) -> RepairView:
    steps = row.get("steps") or []
    last = steps[-1] if steps else None
    last_step = (
        f"{last['step']}: {last['status']}" + (f" ({last['reason']})" if last["reason"] else "")
        if last
        else ""
    )
    return RepairView(
        node=row["node"],
        scheduler=row["scheduler"],
        state=str(row["state"]),
        repair=int(row["repairs"] or 0),
        taken_out_at=utc(row["taken_out_at"]) if row.get("taken_out_at") else "",
        why=row.get("held_reason") or last_step or row.get("reason") or "",
        verdict=str((row.get("validation") or {}).get("verdict") or ""),
        updated_at=utc(row["updated_at"]),
    )


@dataclass(frozen=True)
class AdviceView:
    """The checkpoint-interval advice of a job as the job page shows it (app/domain/checkpoint_advice.py), or why
    none."""

    advised: str | None = None
    current: str | None = None
    advised_lost: str | None = None
    current_lost: str | None = None
    mtbf: str | None = None
    basis: str = ""
    reason: str = ""


def spoken_duration(seconds: float) -> str:
    """``5400`` → ``1h 30m``; under a minute, in seconds."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{rest // 60}m" if rest // 60 else ""]
    return " ".join(part for part in parts if part)


def advice_view(advice: Mapping[str, Any] | None, reason: str = "") -> AdviceView:
    """From :meth:`app.domain.checkpoint_advice.Advice.as_dict` (None, with ``reason``: no advice)."""
    if advice is None:
        return AdviceView(reason=reason)

    def lost(key: str) -> str | None:
        value = advice.get(key)
        return None if value is None else f"{value:.2f} GPU-hours a day"

    current = advice.get("current_interval_seconds")
    return AdviceView(
        advised=spoken_duration(advice["interval_seconds"]),
        current=None if current is None else spoken_duration(current),
        advised_lost=lost("advised_lost_gpu_hours_per_day"),
        current_lost=lost("current_lost_gpu_hours_per_day"),
        mtbf=spoken_duration(advice["job_mtbf_seconds"]),
        basis=str(advice.get("basis", "")),
    )
