"""Checkpoint-interval advice (pure): the interval that minimises a job's expected lost time, from the failure
rate Nightshift has measured and the checkpoint duration the job's progress markers show.

Model (Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9); Daly 2006,
"A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3)): a job checkpoints
every ``τ`` seconds of work, each checkpoint costs ``C`` seconds, failures arrive at random with mean time
between them ``M`` (the job's: a job on ``n`` nodes fails ``n`` times as often as one node, exponentially
distributed), and each failure costs a restart ``R`` plus the work since the last checkpoint. Daly's exact
expected wall time per second of work is ``T(τ) = M·e^(R/M)·(e^((τ+C)/M) - 1) / τ``, so the fraction of time lost
is ``lost(τ) = 1 - 1/T(τ)``. The advised interval is its minimum (found numerically); Young's first-order
``√(2·C·M)`` and Daly's higher-order estimate ``√(2CM)·(1 + √(C/2M)/3 + C/(18M)) - C`` are reported beside it
(both are close to the minimum when ``C ≪ M``). Lost GPU-hours a day are ``lost(τ) x gpus x 24``.

Bounds: every input must be finite and positive (``R`` may be 0); a measurement from fewer than
:data:`MIN_FAILURES` failures is reported as too thin to advise on rather than as a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Fewer failures than this in the window and the measured MTBF is noise, not a basis for advice.
MIN_FAILURES = 3
SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class FailureRate:
    """Failures of the fleet's jobs over the node-seconds they ran (Nightshift's ledger and Prometheus)."""

    failures: int
    node_seconds: float

    def job_mtbf(self, nodes: int) -> float:
        """Mean seconds between failures of a job on ``nodes`` nodes (failures independent per node)."""
        return self.node_seconds / (self.failures * nodes)


@dataclass(frozen=True)
class JobCheckpoints:
    """What a job's progress markers show: its size, checkpoint cost and current interval (seconds)."""

    nodes: int
    gpus: int
    checkpoint_seconds: float
    interval_seconds: float | None = None
    restart_seconds: float = 0.0


@dataclass(frozen=True)
class Advice:
    """The advised interval and what the current and the advised one are expected to lose."""

    interval_seconds: float
    young_interval_seconds: float
    daly_interval_seconds: float
    job_mtbf_seconds: float
    advised_lost_gpu_hours_per_day: float
    current_lost_gpu_hours_per_day: float | None
    current_interval_seconds: float | None
    basis: str

    def as_dict(self) -> dict[str, object]:
        return {
            "interval_seconds": round(self.interval_seconds, 1),
            "young_interval_seconds": round(self.young_interval_seconds, 1),
            "daly_interval_seconds": round(self.daly_interval_seconds, 1),
            "job_mtbf_seconds": round(self.job_mtbf_seconds, 1),
            "advised_lost_gpu_hours_per_day": round(self.advised_lost_gpu_hours_per_day, 3),
            "current_lost_gpu_hours_per_day": (
                None
                if self.current_lost_gpu_hours_per_day is None
                else round(self.current_lost_gpu_hours_per_day, 3)
            ),
            "current_interval_seconds": (
                None if self.current_interval_seconds is None else round(self.current_interval_seconds, 1)
            ),
            "basis": self.basis,
        }


@dataclass(frozen=True)
class NoAdvice:
    """Why there is no advice (too few failures measured, no checkpoint seen, bad figures)."""

    reason: str


def lost_fraction(interval: float, checkpoint: float, mtbf: float, restart: float = 0.0) -> float:
    """The fraction of the job's time lost to checkpoints, redone work and restarts (Daly's exact model)."""
    exponent = (interval + checkpoint + restart) / mtbf
    if exponent > 700:  # e^700 is near the float limit: nothing useful gets done
        return 1.0
    wall_per_work = mtbf * (math.exp(exponent) - math.exp(restart / mtbf)) / interval
    return 1.0 - 1.0 / wall_per_work


def best_interval(checkpoint: float, mtbf: float, restart: float = 0.0) -> float:
    """The interval minimising :func:`lost_fraction` (golden-section search; the loss is unimodal in τ)."""
    low, high = checkpoint / 100, max(10 * mtbf, 10 * checkpoint)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if lost_fraction(a, checkpoint, mtbf, restart) < lost_fraction(b, checkpoint, mtbf, restart):
            high = b
        else:
            low = a
    return (low + high) / 2


def young_interval(checkpoint: float, mtbf: float) -> float:
    return math.sqrt(2 * checkpoint * mtbf)


def daly_interval(checkpoint: float, mtbf: float) -> float:
    if checkpoint >= 2 * mtbf:
        return mtbf
    ratio = checkpoint / (2 * mtbf)
    return young_interval(checkpoint, mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - checkpoint


def advise(rate: FailureRate, job: JobCheckpoints) -> Advice | NoAdvice:
    """The advised checkpoint interval for ``job`` given the fleet's measured failure ``rate``."""
    if rate.failures < MIN_FAILURES:
        return NoAdvice(
            f"{rate.failures} failure(s) measured; at least {MIN_FAILURES} are needed to estimate a failure rate"
        )
    figures = {
        "node_seconds": rate.node_seconds,
        "nodes": job.nodes,
        "gpus": job.gpus,
        "checkpoint_seconds": job.checkpoint_seconds,
    }
    bad = [name for name, value in figures.items() if not (math.isfinite(value) and value > 0)]
    if job.interval_seconds is not None and not (
        math.isfinite(job.interval_seconds) and job.interval_seconds > 0
    ):
        bad.append("interval_seconds")
    if not (math.isfinite(job.restart_seconds) and job.restart_seconds >= 0):
        bad.append("restart_seconds")
    if bad:
        return NoAdvice(f"not finite and positive: {', '.join(bad)}")
    mtbf = rate.job_mtbf(job.nodes)
    advised = best_interval(job.checkpoint_seconds, mtbf, job.restart_seconds)
    per_day = job.gpus * SECONDS_PER_DAY / 3600

    def lost(interval: float) -> float:
        return lost_fraction(interval, job.checkpoint_seconds, mtbf, job.restart_seconds) * per_day

    return Advice(
        interval_seconds=advised,
        young_interval_seconds=young_interval(job.checkpoint_seconds, mtbf),
        daly_interval_seconds=daly_interval(job.checkpoint_seconds, mtbf),
        job_mtbf_seconds=mtbf,
        advised_lost_gpu_hours_per_day=lost(advised),
        current_lost_gpu_hours_per_day=None if job.interval_seconds is None else lost(job.interval_seconds),
        current_interval_seconds=job.interval_seconds,
        basis=(
            f"{rate.failures} failures in {rate.node_seconds / 3600:.0f} node-hours → a {job.nodes}-node job fails "
            f"every {mtbf / 3600:.1f} h; checkpoints take {job.checkpoint_seconds:.0f} s (Young/Daly)"
        ),
    )
