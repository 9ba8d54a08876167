"""What the scheduler says of a training job: running, waiting for resources, or finished, and on which nodes.

The job incident asks before it acts (its culprits must be in the job's allocation) and while it verifies (a job
waiting in the queue is not a failed recovery). Errors are the clients' :mod:`app.errors` types; the caller decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from app.clients import Clients

# Slurm job states (squeue/scontrol long names) by what they mean for a recovery.
_SLURM_RUNNING = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"})
_SLURM_WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESIZING"})
# Ended on purpose or normally: finished, cancelled by someone, stopped at its time limit. Not ours to restart.
_SLURM_COMPLETED = frozenset({"COMPLETED", "CANCELLED", "TIMEOUT"})


class JobPhase(StrEnum):
    RUNNING = "running"
    WAITING = "waiting"  # queued: waiting for resources (or held)
    COMPLETED = "completed"  # ended on purpose or normally: nothing to recover
    DIED = "died"  # failed, node failure, out of memory, preempted...: recover it like a crash
    UNKNOWN = "unknown"  # the scheduler has no view of it (or this scheduler has no job lookup here)


@dataclass(frozen=True)
class JobStatus:
    phase: JobPhase
    nodes: tuple[str, ...] = ()
    state: str = ""  # the scheduler's own word


def slurm_phase(state: str) -> JobPhase:
    base = state.split()[0].upper() if state else ""
    if base in _SLURM_RUNNING:
        return JobPhase.RUNNING
    if base in _SLURM_WAITING:
        return JobPhase.WAITING
    if base in _SLURM_COMPLETED:
        return JobPhase.COMPLETED
    return JobPhase.DIED if base else JobPhase.UNKNOWN


def job_status(clients: Clients, target: Mapping[str, str]) -> JobStatus:
    """The job's phase and nodes. Raises the clients' BackendError/ConfigError."""
    if target.get("scheduler", "slurm") == "kubernetes":
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
