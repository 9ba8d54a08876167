"""Why a job hangs, from the Python stacks of its ranks (``py-spy dump`` output).

Pure: text in, a :class:`StackVerdict` out. The input is what :mod:`app.actions.stacks` collects: for each
process of the job, a header ``==> py-spy node=NODE rank=R pid=P <==`` followed by ``py-spy dump`` text
(``Process P: CMDLINE``, ``Thread T (idle): "MainThread"``, then one ``function (file:line)`` frame a line,
innermost first). Plain ``py-spy dump`` output without our headers is read too (ranks then unknown).

Each rank's main thread is placed by its innermost frames: in a collective (``torch.distributed`` or a function
named like one), in file I/O, or elsewhere (the innermost frame names the place). Then:
- all ranks in the same collective except one: that one is the culprit; the job hangs because of it (storage
  when it sits in I/O, otherwise a hang in its own code);
- all ranks in the same collective: the network, or a peer outside the job;
- ranks in I/O: storage.

A rank waiting in ``loss.backward()`` (``_engine_run_backward``) under DDP or FSDP waits for the gradient
collectives its reducer launched (py-spy shows Python frames only): it counts as in a collective. A rank py-spy
could not dump (``Failed to suspend process``: the process is stopped, or stuck where ptrace cannot stop it) while
the others wait in one collective is the odd one out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_FRAMES = 64  # per thread; deeper frames do not change where a rank is
MAX_PROCESSES = 4096

_HEADER = re.compile(r"^==> py-spy node=(?P<node>\S*) rank=(?P<rank>\S*) pid=(?P<pid>\d+) <==")
_PROCESS = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)")
# Launchers pass ranks on the command line: the job's rank (``--rank=3``), or only the rank within the node
# (DeepSpeed's and torch.distributed.launch's ``--local_rank=3``), which names no node and no job rank.
_CMD_RANK = re.compile(r"(?<![\w-])--(?:global[_-])?rank[= ](?P<rank>\d{1,6})\b")
_CMD_LOCAL_RANK = re.compile(r"(?<![\w-])--local[_-]rank[= ](?P<rank>\d{1,6})\b")
_THREAD = re.compile(r'^Thread (?:0x[0-9A-Fa-f]+|\d+) \((?P<state>[\w +]+)\)(?:: "(?P<name>[^"]*)")?')
_FRAME = re.compile(r"^\s{2,}(?P<func>\S.*?) \((?P<file>[^()]+?):(?P<line>\d+)\)\s*$")

_COLLECTIVE_FUNCS = frozenset(
    {
        "all_reduce", "allreduce", "all_gather", "all_gather_into_tensor", "allgather", "reduce_scatter",
        "reduce_scatter_tensor", "broadcast", "barrier", "monitored_barrier", "all_to_all", "all_to_all_single",
        "reduce", "gather", "scatter", "send", "recv", "isend", "irecv", "synchronize", "wait",
    }
)  # fmt: skip
_COLLECTIVE_FILES = (
    "torch/distributed/",
    "torch/cuda/__init__.py",
    "deepspeed/comm/",
    "megatron/core/parallel",
)
_IO_FUNCS = frozenset(
    {
        "read", "readinto", "readline", "readlines", "write", "writelines", "open", "flush", "fsync", "close",
        "load", "save", "listdir", "scandir", "stat", "copyfile", "copyfileobj", "replace", "rename", "makedirs",
        "_save", "_load", "load_file", "save_file", "_read", "_write", "get_object", "download_file",
    }
)  # fmt: skip
_IO_FILES = (
    "torch/serialization.py",
    "safetensors/",
    "shutil.py",
    "h5py/",
    "_io",
    "botocore/",
    "s3transfer/",
)
# The gradient synchronisation of DDP/FSDP happens inside the autograd engine's backward pass.
_BACKWARD = ("_engine_run_backward", "run_backward")
# py-spy's own failure, for a process it cannot attach to or suspend.
_DUMP_ERROR = re.compile(
    r"^Error: (?P<error>Failed to (?:get stack traces|suspend process).*)|"
    r"^\s*\d+: (?P<cause>Failed to suspend process|unexpected waitpid result.*)"
)
_AGENT_FILES = (
    "torch/distributed/elastic/agent/",
    "torch/distributed/run.py",
    "torch/distributed/launch",
)


@dataclass(frozen=True)
class RankStack:
    """Where one rank's main thread is."""

    node: str | None
    rank: int | None
    pid: int
    frames: tuple[str, ...]  # "function (file:line)", innermost first
    error: str | None = None  # py-spy's error when it could not dump the process
    local_rank: int | None = None  # the rank within its node, where only that is known

    @property
    def kind(self) -> str:
        """``collective``, ``io`` or ``other``."""
        for frame in self.frames[:4]:
            func, _, path = frame.partition(" (")
            if func in _BACKWARD and "torch/autograd/" in path:
                return "collective"
            if func in _COLLECTIVE_FUNCS and (
                "distributed" in path or "comm" in path or "collective" in path or "cuda" in path
            ):
                return "collective"
            if any(part in path for part in _COLLECTIVE_FILES):
                return "collective"
        top = self.frames[0] if self.frames else ""
        func, _, path = top.partition(" (")
        if func in _IO_FUNCS or any(part in path for part in _IO_FILES):
            return "io"
        return "other"

    @property
    def place(self) -> str:
        """The innermost frame (without its line number, so ranks a few lines apart in a loop agree)."""
        if not self.frames:
            return "(no Python frames)"
        return re.sub(r":\d+\)$", ")", self.frames[0])

    def describe(self) -> str:
        who = " ".join(part for part in (self.node, _rank_words(self)) if part)
        path = " <- ".join(self.frames[:3])
        return f"{who or 'process'} (pid {self.pid}): {path}"


@dataclass(frozen=True)
class StackVerdict:
    """What the stacks say: a category, its weight as a vote, the culprit rank if one stands out, evidence."""

    category: str
    weight: float
    description: str
    culprit: RankStack | None
    evidence: tuple[str, ...]


def parse_dumps(lines: Sequence[str]) -> list[RankStack]:
    """Every dumped process's main thread (the first thread when none is called MainThread); launcher agents
    (torchrun's own process) are left out."""
    stacks: list[RankStack] = []
    node: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    threads: list[tuple[str, list[str]]] = []
    error: str | None = None

    def finish() -> None:
        if pid is not None and threads and len(stacks) < MAX_PROCESSES:
            main = next((frames for name, frames in threads if name == "MainThread"), threads[0][1])
            stacks.append(RankStack(node, rank, pid, tuple(main), local_rank=local_rank))
        elif pid is not None and error and len(stacks) < MAX_PROCESSES:
            stacks.append(RankStack(node, rank, pid, (), error, local_rank))

    for raw in lines:
        line = raw.rstrip()
        if header := _HEADER.match(line):
            finish()
            node, pid, threads, error, local_rank = header["node"] or None, None, [], None, None
            rank = int(header["rank"]) if header["rank"].isdigit() else None
        elif process := _PROCESS.match(line):
            if pid is not None:  # a second process under one header, or plain dumps without headers
                finish()
                node = rank = local_rank = None
            pid, threads = int(process["pid"]), []
            if rank is None and (from_cmd := _CMD_RANK.search(process["cmd"])):
                rank = int(from_cmd["rank"])
            if rank is None and (from_cmd := _CMD_LOCAL_RANK.search(process["cmd"])):
                local_rank = int(from_cmd["rank"])
        elif pid is not None and not threads and (failed := _DUMP_ERROR.match(line)):
            error = "; ".join(filter(None, (error, failed["error"] or failed["cause"])))
        elif pid is not None and (thread := _THREAD.match(line)):
            threads.append((thread["name"] or "", []))
        elif threads and (frame := _FRAME.match(line)) and len(threads[-1][1]) < MAX_FRAMES:
            threads[-1][1].append(f"{frame['func']} ({frame['file']}:{frame['line']})")
    finish()
    return [s for s in stacks if not any(part in f for f in s.frames for part in _AGENT_FILES)]


def judge(stacks: Sequence[RankStack]) -> StackVerdict | None:
    """The verdict over the ranks' stacks; None when no Python stack was dumped."""
    ranks = [s for s in stacks if s.frames]
    if not ranks:
        return None
    undumped = [s for s in stacks if not s.frames and s.error]
    places = Counter(s.place for s in ranks)
    majority, count = places.most_common(1)[0]
    leaders = [s for s in ranks if s.place == majority]
    odd = [s for s in ranks if s.place != majority]
    kind = leaders[0].kind
    summary = f"{count} of {len(ranks)} ranks in {majority}"
    evidence = [summary + f" ({kind})", *(s.describe() for s in odd[:8]), leaders[0].describe()]
    culprit: RankStack | None
    evidence += [f"{_who(s)} (pid {s.pid}): py-spy: {s.error}" for s in undumped[:8]]
    if not odd and len(undumped) == 1 and kind == "collective":
        culprit = undumped[0]
        return StackVerdict(
            "hang",
            8.0,
            f"{_who(culprit)} could not be dumped (py-spy: {culprit.error}: stopped, or stuck in the kernel) "
            f"while the other ranks wait in {majority}",
            culprit,
            tuple(evidence),
        )
    if len(ranks) > 1 and len(odd) == 1 and kind == "collective":
        culprit = odd[0]
        if culprit.kind == "io":
            return StackVerdict(
                "storage_io",
                8.0,
                f"{_who(culprit)} is stuck in file I/O ({culprit.place}) while the other ranks wait in "
                f"{majority}",
                culprit,
                tuple(evidence),
            )
        return StackVerdict(
            "hang",
            8.0,
            f"{_who(culprit)} is stuck in {culprit.place} while the other ranks wait in {majority}",
            culprit,
            tuple(evidence),
        )
    if not odd and kind == "collective":
        return StackVerdict(
            "nccl_network",
            7.0,
            f"every rank waits in the same collective ({majority}): the network, or a peer outside the job",
            None,
            tuple(evidence),
        )
    io_ranks = [s for s in ranks if s.kind == "io"]
    if len(io_ranks) * 2 > len(ranks) or (io_ranks and not odd):
        culprit = io_ranks[0] if len(io_ranks) == 1 else None
        return StackVerdict(
            "storage_io",
            7.0,
            f"{len(io_ranks)} of {len(ranks)} ranks are stuck in file I/O ({io_ranks[0].place})",
            culprit,
            tuple(evidence),
        )
    culprit = odd[0] if len(odd) == 1 and len(ranks) > 2 else None
    return StackVerdict(
        "hang",
        6.0,
        f"the ranks are stuck in {len(places)} different places, most in {majority}"
        if len(places) > 1
        else f"every rank is stuck in {majority}",
        culprit,
        tuple(evidence),
    )


def _rank_words(stack: RankStack) -> str | None:
    if stack.rank is not None:
        return f"rank {stack.rank}"
    return f"local rank {stack.local_rank}" if stack.local_rank is not None else None


def _who(stack: RankStack) -> str:
    rank = _rank_words(stack) or f"pid {stack.pid}"
    return f"{rank} on {stack.node}" if stack.node else rank
