"""The physics fitted to the one effective-training-time figure published with its failure counts.

Llama 3's pre-training kept "higher than 90% effective training time" on 16,384 GPUs through the interruptions of
its table 5 (:mod:`bench.ettr.causes`). Before the benchmark extrapolates to a smaller job, the same world must
give about 90% there, for a realistic policy: the requeue loop with a node health check (Meta's automation handled
all but three of the interruptions, "significant manual intervention was required only three times").

Sourced: the fault rates and mix, the NCCL watchdog (PyTorch's 10 min default), Slurm's node timeout. Assumed
(stated in :class:`bench.ettr.world.Physics`): the checkpoint's stall (10 s: asynchronous saving) and everything
a person does. Derived: the checkpoint interval, Young/Daly's sqrt(2 C MTBF) for the job's own MTBF (so it
shrinks as the job grows). Fitted: the restart cost (queue, start-up, loading the checkpoint), the one figure
nobody publishes for this job, by bisection until the health-check loop's median ETTR over the calibration
seeds is the target.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import median

from bench.ettr.causes import LLAMA3_DAYS, LLAMA3_ETTR, LLAMA3_GPUS, Rates, young_daly_interval
from bench.ettr.world import Physics

CALIBRATION_POLICY = "health-check-loop"


def job_mtbf(rates: Rates, gpus: int) -> float:
    """Seconds between the job's interruptions: table 5, the planned ones and the silent hangs."""
    per_day = (rates.interruptions_per_gpu_day() + rates.silent_hang_per_gpu_day) * gpus
    return 86400 / per_day


def with_interval(p: Physics, rates: Rates) -> Physics:
    """``p`` checkpointing at Young/Daly's interval for its size."""
    return replace(p, checkpoint_interval=young_daly_interval(p.checkpoint_seconds, job_mtbf(rates, p.gpus)))


def llama3_physics(p: Physics, days: float = LLAMA3_DAYS) -> Physics:
    """``p`` at the Llama 3 job's size and length: 2,048 nodes of 8 GPUs, 54 days, 64 spare nodes (assumed)."""
    return replace(p, nodes=LLAMA3_GPUS // p.gpus_per_node, spares=64, days=float(days))


@dataclass(frozen=True)
class Fit:
    restart_minutes: float
    ettr: float  # the calibration policy's median at the fitted restart cost
    runs: tuple[float, ...]  # its ETTR per seed there
    steps: tuple[tuple[float, float], ...]  # (restart minutes, median ETTR) tried


def fit_restart(
    base: Physics,
    rates: Rates,
    seeds: Sequence[int],
    evaluate: Callable[[Physics, int], float],
    days: float = LLAMA3_DAYS,
    target: float = LLAMA3_ETTR,
    low: float = 0.5,
    high: float = 60.0,
    iterations: int = 8,
) -> Fit:
    """The restart cost (minutes) at which the calibration policy's median ETTR (``evaluate(physics, seed)``) is
    ``target`` at Llama 3's scale, by bisection (ETTR falls as restarts cost more)."""
    p16k = with_interval(llama3_physics(base, days), rates)
    score = evaluate
    steps: list[tuple[float, float]] = []
    best: tuple[float, float, tuple[float, ...]] | None = None
    for _ in range(iterations):
        mid = (low + high) / 2
        runs = tuple(score(replace(p16k, restart_minutes=mid), seed) for seed in seeds)
        value = median(runs)
        steps.append((mid, value))
        if best is None or abs(value - target) < abs(best[1] - target):
            best = (mid, value, runs)
        if value > target:
            low = mid  # restarts can cost more
        else:
            high = mid
    assert best is not None
    return Fit(restart_minutes=best[0], ettr=best[1], runs=best[2], steps=tuple(steps))
