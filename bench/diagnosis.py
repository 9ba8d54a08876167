"""Diagnosis time at its input bounds: a 2 MiB, 20,000-line multi-rank log (the lines classified in full), an 8 MiB
log with a cause buried before them, and the py-spy dumps of 64 ranks.

Logs (built in memory, deterministic):

- ``healthy``: 64 ranks' interleaved progress lines (``[rankN]:`` prefixes, timestamps), NCCL INFO chatter and
  Python warnings, :data:`app.domain.diagnosis.MAX_LINES` lines padded to :data:`TAIL_CHARS` (2 MiB);
- ``fault``: the same with a failure at the end (an Xid 79 on one node, then every other rank's NCCL watchdog
  timeout and torchrun's failure summary);
- ``all_errors``: the worst case for the signature matching: every one of the 20,000 lines is a distinct error
  line (NCCL WARNs, watchdog timeouts, tracebacks), so no line is skipped by the catalogue's prefilter;
- ``stacks_64``: ``py-spy dump`` output of 64 ranks (8 nodes of 8), one of them stuck elsewhere;
- ``buried``: :data:`app.domain.diagnosis.MAX_LOG_CHARS` (8 MiB) of healthy lines with an Xid 79 near the start, over
  60,000 lines before the last :data:`app.domain.diagnosis.MAX_LINES`: the scan for buried causes over every line.

Each is diagnosed ``--repeats`` times after one warm-up (the catalogues are loaded once per process); the median,
min and max wall time per diagnosis are reported.

    python -m bench.diagnosis [--repeats 7] [--lines 20000] [--out bench/results/diagnosis.json]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path

from app.domain.diagnosis import MAX_LINES, MAX_LOG_CHARS, diagnose, tail_lines
from bench import record
from bench.stats import spread

RANKS = 64
TAIL_CHARS = (
    2 * 1024 * 1024
)  # the size of MAX_LINES lines of about 100 characters: what is classified in full
GPUS_PER_NODE = 8


def _node(rank: int) -> str:
    return f"gpu-{rank // GPUS_PER_NODE:03d}"


def _fill(tail: list[str], make: Callable[[int], str], lines: int) -> str:
    """Filler lines from ``make(i)``, then ``tail``: ``lines`` lines of about TAIL_CHARS * lines / MAX_LINES
    characters in all (every line padded or cut to the same width)."""
    budget = TAIL_CHARS * lines // MAX_LINES - sum(len(line) + 1 for line in tail)
    count = lines - len(tail)
    width = max(1, budget // max(1, count) - 1)
    filler = [(line + " " * width)[:width] for line in (make(i) for i in range(count))]
    return "\n".join(filler + tail)


def healthy_log(lines: int = MAX_LINES, seed: int = 1) -> str:
    rng = random.Random(seed)

    def line(i: int) -> str:
        rank = rng.randrange(RANKS)
        second = i // 4
        stamp = f"2026-12-03 0{second // 3600 % 10}:{second // 60 % 60:02d}:{second % 60:02d}"
        if i % 10 == 7:
            return (
                f"{_node(rank)}:{4000 + rank}:{4100 + rank} [{rank % 8}] NCCL INFO Channel {i % 32:02d}/0 : "
                f"{rank}[{rank % 8}] -> {(rank + 1) % RANKS} via P2P/IPC"
            )
        if i % 10 == 9:
            return (
                f"[rank{rank}]: /opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1747: "
                "FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated."
            )
        return (
            f"[{stamp}] [rank{rank}]: step {i // RANKS} | loss {2.5 - i / 40000:.4f} | lr 3.0e-4 | "
            f"tokens/s {180000 + rng.randrange(5000)}"
        )

    return _fill([], line, lines)


def fault_log(lines: int = MAX_LINES) -> str:
    culprit = 13
    tail = [
        f"Dec  3 09:59:58 {_node(culprit)} kernel: NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus."
    ]
    tail += [
        f"[rank{rank}]:[E1203 10:09:59.{rank:06d} ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=90210, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
        for rank in range(RANKS)
        if rank != culprit
    ]
    tail += ["Root Cause (first observed failure):", "[0]:", f"  host      : {_node(0)}", "  rank      : 0"]
    head = healthy_log(lines, seed=2).splitlines()
    return "\n".join(head[: lines - len(tail)] + tail)


def all_errors_log(lines: int = MAX_LINES, seed: int = 3) -> str:
    rng = random.Random(seed)

    def line(i: int) -> str:
        rank = rng.randrange(RANKS)
        if i % 4 == 0:
            return (
                f"{_node(rank)}:{5000 + i}:{6000 + i} [{rank % 8}] transport/net_ib.cc:{i} NCCL WARN NET/IB : "
                f"Got completion from peer 10.0.{i % 250}.{rank} with status={i % 20}"
            )
        if i % 4 == 1:
            return (
                f"[rank{rank}]:[E1203 10:00:00.{i:06d} ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
                f"caught collective operation timeout: WorkNCCL(SeqNum={i}, OpType=ALLREDUCE)"
            )
        if i % 4 == 2:
            return f"[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered ({i})"
        return f"[rank{rank}]: OSError: [Errno 5] Input/output error: '/lustre/data/shard-{i:06d}.bin'"

    return _fill([], line, lines)


def stacks_log(ranks: int = RANKS, stuck: int = 42) -> str:
    collective = [
        "all_reduce (torch/distributed/distributed_c10d.py:2288)",
        "wrapper (torch/distributed/c10d_logger.py:79)",
        "reduce_gradients (megatron/core/distributed/distributed_data_parallel.py:211)",
    ]
    elsewhere = [
        "read (megatron/data/indexed_dataset.py:144)",
        "__getitem__ (megatron/data/gpt_dataset.py:90)",
    ]
    common = [f"frame_{depth} (megatron/training/training.py:{100 + depth})" for depth in range(24)]
    dumps = []
    for rank in range(ranks):
        pid = 30000 + rank
        frames = (elsewhere if rank == stuck % ranks else collective) + common
        dumps.append(
            f"==> py-spy node={_node(rank)} rank={rank} pid={pid} <==\n"
            f"Process {pid}: /usr/bin/python3 -u pretrain_gpt.py --tensor-model-parallel-size 8\n"
            "Python v3.11.7 (/usr/bin/python3.11)\n\n"
            f'Thread {pid} (idle): "MainThread"\n'
            + "".join(f"    {frame}\n" for frame in frames)
            + f'Thread {pid + 100} (idle): "Thread-1 (_pin_memory_loop)"\n'
            "    wait (threading.py:324)\n    _pin_memory_loop (torch/utils/data/_utils/pin_memory.py:49)\n"
        )
    return "".join(dumps)


def buried_log(lines: int = MAX_LINES) -> str:
    """An Xid 79 on gpu-013, then healthy lines up to MAX_LOG_CHARS: only the buried-cause scan can find it."""
    xid = (
        f"Dec  3 09:59:58 {_node(13)} kernel: NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus."
    )
    healthy = "\n" + healthy_log(lines)
    body = healthy * (MAX_LOG_CHARS // len(healthy) + 1)
    body = body[: MAX_LOG_CHARS - len(xid)]
    return xid + body[: body.rfind("\n")]


LOGS: dict[str, Callable[[int], str]] = {
    "healthy": healthy_log,
    "fault": fault_log,
    "all_errors": all_errors_log,
    "stacks_64": lambda lines: stacks_log(),
    "buried": buried_log,
}


def measure(text: str, labels: dict[str, str], repeats: int) -> dict[str, object]:
    """Milliseconds per diagnosis, wall and CPU (one warm-up, then ``repeats`` timed runs), and the verdict."""
    result = diagnose(labels, text)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        diagnose(labels, text)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    lines = tail_lines(text)
    return {
        "lines": len(lines),
        "bytes": len(text.encode()),
        "ms": _ms(wall),
        "cpu_ms": _ms(cpu),  # this process's CPU time: less skewed than wall time when the cores are shared
        "verdict": result.category,
        "culprit": result.culprit.as_dict() if result.culprit else None,
    }


def _ms(seconds: list[float]) -> dict[str, float]:
    return {key: round(value * 1000, 1) if key != "n" else value for key, value in spread(seconds).items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.diagnosis", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--lines", type=int, default=MAX_LINES, help="log size (bytes scale with it)")
    parser.add_argument("--out", type=Path, default=record.RESULTS / "diagnosis.json")
    args = parser.parse_args(argv)
    labels = {"Hostname": _node(0)}  # the log decides; an error_class label would vote too
    results = {name: measure(make(args.lines), labels, args.repeats) for name, make in LOGS.items()}
    for name, row in results.items():
        ms, cpu = row["ms"], row["cpu_ms"]
        print(
            f"{name:>10}: {row['lines']:>6} lines {row['bytes']:>8} bytes  median {ms['median']} ms "  # type: ignore[index]
            f"({ms['min']}-{ms['max']}), CPU {cpu['median']} ms  -> {row['verdict']} {row['culprit'] or ''}"  # type: ignore[index]
        )
    record.write(
        args.out, "diagnosis", {"repeats": args.repeats, "lines": args.lines, "ranks": RANKS}, results
    )


if __name__ == "__main__":
    main()
