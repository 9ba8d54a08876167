"""What the scheduler says of a training job: running, waiting for resources, or finished, and on which nodes.

The job incident asks before it acts (its culprits must be in the job's allocation) and while it verifies (a job
waiting in the queue is not a failed recovery). Errors are the clients' :mod:`app.errors` types; the caller decides.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.clients import Clients
from app.episodes import scheduler_of
from app.job_phase import JobPhase, JobStatus, slurm_phase


def job_status(clients: Clients, target: Mapping[str, str]) -> JobStatus:
    """The job's phase and nodes. Raises the clients' BackendError/ConfigError."""
    if scheduler_of(target) == "kubernetes":
        pods = clients.kube.job_pods(target["namespace"], target["job"])
        phases = {p.get("status", {}).get("phase", "") for p in pods}
        nodes = tuple(sorted({p["spec"]["nodeName"] for p in pods if p.get("spec", {}).get("nodeName")}))
        if not pods:
            return JobStatus(JobPhase.UNKNOWN)
        if "Running" in phases:
            return JobStatus(JobPhase.RUNNING, nodes, "Running")
        if "Pending" in phases:
            return JobStatus(JobPhase.WAITING, nodes, "Pending")
        if phases == {"Succeeded"}:
            return JobStatus(JobPhase.COMPLETED, nodes, "Succeeded")
        return JobStatus(JobPhase.DIED, nodes, ",".join(sorted(phases)))
    slurm = clients.slurm
    info = slurm.job_info(target["job"])
    nodes = tuple(slurm.expand_hostlist(info.nodes)) if info.nodes else ()
    return JobStatus(slurm_phase(info.state), nodes, info.state)
