"""What the scheduler says of a training job, as a value: running, waiting for resources, finished, or died, and on
which nodes. Pure: no I/O (the lookup is :func:`app.engine.jobs.job_status`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

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
