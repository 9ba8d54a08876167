"""Webhook ingest under gunicorn at fixed offered loads: Nightshift against the bare-Flask floor, in one run.

Each round starts both servers in turn (fresh, alternating which goes first) and offers each load for
``--duration`` seconds from the open-loop generator (``bench.loadgen``, its own process); both servers get the same
notifications (same seed per round). Results: every run, and per server and load the median over rounds of each
latency percentile with its min..max, and Nightshift's ratio to the floor (computed per round, then the median).

    python -m bench.ingest [--rates 100,500,1000] [--rounds 3] [--duration 12] [--out bench/results/ingest.json]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import loadgen, record
from bench.servers import KINDS, NIGHTSHIFT_KINDS, serve
from bench.stats import spread

PERCENTILES = ("p50", "p90", "p99", "max")
TARGET_RATE = 500
TARGET_P99_RATIO = 1.5


def measure(
    rates: Sequence[float],
    rounds: int,
    duration_s: float,
    warmup_s: float,
    workdir: Path,
    *,
    workers: int = 1,
    threads: int = 8,
) -> list[dict[str, Any]]:
    """One entry per (round, server, rate) with the load generator's summary."""
    runs = []
    for round_no in range(1, rounds + 1):
        order = KINDS if round_no % 2 else tuple(reversed(KINDS))
        for kind in order:
            with serve(kind, workdir / f"round{round_no}-{kind}", workers=workers, threads=threads) as server:
                for rate in rates:
                    cpu_before = server.cpu_seconds()
                    result = loadgen.spawn(
                        server.webhook,
                        server.token_file,
                        rate,
                        duration_s=duration_s,
                        warmup_s=warmup_s,
                        seed=round_no,
                    )
                    cpu = server.cpu_seconds() - cpu_before
                    load = round(os.getloadavg()[0], 2)
                    runs.append(
                        {
                            "round": round_no,
                            "server": kind,
                            "rate": rate,
                            "loadavg_1m": load,
                            "server_cpu_cores": round(cpu / duration_s, 3),
                            **result,
                        }
                    )
                    print(_line(runs[-1]), flush=True)
    return runs


def _line(run: dict[str, Any]) -> str:
    latency = run["latency_ms"]
    return (
        f"round {run['round']} {run['server']:>18} {run['rate']:>6} alerts/s: "
        + " ".join(f"{p}={latency[p]:.1f}ms" for p in PERCENTILES)
        + f" errors={run['errors']} completed={run['measured']['completed_alerts_per_s']} alerts/s"
    )


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate and server: spread over rounds of each percentile; Nightshift/floor ratios per round."""
    rows = []
    for rate in sorted({r["rate"] for r in runs}):
        by_server = {kind: [r for r in runs if r["rate"] == rate and r["server"] == kind] for kind in KINDS}
        for kind, mine in by_server.items():
            if not mine:
                continue
            row: dict[str, Any] = {
                "rate_alerts_per_s": rate,
                "server": kind,
                "notifications_per_s": spread([r["offered"]["notifications_per_s"] for r in mine]),
                "latency_ms": {p: spread([r["latency_ms"][p] for r in mine]) for p in PERCENTILES},
                "completed_alerts_per_s": spread([r["measured"]["completed_alerts_per_s"] for r in mine]),
                "errors": sum(r["errors"] for r in mine),
                "samples_per_round": spread([r["measured"]["notifications"] for r in mine]),
                "server_cpu_cores": spread([r["server_cpu_cores"] for r in mine]),
            }
            floor = {r["round"]: r for r in by_server["floor"]}
            paired = [(r, floor[r["round"]]) for r in mine if kind != "floor" and r["round"] in floor]
            if paired:
                row["ratio_to_floor"] = {
                    p: spread([r["latency_ms"][p] / max(f["latency_ms"][p], 1e-3) for r, f in paired])
                    for p in ("p50", "p99")
                }
            rows.append(row)
    return rows


def verdicts(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's target for each Nightshift topology: p99 within 1.5x the floor at 500 alerts/s, zero errors."""
    return [verdict(summary, kind) for kind in NIGHTSHIFT_KINDS]


def verdict(summary: list[dict[str, Any]], server: str) -> dict[str, Any]:
    row = next((r for r in summary if r["server"] == server and r["rate_alerts_per_s"] == TARGET_RATE), None)
    if row is None:
        return {"server": server, "measured": False}
    ratio = row["ratio_to_floor"]["p99"]["median"]
    return {
        "server": server,
        "measured": True,
        "rate_alerts_per_s": TARGET_RATE,
        "p99_ratio": round(ratio, 2),
        "errors": row["errors"],
        "met": ratio <= TARGET_P99_RATIO and row["errors"] == 0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100,500,1000", help="offered loads in alerts/s, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds per load, warm-up included")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds left out of the statistics")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gunicorn workers (both servers; nightshift serve's SQLite default)",
    )
    parser.add_argument("--threads", type=int, default=8, help="gunicorn threads per worker (both servers)")
    parser.add_argument("--out", type=Path, default=record.RESULTS / "ingest.json")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        runs = measure(
            rates,
            args.rounds,
            args.duration,
            args.warmup,
            Path(tmp),
            workers=args.workers,
            threads=args.threads,
        )
    summary = summarize(runs)
    params = {
        "rates_alerts_per_s": rates,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "gunicorn": {"workers": args.workers, "threads": args.threads, "worker_class": "gthread"},
        "workload": "bench.workload.Fleet: groups of 1..50 alerts (uniform), half repeats, 10% of repeats resolve",
    }
    results = {"verdicts": verdicts(summary), "summary": summary, "runs": runs}
    print(f"wrote {record.write(args.out, 'ingest', params, results)}")


if __name__ == "__main__":
    main()
