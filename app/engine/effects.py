"""Side effects the engine owes around an incident: Grafana annotations, notifications, storm notices,
credential health. None of them ever fails a remediation; each attempt is ledgered, and owed effects are retried on
later ticks (``finalize_pending``) up to a bound."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from app.actions.notify import send_notification
from app.domain.errors import BackendError, ConfigError
from app.domain.paging import Notice
from app.domain.states import IncidentOutcome, LedgerKind, NoticeKind, StepStatus
from app.engine import transitions
from app.engine.deps import EngineDeps
from app.store import records
from app.store.rows import Incident, StepRow

# Outcomes worth a message to humans; incidents that did nothing (resolved, ignored, benign, self-recovered) or that
# a person took over (handled) say nothing.
NOTIFY_OUTCOMES = frozenset(IncidentOutcome) - {
    IncidentOutcome.RESOLVED,
    IncidentOutcome.IGNORED,
    IncidentOutcome.HANDLED,
    IncidentOutcome.BENIGN,
    IncidentOutcome.SELF_RECOVERED,
}
FINALIZE_TRIES = 5


def tell(
    deps: EngineDeps,
    incident_id: int | None,
    notice: Notice,
    *,
    skip: frozenset[str] = frozenset(),
    about: Mapping[str, Any] | None = None,
) -> dict[str, bool]:
    """Send ``notice`` on every channel but ``skip`` (after the transition that owes it has committed: never a
    network call inside a transaction); each channel's outcome is one ledger row with its channel, the notice's
    kind, ``about`` and, failed, the reason. Returns whether each channel delivered it."""
    delivered = {}
    for outcome in send_notification(deps.clients, deps.settings, notice, skip=skip):
        reason = getattr(outcome, "reason", "")
        channel = str((outcome.data or {}).get("channel"))
        delivered[channel] = outcome.status == StepStatus.OK
        data = {**(about or {}), "status": outcome.status, "command": outcome.command, "channel": channel,
                **({"reason": reason} if reason else {})}  # fmt: skip
        message = f"{notice.subject}: {outcome.command}: {outcome.status}" + (f": {reason}" if reason else "")
        with deps.store.transaction() as conn:
            transitions.notified(conn, deps.clock.now(), incident_id, notice.kind, message, data)
    return delivered


def blast_radius_reached(deps: EngineDeps, incident_id: int | None, reason: str, waiting: str) -> None:
    """The blast radius holds back ``waiting`` (an incident's step, a node's repair): say so once per blast window,
    whichever tripped it first, not once per incident or node."""
    now = deps.clock.now()
    window = timedelta(seconds=deps.settings.guards.blast_radius_window_seconds)
    with deps.store.transaction() as conn:
        last = records.get_control(conn, "storm_notified_at")
        if last and datetime.fromisoformat(last) > now - window:
            return
        records.set_control(conn, "storm_notified_at", now.isoformat(), now)
    tell(
        deps,
        incident_id,
        Notice(
            NoticeKind.BLAST_RADIUS,
            "[nightshift] blast radius reached: destructive actions paused",
            f"{reason}\nReturn-to-service actions still run. {waiting} and later ones wait.",
            {"incident": incident_id, "guard": "blast_radius"},
        ),
    )


class Effects:
    def __init__(self, deps: EngineDeps):
        self.deps = deps

    def _annotation_failed(self, inc: Incident, message: str) -> None:
        with self.deps.store.transaction() as conn:
            transitions.note(conn, self.deps.clock.now(), inc.id, LedgerKind.ANNOTATION_ERROR, message)

    # --- Grafana ----------------------------------------------------------------------------------------------

    def _grafana_enabled(self) -> bool:
        return bool(self.deps.settings.grafana.url)

    def tags(self, inc: Incident) -> list[str]:
        tags = ["nightshift", f"playbook:{inc.playbook}"]
        nodes = [inc.node] if inc.node else []
        nodes += [c.node for c in inc.culprits if c.confirmed and c.node not in nodes]
        tags += [f"node:{node}" for node in nodes]
        if inc.job:
            tags.append(f"job:{inc.job}")
        if inc.outcome:
            tags.append(f"outcome:{inc.outcome}")
        return tags

    def _text(self, inc: Incident) -> str:
        diagnosis = inc.diagnosis or {}
        parts = [f"Nightshift incident #{inc.id}: {inc.playbook} on {inc.node or inc.job or '-'}"]
        if diagnosis.get("summary"):
            parts.append(f"Diagnosis: {diagnosis['summary']}")
        if inc.outcome:
            parts.append(f"IncidentOutcome: {inc.outcome} ({inc.reason})")
        return "\n".join(parts)

    def open_annotation(self, inc: Incident) -> Incident:
        """Start the incident's Grafana region (once; retried on later ticks when Grafana was down). Returns the
        incident's row as it is now."""
        if not self._grafana_enabled() or inc.annotation_id:
            return inc
        try:
            annotation_id = self.deps.clients.grafana.create_annotation(
                text=self._text(inc), tags=self.tags(inc), time=inc.opened_at
            )
        except (BackendError, ConfigError) as exc:
            self._annotation_failed(inc, f"creating the Grafana annotation failed: {exc}")
            return inc
        with self.deps.store.transaction() as conn:
            return transitions.annotation_opened(
                conn, self.deps.clock.now(), inc, annotation_id, self.tags(inc)
            )

    def _close_annotation(self, inc: Incident) -> bool:
        if not self._grafana_enabled():
            return True
        grafana = self.deps.clients.grafana
        end = inc.closed_at or self.deps.clock.now()
        try:
            if inc.annotation_id:
                grafana.close_annotation(
                    inc.annotation_id, time_end=end, text=self._text(inc), tags=self.tags(inc)
                )
                message = f"Grafana annotation {inc.annotation_id} closed"
            else:
                annotation_id = grafana.create_annotation(
                    text=self._text(inc), tags=self.tags(inc), time=inc.opened_at, time_end=end
                )
                message = f"Grafana annotation {annotation_id} created as a closed region"
        except (BackendError, ConfigError) as exc:
            self._annotation_failed(inc, f"closing the Grafana annotation failed: {exc}")
            return False
        with self.deps.store.transaction() as conn:
            transitions.annotation_closed(conn, self.deps.clock.now(), inc, message, self.tags(inc))
        return True

    # --- notifications ----------------------------------------------------------------------------------------

    def _notify(self, incident_id: int | None, notice: Notice) -> None:
        tell(self.deps, incident_id, notice)

    def _summary(self, inc: Incident) -> tuple[str, str]:
        with self.deps.store.read() as conn:
            steps = records.get_steps(conn, inc.id)
        lines = [
            self._text(inc),
            f"Details: {self.deps.settings.external_url.rstrip('/')}/incidents/{inc.id}",
        ]
        for step in steps:
            if step.phase == "collect":
                continue
            lines.append(f"- [{step.status}] {step.name}: {step.summary or step.reason}")
        subject = f"[nightshift] {inc.outcome}: {inc.playbook} on {inc.node or inc.job or '-'}"
        return subject, "\n".join(lines)

    # --- finishing ----------------------------------------------------------------------------------------------

    def finalize(self, inc: Incident) -> datetime | None:
        """Close the annotation and send the outcome notice; retried on later ticks while they fail (a retry sends
        only to the channels that have not delivered it: ``delivered``), at most :data:`FINALIZE_TRIES` times
        (``finalize_tries``)."""
        annotated = self._close_annotation(inc)
        delivered = frozenset(inc.delivered or ())
        notified = True
        if inc.outcome in NOTIFY_OUTCOMES:
            subject, text = self._summary(inc)
            data = {"incident": inc.id, "outcome": inc.outcome, "labels": inc.labels}
            sent = tell(self.deps, inc.id, Notice(NoticeKind.OUTCOME, subject, text, data), skip=delivered)
            delivered |= {channel for channel, ok in sent.items() if ok}
            notified = all(sent.values())
        with self.deps.store.transaction() as conn:
            now = self.deps.clock.now()
            if (annotated and notified) or inc.finalize_tries + 1 >= FINALIZE_TRIES:
                transitions.finalized(conn, now, inc, delivered)
                return None
            transitions.finalize_retried(conn, now, inc, delivered)
        return self.deps.clock.now() + timedelta(seconds=self.deps.settings.guards.defer_seconds)

    def storm(self, inc: Incident, reason: str) -> None:
        """Blast radius tripped by an incident's step: say so once per blast window, not once per incident."""
        blast_radius_reached(self.deps, inc.id, reason, f"Incident #{inc.id}")

    def fleet_incident(self, incident_id: int, notice: Notice) -> None:
        """A shared cause held job recoveries (app/engine/fleet_hold.py): told once, asking a person."""
        self._notify(incident_id, notice)

    def approval_requested(self, inc: Incident, step: StepRow) -> None:
        url = f"{self.deps.settings.external_url.rstrip('/')}/incidents/{inc.id}"
        self._notify(
            inc.id,
            Notice(
                NoticeKind.APPROVAL,
                f"[nightshift] approval needed: {step.name} on {inc.node or inc.job}",
                f"Incident #{inc.id} ({inc.playbook}) waits for approval of step {step.name}:\n"
                f"{step.command}\nApprove: {url}",
                {"incident": inc.id, "step": step.id},
            ),
        )

    def credential_error(self, action: str, reason: str) -> None:
        backend = action.split(".", 1)[0]
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            records.set_control(
                conn,
                f"credential:{backend}",
                {"state": "credential_error", "reason": reason, "at": now.isoformat()},
                now,
            )
