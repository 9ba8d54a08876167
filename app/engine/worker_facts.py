"""The worker's facts for :func:`app.domain.incident_policy.decide`: from the store, the scheduler and Prometheus, and
the diagnosis (its collect steps run as step rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.domain import episodes, schedulers
from app.domain import incident_policy as policy
from app.domain.errors import BackendError, ConfigError
from app.domain.outcome import Ok
from app.domain.playbooks import Playbook
from app.domain.states import IncidentKind, StepStatus
from app.engine import guard_facts, transitions
from app.engine.deps import EngineDeps
from app.engine.exclusions import returned_nodes
from app.engine.fleet_hold import FleetHolds
from app.engine.scheduler_backends import job_status, pool_facts
from app.engine.steps import StepRunner
from app.store import repairs
from app.store.rows import Incident


class WorkerSource:
    """Facts as the worker gathers them (implements :class:`app.engine.facts.Source`)."""

    def __init__(self, deps: EngineDeps, steps: StepRunner, fleet: FleetHolds):
        self.deps = deps
        self.steps = steps
        self.fleet_holds = fleet

    def diagnosis(self, inc: Incident, playbook: Playbook) -> Incident:
        deps = self.deps
        with deps.store.transaction() as conn:
            inc = transitions.diagnosing(conn, deps.clock.now(), inc)
        adopted = self.fleet_holds.adopted_diagnosis(inc)
        if adopted is not None:  # a fleet incident's member: its sampled diagnosis, this job's log unread
            with deps.store.transaction() as conn:
                return transitions.diagnosed(conn, deps.clock.now(), inc, adopted, None)
        logs = []
        for step in self.steps.materialise(inc, playbook.collect, attempt=0, phase="collect"):
            if step.status == StepStatus.PENDING:
                outcome = self.steps.execute(inc, step)
                if isinstance(outcome, Ok) and outcome.data.get("log"):
                    logs.append(str(outcome.data["log"]))
        diagnosis = deps.diagnose(inc.labels, "\n".join(logs)).as_dict()
        culprit = (diagnosis.get("culprit") or {}).get("node")
        named = inc.culprits
        if inc.kind == IncidentKind.JOB:
            peers, reporters = self.fleet_holds.lost_peers("\n".join(logs))
            if peers and culprit in reporters:
                culprit = None  # a rank that logged a lost peer: the peer is the suspect, never the logger
            for node, source in [
                *((p, "lost peer") for p in peers),
                *([(culprit, "diagnosis")] if culprit else []),
            ]:
                named = episodes.add_culprit(named, node, source, diagnosis["summary"][:300]) or named
        with deps.store.transaction() as conn:
            return transitions.diagnosed(
                conn, deps.clock.now(), inc, diagnosis, named if named is not inc.culprits else None
            )

    def job_status(self, inc: Incident) -> policy.JobStatus | policy.JobUnread:
        try:
            return job_status(self.deps, inc.target)
        except (BackendError, ConfigError) as exc:
            tries = inc.job_status_tries + 1  # this read included
            return policy.JobUnread(str(exc), tries=tries, configured=not isinstance(exc, ConfigError))

    def history(self, inc: Incident, playbook: Playbook) -> guard_facts.History:
        deps = self.deps
        read = guard_facts.read_node_history if inc.kind == IncidentKind.NODE else guard_facts.read_history
        with deps.store.read() as conn:
            return read(
                conn, deps.settings, deps.registry, playbook, inc, deps.clock.now(), deps.pause_state(conn)
            )

    def pool(self, inc: Incident, node: str) -> Mapping[str, Any] | None:
        return pool_facts(self.deps, schedulers.of(inc.target), node)[0]

    def recheck(self, inc: Incident, expr: str) -> policy.Recheck:
        try:
            samples = self.deps.clients.prometheus.query(expr)
        except (BackendError, ConfigError) as exc:
            return policy.Recheck(expr, error=str(exc))
        return policy.Recheck(expr, tuple({"labels": dict(s.labels), "value": s.value} for s in samples))

    def fleet(self, inc: Incident) -> tuple[policy.FleetHold, Incident]:
        until, inc = self.fleet_holds.hold(inc)
        return policy.FleetHold(until or self.fleet_holds.storm_wait(inc)), inc

    def blame(self, inc: Incident, culprits: Sequence[str]) -> policy.Blame:
        return self.fleet_holds.blame(inc, culprits)

    def returned(self, inc: Incident) -> tuple[str, ...]:
        return returned_nodes(self.deps, inc)

    def progress(self, inc: Incident) -> policy.Progress:
        expr = episodes.progress_query(inc.target)
        if expr is None:
            return policy.Progress(error="the job has no step counter to read")
        now = self.deps.clock.now()
        try:
            values = [
                self.deps.clients.prometheus.query(expr, at=at) for at in (now, now - policy.PROGRESS_WINDOW)
            ]
        except (BackendError, ConfigError) as exc:
            return policy.Progress(error=str(exc))
        current, before = (samples[0].value if samples else None for samples in values)
        return policy.Progress(now=current, before=before)

    def repair(self, inc: Incident) -> policy.RepairView:
        repair_id = next((c.repair_id for c in inc.culprits), None)
        with self.deps.store.read() as conn:
            repair = repairs.get_repair(conn, repair_id) if repair_id else None
        if repair is None:
            return policy.RepairView(repair_id, None)
        return policy.RepairView(repair.id, repair.state, repair.reason)
