"""What torchrun's elastic agent says about its workers: the failure summary, exit codes, signals, its own kills.

Pure string work, fed one line body at a time (prefixes already peeled by :mod:`app.domain.diagnosis.lines`). The
formats are those of ``torch.distributed.elastic`` (torch 2.x, checked on 2.13):

- the agent's line when a worker dies: ``failed (exitcode: -9) local_rank: 1 (pid: 16322) of binary: ...``;
- the ``ChildFailedError`` summary: ``Failures:`` and ``Root Cause (first observed failure):``, then one block per
  worker (``[0]:`` then ``time``, ``host``, ``rank : 1 (local_rank: 1)``, ``exitcode : -9 (pid: 16322)
  (SIGKILL)``, ``error_file``, ``traceback``), read as far as it goes: a summary cut off mid-way keeps the fields
  seen;
- Open MPI's ``mpirun``: ``mpirun noticed that process rank 3 with PID P on node H exited on signal 9 (Killed).``;
- ``torch.multiprocessing.spawn``: ``ProcessExitedException: process 1 terminated with signal SIGKILL`` (or ``with
  exit code N``), its process index a local rank;
- DeepSpeed's launcher: ``[launch.py:434:sigkill_handler] [..., '--local_rank=0', ...] exits with return code = -9``
  and its ``Killing subprocess N`` (its own teardown); its runner's command line hands every node's launcher the
  job's hosts (``--world_info=`` base64 JSON, ``{"localhost": [0, 1]}``): how many nodes the job has;
- the agent's own kills when it tears the group down: ``Sending process 16321 closing signal SIGTERM``, and
  ``Unable to shutdown process 18542 via 15, forcefully exiting via 9`` (the worker did not answer SIGTERM: it is
  stopped or stuck). A worker the agent killed itself is a victim of the teardown, never evidence of what failed.

Exit codes are read both ways: a negative code is the signal (``-9``), a shell's 128+N is too (``137``).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
from dataclasses import dataclass, field, replace

MAX_FAILURES = 4096  # blocks kept per log: one per worker of the largest job summaries

# Linux's signal numbers (the logs come from Linux nodes, whatever runs the diagnosis).
SIGNAL_NAMES = dict(
    enumerate(
        ("SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGKILL", "SIGUSR1",
         "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM"),
        start=1,
    )
)  # fmt: skip
# Signals a worker gets from outside when the job is stopped on purpose (scancel, preemption, Ctrl-C).
STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE"})

_AGENT_FAILED = re.compile(
    r"\bfailed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"
)
# The glog prefix torch's logger writes before the agent's lines: level, date, time, then the agent's own pid.
_AGENT_PID = re.compile(r"(?:^|\s)[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +(?P<agent>\d+) ")
# DeepSpeed's launcher (deepspeed/launcher/launch.py): the worker's command line, then its exit code.
_DEEPSPEED_FAILED = re.compile(
    r"sigkill_handler\] \[.*?'--local_rank=(?P<local>\d+)'.*\] exits with return code = (?P<code>-?\d+)"
)
_DEEPSPEED_KILLING = re.compile(r"sigkill_handler\] Killing subprocess (?P<pid>\d+)")
# Open MPI's mpirun (Horovod, MPI-launched PyTorch): the first process that died of a signal, its MPI rank (the job's
# rank) and its node (orte/prte's "mpirun noticed that process rank 3 with PID 41236 on node gpu-a02 exited on
# signal 9 (Killed).").
_MPIRUN_SIGNALLED = re.compile(
    r"\b(?:mpirun|mpiexec|orterun|prterun) noticed that process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node "
    r"(?P<host>[\w.-]+) exited on signal (?P<num>\d+)"
)
# torch.multiprocessing.spawn (mp.spawn), the launcher inside the training script: its process index.
_SPAWN_EXITED = re.compile(
    r"\bProcessExitedException: process (?P<local>\d+) terminated with "
    r"(?:signal (?P<sig>SIG[A-Z0-9]+)|exit code (?P<code>-?\d+))"
)
# DeepSpeed's runner (deepspeed/launcher/runner.py, encode_world_info): base64 of the JSON host -> slots map.
_WORLD_INFO = re.compile(r"--world_info[= ](?P<info>[A-Za-z0-9+/_-]{4,2048}={0,2})")
_CLOSING = re.compile(r"\bSending process (?P<pid>\d+) closing signal (?P<sig>SIG[A-Z]+)")
_FORCED = re.compile(r"\bUnable to shutdown process (?P<pid>\d+) via (?P<sig>\d+), forcefully exiting via")
_SUMMARY_START = re.compile(r"^\s*(?:Failures:|Root Cause \(first observed failure\):)\s*$")
_ROOT = "Root Cause (first observed failure)"
_BLOCK = re.compile(r"^\s*\[\d+\]:\s*$")
_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*: ?(?P<value>.*)$")
_RANK = re.compile(r"^(?P<rank>\d+)(?: \(local_rank: (?P<local>\d+)\))?")
_EXITCODE = re.compile(r"^(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?(?:\s+\((?P<sig>SIG[A-Z0-9]+)\))?")
_SUMMARY_END = re.compile(r"^\s*={20,}\s*$")
_SEPARATOR = re.compile(r"^\s*-{20,}\s*$")
_SUMMARY_FIELDS = 12  # lines after the last field before a summary is over
_TRACEBACK_LINES = 400  # ... or inside a block's traceback
# Lines worth feeding outside a summary (inside one, every line is fed).
CONTEXT = re.compile(
    r"Failures:|Root Cause \(first|^\s*\[\d+\]:\s*$|\b(?:time|host|rank|exitcode|error_file|traceback)\s*: |"
    r"failed \(exitcode: |closing signal SIG|Unable to shutdown process|exits with return code = |Killing subprocess|"
    r"--world_info[= ]|ProcessExitedException: process|noticed that process rank"
)


@dataclass(frozen=True)
class Failure:
    """One failed worker as the agent reports it; any field may be unknown when the text was cut off."""

    index: int  # the line it was first seen on
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    exitcode: int | None = None
    pid: int | None = None
    signal: str | None = None
    error: str | None = None  # the traceback's last line, or the signal's
    root: bool = False  # torchrun's "first observed failure"
    text: str = ""  # the line that names the rank, for evidence
    agent: int | None = None  # the pid of the torchrun agent that reported it (one agent per node)

    @property
    def signal_name(self) -> str | None:
        """The signal that ended the worker: named in the summary, else from the exit code (-9 or 137)."""
        if self.signal:
            return self.signal
        if self.exitcode is None:
            return None
        number = -self.exitcode if self.exitcode < 0 else self.exitcode - 128 if self.exitcode > 128 else 0
        return SIGNAL_NAMES.get(number)


@dataclass
class LauncherReading:
    """Everything the agent said, in line order."""

    failures: list[Failure] = field(default_factory=list)
    closed_pids: set[int] = field(default_factory=set)  # workers the agent sent SIGTERM to itself
    unresponsive_pids: set[int] = field(default_factory=set)  # workers that did not answer its SIGTERM
    nodes: int | None = None  # the job's nodes, where the launcher names them (DeepSpeed's world info)
    # DeepSpeed's world info, host -> its first global rank: launch.py numbers each host's slots in the map's order
    first_ranks: dict[str, int] = field(default_factory=dict)
    _block: dict[str, object] | None = None
    _in_summary: bool = False
    _root_next: bool = False
    _since_field: int = 0
    _in_traceback: bool = False

    @property
    def reading_all(self) -> bool:
        """Inside a summary every line matters (a traceback's lines hold its exception)."""
        return self._in_summary

    def feed(self, index: int, body: str, line: str = "", host: str | None = None) -> None:
        """Read one line body (``line``: the whole line, whose glog prefix names the agent's pid; ``host``: the host
        its prefix names, as pdsh's names the node of a DeepSpeed launcher's line)."""
        if match := _AGENT_FAILED.search(body):
            agent = _AGENT_PID.search(line or body)
            self._add(
                Failure(
                    index,
                    local_rank=int(match["local"]),
                    exitcode=int(match["code"]),
                    pid=int(match["pid"]),
                    text=body.strip(),
                    agent=int(agent["agent"]) if agent else None,
                )
            )
            return
        if match := _DEEPSPEED_FAILED.search(body):
            first = not self.failures
            self._add(
                Failure(
                    index,
                    local_rank=int(match["local"]),
                    host=host,
                    exitcode=int(match["code"]),
                    root=first,
                    text=body.strip(),
                )
            )
            return
        if match := _MPIRUN_SIGNALLED.search(body):
            self._add(
                Failure(
                    index,
                    rank=int(match["rank"]),
                    host=match["host"],
                    pid=int(match["pid"]),
                    signal=SIGNAL_NAMES.get(int(match["num"])),
                    root=True,  # mpirun names the first process that failed
                    text=body.strip(),
                )
            )
            return
        if match := _SPAWN_EXITED.search(body):
            self._add(
                Failure(
                    index,
                    local_rank=int(match["local"]),
                    exitcode=int(match["code"]) if match["code"] else None,
                    signal=match["sig"],
                    root=not self.failures,
                    text=body.strip(),
                )
            )
            return
        if match := _WORLD_INFO.search(body):
            if hosts := _world_info(match["info"]):
                self.nodes = len(hosts)
                self.first_ranks = dict(zip(hosts, itertools.accumulate([0, *hosts.values()]), strict=False))
            return
        if match := _DEEPSPEED_KILLING.search(body):
            self.closed_pids.add(int(match["pid"]))
            return
        if match := _CLOSING.search(body):
            self.closed_pids.add(int(match["pid"]))
            return
        if match := _FORCED.search(body):
            self.unresponsive_pids.add(int(match["pid"]))
            return
        if _SUMMARY_START.match(body) or _ROOT in body:
            self._close_block()
            self._in_summary, self._since_field = True, 0
            self._root_next = self._root_next or _ROOT in body
            return
        if not self._in_summary:
            return
        if _BLOCK.match(body):
            self._close_block()
            self._block = {"index": index, "root": self._root_next}
            self._root_next = False
            return
        if _SUMMARY_END.match(body):
            self._close_block()
            self._in_summary = False
            return
        if match := _FIELD.match(body):
            self._field(index, match["key"], match["value"].strip(), body)
            return
        self._since_field += 1
        if _SEPARATOR.match(body):  # between the failures and the root cause
            self._close_block()
            return
        if self._in_traceback and self._block is not None and body.strip():
            self._block["error"] = body.strip()  # the traceback's last line is its exception
        if self._since_field > (_TRACEBACK_LINES if self._in_traceback else _SUMMARY_FIELDS):
            self._close_block()
            self._in_summary = False

    def finish(self) -> None:
        """Keep the block a cut-off summary was in the middle of; give a worker the host its agent's summary names
        (an agent runs on one node: a worker it saw die in an earlier restart is on that node too)."""
        self._close_block()
        hosts: dict[int, set[str]] = {}
        for f in self.failures:
            if f.agent is not None and f.host:
                hosts.setdefault(f.agent, set()).add(f.host)
        for i, f in enumerate(self.failures):
            if f.host is None and f.agent is not None and len(named := hosts.get(f.agent, ())) == 1:
                self.failures[i] = replace(f, host=next(iter(named)))

    def _field(self, index: int, key: str, value: str, body: str) -> None:
        self._since_field, self._in_traceback = 0, key == "traceback"
        block = self._block
        if block is None or key in block:  # a block without its "[N]:" header, or the next one
            self._close_block()
            block = self._block = {"index": index, "root": self._root_next}
            self._root_next = False
        block[key] = value
        if key == "rank":
            block["text"] = body.strip()
        if key == "traceback":
            block["error"] = value

    def _close_block(self) -> None:
        block, self._block, self._in_traceback = self._block, None, False
        if not block or not any(key in block for key in ("rank", "host", "exitcode")):
            return
        rank = _RANK.match(str(block.get("rank", "")))
        code = _EXITCODE.match(str(block.get("exitcode", "")))
        error = str(block["error"]) if block.get("error") else None
        self._add(
            Failure(
                int(block["index"]),  # type: ignore[call-overload]
                rank=int(rank["rank"]) if rank else None,
                local_rank=int(rank["local"]) if rank and rank["local"] else None,
                host=str(block["host"]) or None if "host" in block else None,
                exitcode=int(code["code"]) if code else None,
                pid=int(code["pid"]) if code and code["pid"] else None,
                signal=code["sig"] if code and code["sig"] else None,
                error=error if error and error != "Traceback (most recent call last):" else None,
                root=bool(block.get("root")),
                text=str(block.get("text") or block.get("exitcode") or ""),
            )
        )

    def _add(self, failure: Failure) -> None:
        """Merge with what is known of the same worker (by pid) already, else append."""
        for i, known in enumerate(self.failures):
            same_local = (
                None in (known.local_rank, failure.local_rank) or known.local_rank == failure.local_rank
            )
            if failure.pid is not None and known.pid == failure.pid and same_local:
                merged = {
                    k: v for k, v in vars(failure).items() if v is not None and v is not False and v != ""
                }
                merged.pop("index", None)
                if known.rank is not None and merged.get("text"):
                    merged.pop("text", None)
                self.failures[i] = replace(known, **merged)
                return
        if len(self.failures) < MAX_FAILURES:
            self.failures.append(failure)

    # --- what it amounts to ---------------------------------------------------------------------------------

    def victim(self, failure: Failure) -> bool:
        """Whether the agent ended this worker itself (teardown after another worker failed)."""
        return failure.pid is not None and failure.pid in self.closed_pids

    def root(self) -> Failure | None:
        """torchrun's first observed failure (the earliest summary's), else the first failure seen."""
        return next((f for f in self.failures if f.root), None) or (
            self.failures[0] if self.failures else None
        )

    def killed(self) -> list[Failure]:
        """Workers ended by a signal that the agent did not send: killed from outside, or crashed; torchrun's root
        cause first, then SIGKILLs (a watchdog's SIGABRT follows a timeout that something else caused)."""
        killed = [
            f
            for f in self.failures
            if f.signal_name and f.signal_name not in STOP_SIGNALS and not self.victim(f)
        ]
        return sorted(killed, key=lambda f: (not f.root, f.signal_name != "SIGKILL"))

    def unresponsive(self) -> list[Failure]:
        """Workers that ignored the agent's SIGTERM (stopped, or stuck where signals wait): hung."""
        return [f for f in self.failures if f.pid is not None and f.pid in self.unresponsive_pids]


def _world_info(world_info: str) -> dict[str, int] | None:
    """DeepSpeed's ``--world_info``: each host and how many slots (ranks) it runs, in order (None when it is not
    base64 JSON of a host map)."""
    text = world_info.rstrip("=").replace("+", "-").replace("/", "_")
    try:
        info = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (
        ValueError,
        RecursionError,
    ):  # not base64 (binascii.Error), not JSON, or nested past Python's limit
        return None
    if not isinstance(info, dict) or not info:
        return None
    return {str(host): len(slots) if isinstance(slots, list) else 0 for host, slots in info.items()}
