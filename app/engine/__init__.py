"""The engine: notifications queued and ingested (inbox, ingest), the incident lifecycle (worker ticks), operator
controls, and views."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from app.domain.alertmanager import Notification
from app.domain.states import IncidentOutcome, StepStatus
from app.engine import guard_facts, transitions, vitals
from app.engine.deps import EngineDeps
from app.engine.explain import explain
from app.engine.fleet_hold import FleetHolds
from app.engine.inbox import Inbox
from app.engine.ingest import IngestResult, ingest
from app.engine.lifecycle import Lifecycle
from app.engine.repair import NodeRepairs
from app.engine.retention import Retention
from app.store import records
from app.wakeup import Wakeup

__all__ = ["Engine", "EngineDeps", "IngestResult"]


class Engine:
    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self.inbox = Inbox(deps)
        self.lifecycle = Lifecycle(deps)
        self.repairs = NodeRepairs(deps)
        self.retention = Retention(deps)

    @property
    def fleet(self) -> FleetHolds:
        """Fleet incidents (one shared cause for many jobs): listed, and released by a person."""
        return self.lifecycle.fleet

    @property
    def wakeup(self) -> Wakeup:
        """Set when there is new work for a worker (a notification accepted), in this process or on this host."""
        return self.inbox.wakeup

    def accept(self, notification: Notification, body: bytes) -> int:
        """The webhook's part: commit the notification to the inbox. Returns its inbox id."""
        return self.inbox.accept(notification, body)

    def ingest(self, notification: Notification) -> IngestResult:
        """Ingest a notification now, in one transaction, bypassing the inbox (``replay``, tests)."""
        return ingest(self.deps, notification)

    def work_once(self, worker: str) -> bool:
        """One batch from the inbox, one incident tick, one node repair step and one retention batch, so that none
        starves the others. False when idle."""
        ingested = self.inbox.ingest_next()
        ticked = self.lifecycle.work_once(worker)
        repaired = self.repairs.work_once(worker)
        pruned = self.retention.work_once(worker)
        return ingested is not None or ticked is not None or repaired is not None or pruned

    def run_until_idle(self, worker: str = "inline", limit: int = 1000) -> int:
        """Work until the inbox is empty and no incident is due (tests, `replay`). Returns the number of rounds."""
        rounds = 0
        while rounds < limit and self.work_once(worker):
            rounds += 1
        return rounds

    def explain(self, notification: Notification) -> dict[str, Any]:
        return explain(self.deps, notification)

    # --- operator controls ------------------------------------------------------------------------------------

    def set_paused(self, paused: bool, reason: str, by: str) -> dict[str, Any]:
        now = self.deps.clock.now()
        value = {"paused": paused, "reason": reason, "by": by, "at": now.isoformat()}
        with self.deps.store.transaction() as conn:
            transitions.paused(conn, now, value)
        self.deps.metrics.paused.set(1 if paused else 0)
        return value

    def approve_step(self, incident_id: int, step_id: int, by: str) -> dict[str, Any]:
        """Approve a step that waits for approval; the worker runs it on its next look at the incident."""
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            step = next((s for s in records.get_steps(conn, incident_id) if s.id == step_id), None)
            if step is None:
                raise LookupError(f"incident {incident_id} has no step {step_id}")
            if step.status != StepStatus.AWAITING_APPROVAL:
                raise ValueError(f"step {step_id} is {step.status}, not awaiting approval")
            transitions.approve_step(conn, now, incident_id, step, by)
            incident = records.get_incident(conn, incident_id)
            return incident.as_dict() if incident is not None else {}

    def mark_handled(self, incident_id: int, by: str, note: str) -> dict[str, Any]:
        """An operator takes an open incident over: it closes as ``handled`` and Nightshift stops acting on it."""
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            incident = records.get_incident(conn, incident_id)
            if incident is None:
                raise LookupError(f"incident {incident_id} not found")
            if incident.open_key is None:
                raise ValueError(f"incident {incident_id} is already closed ({incident.outcome})")
            claimed_until = incident.claim_expires_at
            if incident.claimed_by is not None and claimed_until is not None and claimed_until > now:
                raise ValueError(
                    f"incident {incident_id} is being worked on right now; try again in a moment"
                )
            reason = f"handled by {by}" + (f": {note}" if note else "")
            transitions.close(conn, now, incident, IncidentOutcome.HANDLED, reason, {"by": by})
        self.deps.metrics.incidents.labels(IncidentOutcome.HANDLED).inc()
        return self.incident(incident_id) or {}

    def status(self) -> dict[str, Any]:
        with self.deps.store.read() as conn:
            pause = records.get_control(conn, "pause") or {"paused": False}
            paused, _ = self.deps.pause_state(conn)
            credentials = vitals.credentials(self.deps, records.controls_with_prefix(conn, "credential:"))
            by_state = records.count_incidents_by(conn, "state")
        return {
            "paused": paused,
            "pause": pause,
            "kill_switch_setting": self.deps.settings.guards.kill_switch,
            "credentials": credentials,
            "incidents_by_state": by_state,
            "inbox": self.inbox_stats(),
            "playbooks": len(self.deps.playbooks.playbooks),
            "whitelisted_actions": [grant.action for grant in self.deps.permissions.grants],
        }

    # --- views ------------------------------------------------------------------------------------------------

    def incident(self, incident_id: int) -> dict[str, Any] | None:
        with self.deps.store.read() as conn:
            row = records.get_incident(conn, incident_id)
            if row is None:
                return None
            return {
                "incident": row.as_dict(),
                "alerts": [alert.as_dict() for alert in records.get_alerts_for_incident(conn, incident_id)],
                "steps": [step.as_dict() for step in records.get_steps(conn, incident_id)],
                "ledger": [entry.as_dict() for entry in records.ledger_for(conn, incident_id)],
            }

    def incidents(self, **filters: Any) -> list[dict[str, Any]]:
        with self.deps.store.read() as conn:
            return [row.as_dict() for row in records.list_incidents(conn, **filters)]

    def job_incidents(self, limit: int = 200) -> dict[str, list[dict[str, Any]]]:
        """For the job view: the newest incident of each job seen (``latest``) and every open incident (``open``)."""
        with self.deps.store.read() as conn:
            return {
                "latest": records.latest_incident_per_job(conn, limit),
                "open": [row.as_dict() for row in records.list_incidents(conn, open_only=True, limit=1000)],
            }

    def inbox_stats(self) -> dict[str, Any]:
        with self.deps.store.read() as conn:
            return records.inbox_stats(conn)

    def blast_radius(self) -> dict[str, Any]:
        """Nodes taken out of service within the blast-radius window now, and the limit the guard holds them to."""
        g = self.deps.settings.guards
        with self.deps.store.read() as conn:
            nodes = guard_facts.taken_out_nodes(
                conn, self.deps.settings, self.deps.registry, self.deps.clock.now()
            )
        return {
            "nodes": sorted(nodes),
            "limit": g.blast_radius_max_nodes,
            "window_seconds": g.blast_radius_window_seconds,
        }

    def node_remediations(self, days: int) -> dict[str, Any]:
        """Over the last ``days`` days: attempts per (node, outcome) and incidents opened per node."""
        since = self.deps.clock.now() - timedelta(days=days)
        with self.deps.store.read() as conn:
            return {
                "since": since,
                "attempts": records.attempts_by_node(conn, since),
                "incidents": records.incidents_by_node(conn, since),
            }
