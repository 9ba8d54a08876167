"""What the in-process benchmarks share: their command line, and one fresh SQLite store per round and seed."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import record


def parser(doc: str, name: str, notifications: int, notifications_help: str) -> argparse.ArgumentParser:
    """``--notifications``, ``--rounds`` and ``--out`` (default ``bench/results/<name>.json``)."""
    built = argparse.ArgumentParser(description=doc.splitlines()[0])
    built.add_argument("--notifications", type=int, default=notifications, help=notifications_help)
    built.add_argument("--rounds", type=int, default=3, help="fresh stores, one seed each")
    built.add_argument("--out", type=Path, default=record.RESULTS / f"{name}.json")
    return built


def fresh_store_rounds(
    rounds: int,
    name: str,
    measure: Callable[[int, Path], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """``measure(seed, workdir)`` for seeds 1..rounds, each in a new temporary directory; a line per round."""
    results = []
    for seed in range(1, rounds + 1):
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
            results.append(measure(seed, Path(tmp)))
        print(f"round {seed}: {describe(results[-1])}", flush=True)
    return results


def write(args: argparse.Namespace, benchmark: str, results: dict[str, Any], **params: Any) -> None:
    """Write the results file with the command line's parameters and ``params``, and say where."""
    every = {"notifications": args.notifications, "rounds": args.rounds, **params}
    print(f"wrote {record.write(args.out, benchmark, every, results)}")
