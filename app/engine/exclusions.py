"""The nodes a job's next recovery lets it back on (:mod:`app.domain.exclusions` decides): the ones Nightshift excluded
from it itself, whose repair has returned them to service since, as the scheduler confirms now.

Bounded: the job's rows are at most the nodes an exclusion may name; the scheduler is asked only about nodes whose
repair returned them, at most :data:`MAX_ASKED` a recovery (the others wait for the next one), each bounded by the
client's timeouts; a node it cannot tell about stays excluded.
"""

from __future__ import annotations

from app.domain import exclusions, schedulers
from app.domain.errors import BackendError, ConfigError
from app.domain.states import IncidentKind
from app.engine.deps import EngineDeps
from app.engine.scheduler_backends import backend
from app.store import records, repairs
from app.store.rows import Incident

MAX_ASKED = 64  # nodes the scheduler is asked about in one recovery's plan


def returned_nodes(deps: EngineDeps, inc: Incident) -> tuple[str, ...]:
    """The nodes ``inc``'s job may run on again: dropped from its exclusion list by the next recovery."""
    job = schedulers.job_identity(inc.target)
    scheduler = schedulers.of(inc.target)
    if inc.kind != IncidentKind.JOB or job is None or scheduler is None:
        return ()
    found = []
    with deps.store.read() as conn:
        for row in records.exclusions_of_job(conn, job):
            latest = repairs.list_repairs(conn, node=row["node"], limit=1)
            closed = latest[0].closed_at if latest else None
            state = latest[0].state if latest and closed and closed >= row["added_at"] else None
            found.append(exclusions.Excluded(row["node"], row["added_at"], state))
    candidates = [n for n in found if n.repair in exclusions.IN_SERVICE_AFTER_REPAIR][:MAX_ASKED]
    asked = backend(deps, scheduler.name)
    checked = []
    for node in candidates:
        try:
            in_service: bool | None = asked.in_service(node.node)
        except (BackendError, ConfigError):
            in_service = None
        checked.append(exclusions.Excluded(node.node, node.added_at, node.repair, in_service))
    return exclusions.returned(checked)
