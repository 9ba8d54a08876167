"""Memory of a serving Nightshift worker: RSS idle, then after every ``--step`` alerts up to ``--alerts`` (100k).

The alerts go through HTTP (``bench.loadgen`` in its own process, a fresh seed per step so each step brings new
alert instances as well as repeats) at ``--rate`` alerts/s, to ``nightshift serve`` (one gunicorn worker with its
embedded worker thread, SQLite). RSS is read from /proc for each gunicorn worker after each step, once the incidents it
opened have had ``--settle`` seconds to be worked. The growth over the second half of the run is the number to
bound: a leak keeps growing there, caches and pools have levelled off.

    python -m bench.memory [--alerts 100000] [--step 10000] [--rate 500] [--out bench/results/memory.json]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import loadgen, record
from bench.servers import rss_mib, serve


def measure(total: int, step: int, rate: float, settle_s: float, workdir: Path) -> dict[str, Any]:
    checkpoints: list[dict[str, Any]] = []
    with serve("nightshift", workdir) as server:
        pids = server.worker_pids()
        time.sleep(settle_s)
        checkpoints.append({"alerts": 0, "rss_mib": {str(pid): rss_mib(pid) for pid in pids}})
        sent = 0
        step_no = 0
        while sent < total:
            step_no += 1
            result = loadgen.spawn(
                server.webhook,
                server.token_file,
                rate,
                alerts=min(step, total - sent),
                warmup_s=0,
                seed=step_no,
            )
            sent += result["offered"]["alerts"]
            time.sleep(settle_s)
            checkpoint = {
                "alerts": sent,
                "rss_mib": {str(pid): rss_mib(pid) for pid in pids},
                "errors": result["errors"],
                "latency_ms": result["latency_ms"],
                "completed_alerts_per_s": result["measured"]["completed_alerts_per_s"],
            }
            checkpoints.append(checkpoint)
            print(f"{sent:>7} alerts: RSS {checkpoint['rss_mib']} MiB, errors {result['errors']}", flush=True)
        if server.worker_pids() != pids:
            raise RuntimeError("a gunicorn worker was replaced during the run: RSS would not be comparable")
    return {"checkpoints": checkpoints, "summary": summarize(checkpoints)}


def summarize(checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """Idle and final RSS of the larger worker, total growth, and growth over the second half of the run."""
    largest = [max(c["rss_mib"].values()) for c in checkpoints]
    middle = next(i for i, c in enumerate(checkpoints) if c["alerts"] >= checkpoints[-1]["alerts"] / 2)
    half_alerts = checkpoints[-1]["alerts"] - checkpoints[middle]["alerts"]
    half_growth = largest[-1] - largest[middle]
    return {
        "idle_rss_mib": largest[0],
        "final_rss_mib": largest[-1],
        "peak_rss_mib": max(largest),
        "growth_mib": round(largest[-1] - largest[0], 2),
        "second_half_growth_mib": round(half_growth, 2),
        "second_half_mib_per_10k_alerts": round(half_growth / half_alerts * 10_000, 3)
        if half_alerts
        else None,
        "alerts": checkpoints[-1]["alerts"],
        "errors": sum(c.get("errors", 0) for c in checkpoints),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=100_000)
    parser.add_argument("--step", type=int, default=10_000, help="alerts between RSS readings")
    parser.add_argument("--rate", type=float, default=500.0, help="offered load in alerts/s")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before each RSS reading")
    parser.add_argument("--out", type=Path, default=record.RESULTS / "memory.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        results = measure(args.alerts, args.step, args.rate, args.settle, Path(tmp))
    params = {
        "alerts": args.alerts,
        "step": args.step,
        "rate_alerts_per_s": args.rate,
        "settle_s": args.settle,
    }
    print(f"summary: {results['summary']}")
    print(f"wrote {record.write(args.out, 'memory', params, results)}")


if __name__ == "__main__":
    main()
