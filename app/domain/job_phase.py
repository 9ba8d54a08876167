"""What the scheduler says of a training job, as a value: running, waiting for resources, finished, or died, and on
which nodes. Pure: no I/O (the lookup is :mod:`app.engine.scheduler_backends`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

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
    """A Slurm job state (``squeue``'s long name) by what it means for a recovery."""
    base = state.split()[0].upper() if state else ""
    if base in _SLURM_RUNNING:
        return JobPhase.RUNNING
    if base in _SLURM_WAITING:
        return JobPhase.WAITING
    if base in _SLURM_COMPLETED:
        return JobPhase.COMPLETED
    return JobPhase.DIED if base else JobPhase.UNKNOWN


# The status conditions by which each Kubernetes training kind says it has finished (type with status "True"): the
# batch/v1 Job controller, the Kubeflow training operator (PyTorchJob), the JobSet controller, Kubeflow Trainer v2.
FINISHED_CONDITIONS: dict[str, tuple[str, str]] = {
    "Job": ("Complete", "Failed"),
    "PyTorchJob": ("Succeeded", "Failed"),
    "JobSet": ("Completed", "Failed"),
    "TrainJob": ("Complete", "Failed"),
}


def finished_phase(kind: str, obj: Mapping[str, Any]) -> tuple[JobPhase, str] | None:
    """(COMPLETED or DIED, the condition) when the object's status says it has finished, else None."""
    succeeded, failed = FINISHED_CONDITIONS.get(kind, ("", ""))
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if not isinstance(condition, Mapping) or condition.get("status") != "True":
            continue
        if condition.get("type") == succeeded:
            return JobPhase.COMPLETED, succeeded
        if condition.get("type") == failed:
            reason = condition.get("reason")
            return JobPhase.DIED, f"{failed} ({reason})" if reason else failed
    return None


def workload_status(kind: str, obj: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> JobStatus:
    """A Kubernetes training job's status. Finished (completed, or died) from the job object's own conditions,
    which outlive its pods (the training operator's cleanPodPolicy and TTL remove them); a job suspended waits;
    otherwise from its pods' phases. ``obj`` None: the object was not read (kind unknown) or no longer exists."""
    nodes = tuple(sorted({p["spec"]["nodeName"] for p in pods if (p.get("spec") or {}).get("nodeName")}))
    if obj is not None:
        finished = finished_phase(kind, obj)
        if finished is not None:
            return JobStatus(finished[0], nodes, f"{kind} {finished[1]}")
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions):
            return JobStatus(JobPhase.WAITING, nodes, f"{kind} Suspended")
    if not pods:
        return JobStatus(JobPhase.UNKNOWN, (), f"{kind} not found" if obj is None and kind else "no pods")
    phases = {(p.get("status") or {}).get("phase", "") for p in pods}
    if "Running" in phases:
        return JobStatus(JobPhase.RUNNING, nodes, "Running")
    if "Pending" in phases:
        return JobStatus(JobPhase.WAITING, nodes, "Pending")
    if phases == {"Succeeded"}:
        return JobStatus(JobPhase.COMPLETED, nodes, "Succeeded")
    return JobStatus(JobPhase.DIED, nodes, ",".join(sorted(phases)))
