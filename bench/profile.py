"""Where a serving Nightshift spends its time under load: py-spy on every gunicorn worker at 500 alerts/s.

py-spy samples the master and its workers (``--subprocesses``) from outside, with no change to the server, while the
open-loop generator offers ``--rate`` alerts/s. The collapsed stacks are reduced to shares of all samples:
functions of ``app/`` by inclusive time, frames by self time, and the time spent waiting for SQLite's write lock
(``BEGIN IMMEDIATE``). Sampling costs CPU on a 2-core machine, so the latencies of this run are not benchmark
numbers; the shares are what it is for.

    python -m bench.profile [--rate 500] [--duration 20] [--out bench/results/profile.json]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import loadgen, record
from bench.servers import serve

APP_FRAME = re.compile(r"\(app/")
LOCK_WAIT_FRAME = "_configure_sqlite.<locals>._on_begin (app/store/__init__.py)"
TOP = 25


def py_spy() -> str | None:
    """The py-spy executable: on PATH, or installed next to this interpreter."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def collapse(lines: Iterable[str]) -> tuple[int, Counter[str], Counter[str]]:
    """Total samples, inclusive and self samples per frame, from py-spy's raw (collapsed) output.

    Frames lose their line numbers (``f (file.py:12)`` → ``f (file.py)``) and process prefixes are dropped, so
    a function counts once per sample whichever line or worker it was on.
    """
    total = 0
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames:
            continue
        total += samples
        for frame in set(frames):
            inclusive[frame] += samples
        own[frames[-1]] += samples
    return total, inclusive, own


def shares(total: int, inclusive: Counter[str], own: Counter[str]) -> dict[str, Any]:
    """The profile as percentages of all samples."""

    def pct(n: int) -> float:
        return round(100 * n / total, 1) if total else 0.0

    app = Counter({frame: n for frame, n in inclusive.items() if APP_FRAME.search(frame)})
    return {
        "samples": total,
        "sqlite_write_lock_wait_pct": pct(inclusive[LOCK_WAIT_FRAME]),
        "app_inclusive_pct": {frame: pct(n) for frame, n in app.most_common(TOP)},
        "self_pct": {frame: pct(n) for frame, n in own.most_common(TOP)},
    }


def measure(rate: float, duration_s: float, workdir: Path) -> dict[str, Any]:
    spy = py_spy()
    if spy is None:
        raise SystemExit("py-spy not found: pip install py-spy (the dev extra)")
    raw = workdir / "profile.txt"
    with serve("nightshift", workdir / "server") as server:
        base = [spy, "record", "--pid", str(server.daemon.proc.pid), "--subprocesses", "--rate", "100"]
        base += ["--duration", str(int(duration_s) + 1), "--nonblocking"]
        recorder = subprocess.Popen(
            [*base, "--format", "raw", "--output", str(raw)], stdout=subprocess.DEVNULL
        )
        time.sleep(0.5)  # let py-spy attach before the first request
        load = loadgen.spawn(server.webhook, server.token_file, rate, duration_s=duration_s, warmup_s=0)
        if recorder.wait(timeout=duration_s + 60) != 0:
            raise RuntimeError(f"py-spy exited with {recorder.returncode}")
    with raw.open() as lines:
        profile = shares(*collapse(lines))
    return {"profile": profile, "load_under_profiler": load}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0, help="offered load in alerts/s")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load (and of sampling)")
    parser.add_argument("--out", type=Path, default=record.RESULTS / "profile.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        results = measure(args.rate, args.duration, Path(tmp))
    params = {"rate_alerts_per_s": args.rate, "duration_s": args.duration, "sampler": "py-spy record, 100 Hz"}
    profile = results["profile"]
    print(
        f"{profile['samples']} samples; waiting for the SQLite write lock: {profile['sqlite_write_lock_wait_pct']}%"
    )
    for frame, pct in list(profile["app_inclusive_pct"].items())[:12]:
        print(f"{pct:5.1f}% {frame}")
    print(f"wrote {record.write(args.out, 'profile', params, results)}")


if __name__ == "__main__":
    main()
