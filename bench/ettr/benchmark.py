"""``python -m bench.ettr``: calibrate, run every policy over the seeds, sweep, write the results and the tables.

1. Detection: which alerts the shipped rules raise for each fault (:mod:`bench.ettr.detection`, promtool; saved
   with a digest of its inputs in ``bench/results/ettr-detection.json`` and reused while they are unchanged).
2. Calibration at Llama 3's scale (:mod:`bench.ettr.calibration`): the restart cost fitted so that the health-check
   loop reaches 90%; the other policies at that scale beside it.
3. The main run: every policy of :mod:`bench.ettr.simulation` at 1,024 GPUs for 30 days, over ``--seeds``.
4. Sweeps: the checkpoint interval x the restart cost; the assumed rates (warned share, transient stragglers,
   silent hangs).
5. ``bench/results/ettr.json``, section 8 of bench/README.md and the sentence of README.md's Performance.

Runs are spread over ``--jobs`` processes. ``--quick`` (2 seeds, no sweeps) is for trying a change.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from statistics import median
from typing import Any

from bench.ettr import calibration, detection, report
from bench.ettr.causes import LLAMA3_DAYS, LLAMA3_ETTR, SOURCES, TABLE5, Rates, draw_faults
from bench.ettr.simulation import POLICIES, run
from bench.ettr.world import Physics

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
CALIBRATION_POLICIES = ("oracle", "health-check-loop", "on-call", "team", "naive-loop")
SWEEP_POLICIES = ("oracle", "nightshift", "health-check-loop", "team")

_DETECTION: detection.Detection | None = None


def _init(found: detection.Detection) -> None:
    global _DETECTION
    _DETECTION = found


def _one(task: tuple[str, Physics, Rates, int]) -> dict[str, Any]:
    policy, p, rates, seed = task
    assert _DETECTION is not None
    draw = draw_faults(rates, p.gpus, p.days, seed, p.gpus_per_node)
    return run(policy, p, rates, draw, _DETECTION, seed)


class Pool:
    """Runs (policy, physics, rates, seed) tasks over ``jobs`` processes, each holding the detection."""

    def __init__(self, found: detection.Detection, jobs: int):
        self.executor = ProcessPoolExecutor(max_workers=jobs, initializer=_init, initargs=(found,))

    def map(self, tasks: Sequence[tuple[str, Physics, Rates, int]]) -> list[dict[str, Any]]:
        return list(self.executor.map(_one, tasks))

    def close(self) -> None:
        self.executor.shutdown()


def cpu_seconds() -> float:
    """CPU time of this process and its finished workers (the wall time depends on what else shares the cores)."""
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10, check=False
    ).stdout.strip()


def commit() -> str:
    """The commit the code ran from, and whether its tracked code differed from it (the benchmark's own outputs,
    its results, the saved detection and the READMEs it writes, are not code)."""
    outputs = (":!bench/results", ":!README.md", ":!bench/README.md")
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", *outputs)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} plus uncommitted changes" if dirty else head


def by_policy(
    policies: Sequence[str], seeds: Sequence[int], results: list[dict[str, Any]]
) -> dict[str, list]:
    out: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    for i, result in enumerate(results):
        out[policies[i // len(seeds)]].append(result)
    return out


def grid(
    pool: Pool, policies: Sequence[str], p: Physics, rates: Rates, seeds: Sequence[int]
) -> dict[str, list]:
    tasks = [(policy, p, rates, seed) for policy in policies for seed in seeds]
    return by_policy(policies, seeds, pool.map(tasks))


def calibrate(
    pool: Pool, base: Physics, rates: Rates, seeds: Sequence[int], days: float, steps: int
) -> dict[str, Any]:
    def evaluate_all(p: Physics) -> list[float]:
        return [r["ettr"] for r in pool.map([(calibration.CALIBRATION_POLICY, p, rates, s) for s in seeds])]

    cache: dict[float, list[float]] = {}

    def score(p: Physics, seed: int) -> float:
        if p.restart_minutes not in cache:
            cache[p.restart_minutes] = evaluate_all(p)
        return cache[p.restart_minutes][list(seeds).index(seed)]

    fit = calibration.fit_restart(base, rates, seeds, days=days, iterations=steps, evaluate=score)
    p16k = replace(
        calibration.with_interval(calibration.llama3_physics(base, days), rates),
        restart_minutes=fit.restart_minutes,
    )
    runs = grid(pool, CALIBRATION_POLICIES, p16k, rates, seeds)
    return {
        "target": LLAMA3_ETTR,
        "policy": calibration.CALIBRATION_POLICY,
        "seeds": list(seeds),
        "physics": asdict(p16k),
        "mtbf_hours": calibration.job_mtbf(rates, p16k.gpus) / 3600,
        "fit": asdict(fit),
        "policies": {policy: report.spread([r["ettr"] for r in rs]) for policy, rs in runs.items()},
    }


def sweeps(pool: Pool, p: Physics, rates: Rates, seeds: Sequence[int]) -> dict[str, Any]:
    points = []
    tasks = []
    settings = []
    for interval in (
        p.checkpoint_interval / 2,
        p.checkpoint_interval,
        2 * p.checkpoint_interval,
        4 * p.checkpoint_interval,
    ):
        for restart in (p.restart_minutes / 2, p.restart_minutes, 2 * p.restart_minutes):
            settings.append((interval, restart))
            q = replace(p, checkpoint_interval=interval, restart_minutes=restart)
            tasks += [(policy, q, rates, seed) for policy in SWEEP_POLICIES for seed in seeds]
    results = pool.map(tasks)
    per = len(SWEEP_POLICIES) * len(seeds)
    for i, (interval, restart) in enumerate(settings):
        runs = by_policy(SWEEP_POLICIES, seeds, results[i * per : (i + 1) * per])
        table = report.aggregate(runs)
        points.append(
            {
                "interval_minutes": interval / 60,
                "restart_minutes": restart,
                "ettr": {policy: table[policy]["ettr"]["median"] for policy in SWEEP_POLICIES},
                "gain_share": table["nightshift"].get("gain_share"),
            }
        )
    assumptions = []
    variants = [
        ("warned share (issue 25)", "warned_share", (0.0, 0.6), ("nightshift", "nightshift-no-issue25")),
        (
            "transient stragglers per GPU-day",
            "transient_straggler_per_gpu_day",
            (0.0, 4 / 4096),
            ("nightshift", "nightshift-no-issue25"),
        ),
        (
            "silent hangs per GPU-day",
            "silent_hang_per_gpu_day",
            (0.0, 4 * rates.silent_hang_per_gpu_day),
            ("nightshift",),
        ),
    ]
    columns = ("oracle", "nightshift", "nightshift-no-issue25", "team")
    for name, field, values, engine in variants:
        for value in values:
            varied = replace(rates, **{field: value})
            policies = [c for c in columns if c in engine or c in ("oracle", "team")]
            runs = grid(pool, policies, p, varied, seeds)
            assumptions.append(
                {
                    "name": name,
                    "value": f"{value:.3g}" + (" (default)" if value == getattr(rates, field) else ""),
                    "policies": list(columns),
                    "ettr": {c: median(r["ettr"] for r in runs[c]) if c in runs else None for c in columns},
                }
            )
    return {
        "checkpoint_restart": {
            "gpus": p.gpus,
            "days": p.days,
            "seeds": list(seeds),
            "policies": list(SWEEP_POLICIES),
            "points": points,
        },
        "assumptions": assumptions,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ettr", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--calibration-seeds", type=int, default=3)
    parser.add_argument("--calibration-days", type=float, default=float(LLAMA3_DAYS))
    parser.add_argument("--calibration-steps", type=int, default=8, help="bisection steps of the fit")
    parser.add_argument("--sweep-seeds", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="2 seeds, no sweeps (to try a change)")
    parser.add_argument("--out", type=Path, default=RESULTS / "ettr.json")
    parser.add_argument("--detection-cache", type=Path, default=RESULTS / "ettr-detection.json")
    parser.add_argument("--no-readme", action="store_true", help="write the JSON only, not the READMEs")
    parser.add_argument("--promtool", default="promtool")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    found = detection.cached(
        Physics().watchdog_minutes * 60, Rates().straggler_speed, args.detection_cache, args.promtool
    )
    print(f"detection ready ({time.monotonic() - started:.0f} s)", flush=True)
    result = execute(args, found, started, " ".join(sys.argv[1:] if argv is None else argv))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report.dumps(result))
    if not args.no_readme:
        report.write_readmes(result)
    print(report.markdown(result))
    return 0


def execute(
    args: argparse.Namespace, found: detection.Detection, started: float, argv: str
) -> dict[str, Any]:
    """Everything after the detection: calibration, the main run, the sweeps; the results document."""
    base, rates = Physics(days=args.days), Rates()
    seeds = list(range(2 if args.quick else args.seeds))
    pool = Pool(found, args.jobs)
    try:
        cal = calibrate(
            pool,
            base,
            rates,
            list(range(args.calibration_seeds)),
            args.calibration_days,
            args.calibration_steps,
        )
        print(
            f"calibrated: restart {cal['fit']['restart_minutes']:.2f} min ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
        p = calibration.with_interval(replace(base, restart_minutes=cal["fit"]["restart_minutes"]), rates)
        runs = grid(pool, POLICIES, p, rates, seeds)
        print(f"main run done ({time.monotonic() - started:.0f} s)", flush=True)
        swept: dict[str, Any] = {
            "checkpoint_restart": {"points": [], "policies": [], "gpus": p.gpus, "days": p.days, "seeds": []},
            "assumptions": [],
        }
        if not args.quick:
            swept = sweeps(pool, p, rates, list(range(args.sweep_seeds)))
    finally:
        pool.close()
    return {
        "commit": commit(),
        "machine": f"{os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}",
        "argv": argv,
        "seconds": time.monotonic() - started,
        "cpu_seconds": cpu_seconds(),
        "rates": asdict(rates),
        "sources": SOURCES,
        "table5": [asdict(c) for c in TABLE5],
        "calibration": cal,
        "main": {"physics": asdict(p), "seeds": seeds, "table": report.aggregate(runs), "runs": runs},
        "sweeps": swept,
        "detection": found.table(),
    }
