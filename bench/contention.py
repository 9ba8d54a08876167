"""What a busy neighbour on the same 2 cores does to a webhook's latency, with no Nightshift code in the neighbour.

The ingest benchmark's Nightshift servers share the machine's cores with their own incident worker, which the
load keeps busy; the floor has no such work. This separates the two effects: the floor and Nightshift's webhook
alone (``nightshift-webhook``: no worker anywhere) are measured at ``--rate`` alerts/s, each without and then beside
a plain CPU-bound process (``--duty``: the share of one core it keeps busy, in 10 ms cycles). Ratios are to the
floor without the neighbour, in the same round.

    python -m bench.contention [--rate 500] [--duty 0.9] [--rounds 3] [--duration 12]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import loadgen, record
from bench.servers import cpu_seconds, serve
from bench.stats import spread

SERVERS = ("floor", "nightshift-webhook")
NEIGHBOURS = ("none", "busy")
SPIN = """
import sys, time
busy = float(sys.argv[1]) * 0.010
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < busy:
        pass
    time.sleep(0.010 - busy)
"""


@contextmanager
def neighbour(duty: float | None) -> Iterator[subprocess.Popen[bytes] | None]:
    """A process that keeps ``duty`` of one core busy until the block ends; none for ``None``."""
    if duty is None:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", SPIN, str(duty)])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def measure(rate: float, duty: float, rounds: int, duration_s: float, workdir: Path) -> list[dict[str, Any]]:
    runs = []
    for round_no in range(1, rounds + 1):
        for kind in SERVERS if round_no % 2 else tuple(reversed(SERVERS)):
            with serve(kind, workdir / f"round{round_no}-{kind}") as server:
                for beside in NEIGHBOURS if round_no % 2 else tuple(reversed(NEIGHBOURS)):
                    run: dict[str, Any] = {"round": round_no, "server": kind, "neighbour": beside}
                    with neighbour(duty if beside == "busy" else None) as proc:
                        neighbour_cpu = cpu_seconds(proc.pid) if proc else 0.0
                        result = loadgen.spawn(
                            server.webhook, server.token_file, rate, duration_s=duration_s, seed=round_no
                        )
                        if proc:
                            run["neighbour_cpu_cores"] = round(
                                (cpu_seconds(proc.pid) - neighbour_cpu) / duration_s, 3
                            )
                    runs.append({**run, **result})
                    latency = result["latency_ms"]
                    print(
                        f"round {round_no} {kind:>18} neighbour={beside}: "
                        + " ".join(f"{p}={latency[p]:.1f}ms" for p in ("p50", "p90", "p99", "max"))
                        + f" errors={result['errors']}",
                        flush=True,
                    )
    return runs


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per server and neighbour: each percentile's spread over rounds, and its ratio to the lone floor's."""
    alone = {r["round"]: r for r in runs if r["server"] == "floor" and r["neighbour"] == "none"}
    rows = []
    for kind in SERVERS:
        for beside in NEIGHBOURS:
            mine = [r for r in runs if r["server"] == kind and r["neighbour"] == beside]
            if not mine:
                continue
            row: dict[str, Any] = {
                "server": kind,
                "neighbour": beside,
                "latency_ms": {p: spread([r["latency_ms"][p] for r in mine]) for p in ("p50", "p99")},
                "errors": sum(r["errors"] for r in mine),
                "ratio_to_floor": {
                    p: spread(
                        [r["latency_ms"][p] / max(alone[r["round"]]["latency_ms"][p], 1e-3) for r in mine]
                    )
                    for p in ("p50", "p99")
                },
            }
            if beside == "busy":
                row["neighbour_cpu_cores"] = spread([r["neighbour_cpu_cores"] for r in mine])
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0, help="offered load in alerts/s")
    parser.add_argument("--duty", type=float, default=0.9, help="share of one core the neighbour keeps busy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds per run, 2 s warm-up included")
    parser.add_argument("--out", type=Path, default=record.RESULTS / "contention.json")
    args = parser.parse_args(argv)
    if not 0 < args.duty < 1:
        parser.error("--duty must be between 0 and 1 (exclusive)")
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as tmp:
        runs = measure(args.rate, args.duty, args.rounds, args.duration, Path(tmp))
    params = {
        "rate_alerts_per_s": args.rate,
        "duty": args.duty,
        "rounds": args.rounds,
        "duration_s": args.duration,
    }
    results = {"summary": summarize(runs), "runs": runs}
    print(f"wrote {record.write(args.out, 'contention', params, results)}")


if __name__ == "__main__":
    main()
