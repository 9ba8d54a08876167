"""What reaches a person, and what pages one: the notices Nightshift owes people and the paging event of each.

Pure: no I/O. Slack and email get every notice (:func:`app.actions.notify.send_notification`); a paging channel
(PagerDuty Events v2) gets only the notices where a person is needed, and :func:`page_for` says which, from the
notice's :class:`app.domain.states.NoticeKind` (and, for an incident's outcome, the outcome in its ``data``):

* an incident that closed ``needs_human``, ``failed``, ``credential_error``, ``unverified`` or ``advisory`` (an
  advisory incident is a plan that only a person can carry out) — not ``recovered``, ``blocked``, ``resolved``;
* a node held after a failed validation or by the lemon rule (:func:`node_held`);
* an alert that no playbook matches (:func:`unmatched_alert`);
* the blast radius reached (destructive actions paused) and a step waiting for approval;
* a fleet incident or the fleet's restart storm guard, as its incident needing a person.

Each page has a ``dedup_key`` naming what it is about, so a repeated notice (a retried finalisation, an
Alertmanager repeat of an unmatched alert) updates the one open PagerDuty alert instead of opening another. A fleet
incident's is its cause's (``fleet/storage_io``): a cause that comes back (a flapping file system) updates the
alert of its last fleet incident while a person has not resolved it, and pages anew once they have.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.domain.clipping import clip_labels, clip_text
from app.domain.states import IncidentOutcome, NoticeKind

# PagerDuty Events v2 limits (developer.pagerduty.com, "Send an Alert Event").
MAX_SUMMARY = 1024
MAX_DEDUP_KEY = 255
MAX_DETAILS_TEXT = 4000  # the notice's text in custom_details (the whole event must stay under 512 KB)
# An unmatched alert's notice: its summary and description clipped, its labels through clip_labels.
MAX_ANNOTATION = 2000
MAX_NOTICE_LABEL = 200
SEVERITIES = ("critical", "error", "warning", "info")

# Incident outcomes that need a person, and how loudly.
PAGE_OUTCOMES = {
    IncidentOutcome.NEEDS_HUMAN: "critical",
    IncidentOutcome.FAILED: "critical",
    IncidentOutcome.CREDENTIAL_ERROR: "critical",
    IncidentOutcome.UNVERIFIED: "error",
    IncidentOutcome.ADVISORY: "warning",
}
# Notices that page as their incident's outcome (data: ``incident`` and ``outcome``).
AS_OUTCOME = frozenset({NoticeKind.OUTCOME, NoticeKind.FLEET_INCIDENT, NoticeKind.FLEET_STORM})
# An alert's own severity label (rules/README.md: critical | warning | info) carried to the page.
ALERT_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


@dataclass(frozen=True)
class Page:
    """One PagerDuty Events v2 ``trigger``: the fields of its ``payload`` plus the ``dedup_key`` and links."""

    dedup_key: str
    summary: str
    source: str
    severity: str
    event_class: str
    component: str = ""
    group: str = ""
    custom_details: Mapping[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()  # (href, text)


@dataclass(frozen=True)
class Notice:
    """A message for people: what it is about (``kind``), ``subject`` and ``text`` for chat and email, ``data``
    for machines and paging."""

    kind: NoticeKind
    subject: str
    text: str
    data: Mapping[str, Any]


def page_for(notice: Notice, external_url: str = "") -> Page | None:
    """The page a notice deserves, or None when it only informs (a recovery, a resolved alert)."""
    kind, subject, text, data = notice.kind, notice.subject, notice.text, notice.data
    labels: Mapping[str, Any] = data.get("labels") or {}
    source = str(data.get("node") or labels.get("Hostname") or labels.get("node") or "nightshift")
    details = {"text": clip_text(text, MAX_DETAILS_TEXT), **{k: v for k, v in data.items() if k != "labels"}}
    if labels:
        details["labels"] = clip_labels(labels)
    group = str(labels.get("slurm_job_id") or labels.get("train_job") or labels.get("namespace") or "")
    incident = data.get("incident")
    link = _incident_link(external_url, incident)
    outcome = data.get("outcome")
    if kind == NoticeKind.FLEET_INCIDENT and outcome in PAGE_OUTCOMES and data.get("fleet"):
        key, severity, event_class = f"fleet/{data['fleet']}", PAGE_OUTCOMES[outcome], str(outcome)
    elif kind in AS_OUTCOME and outcome in PAGE_OUTCOMES and incident is not None:
        key, severity, event_class = f"incident/{incident}", PAGE_OUTCOMES[outcome], str(outcome)
    elif kind == NoticeKind.NODE_HELD:
        key = f"node/{data.get('scheduler', '')}/{data['node']}/repair/{data.get('repair_id', '')}"
        severity, event_class, source = "critical", str(kind), str(data["node"])
        link = _url(external_url, "/nodes")
    elif kind == NoticeKind.UNMATCHED_ALERT:
        key = f"alert/{data.get('fingerprint', '')}"
        severity = ALERT_SEVERITY.get(str(labels.get("severity", "")), "warning")
        event_class = str(kind)
    elif kind == NoticeKind.BLAST_RADIUS:
        key, severity, event_class = f"blast_radius/{incident}", "critical", str(kind)
    elif kind == NoticeKind.APPROVAL:
        key, severity, event_class = f"approval/{data['step']}", "warning", str(kind)
    else:
        return None
    return Page(
        dedup_key=dedup_key(key),
        summary=_clip(subject, MAX_SUMMARY),
        source=source,
        severity=severity,
        event_class=event_class,
        component=str(labels.get("alertname", "")),
        group=group,
        custom_details=details,
        links=((link, "Nightshift"),) if link else (),
    )


def dedup_key(key: str) -> str:
    """``nightshift/<key>``, at most 255 characters (a longer key keeps its head and a hash of the whole)."""
    full = f"nightshift/{key}"
    if len(full) <= MAX_DEDUP_KEY:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:16]
    return f"{full[: MAX_DEDUP_KEY - 17]}#{digest}"


def node_held(
    *,
    node: str,
    scheduler: str,
    reason: str,
    repair_id: int,
    incident_id: int | None,
    external_url: str,
    taken_out: bool = True,
) -> Notice:
    """A node the repair lifecycle holds for a person (validation failed, lemon rule, not ours). ``taken_out``
    False: nothing took it out (its take-out was refused or failed, e.g. a name the scheduler does not know), so
    the notice says it is still in service and does not page (:func:`page_for` pages ``node_held`` only)."""
    if not taken_out:
        subject = f"[nightshift] node {node} not taken out of service; repair held ({scheduler})"
        text = "\n".join(
            [
                f"Nightshift did not take node {node} ({scheduler}) out of service: {reason}",
                "Its repair is held: Nightshift will not act on this node until it is released "
                f"(POST /api/v1/nodes/{node}/release): {_url(external_url, '/nodes')}",
            ]
        )
        data = {
            "node_not_taken_out": node,
            "node": node,
            "scheduler": scheduler,
            "repair_id": repair_id,
            "incident": incident_id,
            "reason": reason,
        }
        return Notice(NoticeKind.NODE_NOT_TAKEN_OUT, subject, text, data)
    subject = f"[nightshift] node {node} held for a person ({scheduler})"
    text = "\n".join(
        [
            f"Node {node} ({scheduler}) is out of service and held: {reason}",
            "Nightshift will not return it; release it after repair "
            f"(POST /api/v1/nodes/{node}/release) or look at it: {_url(external_url, '/nodes')}",
        ]
    )
    data = {
        "node_held": node,
        "node": node,
        "scheduler": scheduler,
        "repair_id": repair_id,
        "incident": incident_id,
        "reason": reason,
    }
    return Notice(NoticeKind.NODE_HELD, subject, text, data)


def unmatched_alert(
    *, alertname: str, fingerprint: str, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> Notice:
    """An alert that no playbook matched: nobody automated it, so a person must look."""
    where = (
        labels.get("Hostname")
        or labels.get("node")
        or labels.get("train_job")
        or labels.get("instance")
        or "-"
    )
    subject = _clip(f"[nightshift] no playbook for {alertname} on {where}", MAX_SUMMARY)
    summary = annotations.get("summary") or alertname
    lines = [clip_text(summary, MAX_ANNOTATION)]
    if annotations.get("description"):
        lines.append(clip_text(annotations["description"], MAX_ANNOTATION))
    lines.append("No playbook matches this alert: Nightshift recorded it and did nothing.")
    shown = clip_labels(labels, value=MAX_NOTICE_LABEL)
    lines.append("Labels: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    data = {"unmatched": clip_text(alertname, MAX_NOTICE_LABEL), "fingerprint": fingerprint, "labels": shown}
    return Notice(NoticeKind.UNMATCHED_ALERT, subject, "\n".join(lines), data)


def _incident_link(external_url: str, incident: Any) -> str:
    return _url(external_url, f"/incidents/{incident}") if incident is not None else ""


def _url(external_url: str, path: str) -> str:
    return f"{external_url.rstrip('/')}{path}" if external_url else ""


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
