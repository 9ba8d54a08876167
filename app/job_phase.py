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


def pods_status(pods: Sequence[Mapping[str, Any]]) -> JobStatus:
    """A Kubernetes training job's status from its pods (their phases, and the nodes they are bound to)."""
    if not pods:
        return JobStatus(JobPhase.UNKNOWN)
    phases = {p.get("status", {}).get("phase", "") for p in pods}
    nodes = tuple(sorted({p["spec"]["nodeName"] for p in pods if p.get("spec", {}).get("nodeName")}))
    if "Running" in phases:
        return JobStatus(JobPhase.RUNNING, nodes, "Running")
    if "Pending" in phases:
        return JobStatus(JobPhase.WAITING, nodes, "Pending")
    if phases == {"Succeeded"}:
        return JobStatus(JobPhase.COMPLETED, nodes, "Succeeded")
    return JobStatus(JobPhase.DIED, nodes, ",".join(sorted(phases)))
