"""A multi-rank job whose ranks meet in a collective every step: ``srun python -m sim.collective --dir D``.

Each rank (``SLURM_PROCID`` of ``SLURM_NTASKS``; on Kubernetes ``RANK`` of ``WORLD_SIZE``, its node ``NODE_NAME``)
writes its node to ``D/rank<R>.node``, then steps: it "loads a batch", then waits in :func:`all_reduce` (a barrier
over files in the shared directory ``D``) until every rank has reached the same step. With ``--stuck-rank R
--stuck-after S`` rank R blocks in :func:`load_batch` at step S and never reaches the collective, so the other
ranks wait in :func:`all_reduce` forever: a silent hang with one rank in a different place, which ``py-spy dump``
shows as it would for a real job (the ranks are Python).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

POLL_SECONDS = 0.05


def load_batch(rank: int, step: int, stuck: bool) -> int:
    """The data-loading half of a step; blocks forever on the stuck rank (as a read from a dead mount would)."""
    while stuck:
        time.sleep(1)
    return rank + step


def all_reduce(directory: Path, rank: int, world: int, step: int) -> None:
    """Announce ``step`` and wait until every rank has announced it (or a later one)."""
    (directory / f"rank{rank}.step").write_text(str(step))
    while True:
        steps = [_read_step(directory / f"rank{peer}.step") for peer in range(world)]
        if min(steps) >= step:
            return
        time.sleep(POLL_SECONDS)


def _read_step(path: Path) -> int:
    try:
        return int(path.read_text() or -1)
    except (FileNotFoundError, ValueError):
        return -1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.collective", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="directory shared by the ranks")
    parser.add_argument("--stuck-rank", type=int, default=-1, help="this rank hangs in load_batch")
    parser.add_argument("--stuck-after", type=int, default=3, help="at this step")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    args = parser.parse_args(argv)
    env = os.environ  # Slurm's, else what a Kubernetes training operator and the downward API set
    rank = int(env.get("SLURM_PROCID") or env.get("RANK") or 0)
    world = int(env.get("SLURM_NTASKS") or env.get("WORLD_SIZE") or 1)
    node = env.get("SLURMD_NODENAME") or env.get("NODE_NAME") or socket.gethostname()
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / f"rank{rank}.node").write_text(node)
    for step in range(args.steps):
        load_batch(rank, step, stuck=rank == args.stuck_rank and step >= args.stuck_after)
        time.sleep(args.step_seconds)
        all_reduce(args.dir, rank, world, step)
        if rank == 0:
            print(f"[rank0]: step {step} loss: {2.0 / (step + 1):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
