"""Who said what, and when: the rank, host, GPU and time of one log line, from its prefixes and its text.

Pure string work. A line reaches diagnosis with whatever its launcher and log shipper put in front of it, often
several at once (``2024-03-21T02:07:08Z gpu-node-07 [stderr] [rank3]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607]
[Rank 3] ...``). :func:`parse_line` peels the known prefixes off the front (timestamps, syslog host, ``pdsh``'s
``host:``, ``kubectl logs --prefix``'s ``[pod/NAME/CONTAINER]``, ``srun -l``'s ``3:``, torch's ``[rank3]:`` and
torchrun's ``[default3]:``), then reads the facts the body itself names (NCCL's ``host:pid:tid [gpu]``, c10d's
``[Rank 3]``, Slurm's ``srun: error: HOST: task 3:``, Megatron's ``Rank 12: ... Device: 2, node: HOST``, the
driver's ``NVRM: Xid (PCI:...)``). What is not named stays None.

Two prefixes name a rank only in some jobs, and one line cannot tell which: ``srun -l``'s label is a task's
number, the rank's under one task per rank but the node's under one launcher per node (torchrun, whose workers
tag their own lines: ``1: [rank9]: ...``); torchrun's ``[default3]:`` is the worker's rank within its node, the
job's rank only on one node. :func:`read_layout` reads which from the whole log, and :meth:`Layout.resolve` gives
a line the rank and host they mean there; what the log leaves open stays unknown rather than guessed.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

_MONTHS = {
    m: i
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], start=1
    )
}

# Leading prefixes, tried in turn until none matches. Each is anchored at the current position.
_ISO = re.compile(
    r"\[?(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T _](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,]\d+)?"
    r"(?:Z|[+-]\d\d:?\d\d)?(?:\]:?)?\s*"
)
_CTIME = re.compile(  # dmesg -T: [Mon Oct 16 09:50:06 2017]
    r"\[(?:\w{3}) (?P<mon>\w{3}) +(?P<d>\d+) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d) (?P<y>\d{4})\]\s*"
)
_SYSLOG = (
    re.compile(  # Jan  1 12:00:00 gpu-node-07 kernel: ... (journalctl -o short-precise: 12:00:00.123456)
        r"(?:<\d{1,3}>)?(?P<mon>[A-Z][a-z]{2}) +(?P<d>\d+) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.\d+)? "
        r"(?P<host>[\w.-]+) [\w./-]+(?:\[\d+\])?:\s*"
    )
)
# RFC 5424 syslog as shippers forward it: <PRI>1 TIMESTAMP HOST APP PROCID MSGID STRUCTURED-DATA MSG
_RFC5424 = re.compile(
    r"<\d{1,3}>1 (?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)T(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.\d+)?"
    r"(?:Z|[+-]\d\d:\d\d) (?P<host>[\w.:-]+|-) \S+ \S+ \S+ (?:-|(?:\[[^\]]*\])+) ?"
)
# talosctl dmesg / logs: "192.168.11.119: kern: warning: [2026-04-22T21:27:51.291660856Z]: NVRM: ..." (the node, as
# talosctl was given it, often an address; the facility; the level, right-aligned; the time)
_TALOS = re.compile(
    r"(?P<host>[\w.:-]{1,253}): +(?:kern|user|daemon|syslog|auth|authpriv|local\d): +"
    r"(?:emerg|alert|crit|err|warning|notice|info|debug): +"
)
_UPTIME = re.compile(r"\[\s*\d+\.\d+\]\s*")  # dmesg: [12345.678901]
_GLOG = re.compile(  # glog / c10d: E0321 02:07:08.408271 12345 file.cpp:607]
    r"\[?[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\.\d+(?: +\d+)?(?: [\w./-]+:\d+)?\]\s*"
)
# [rank3]: (torch), [rank: 3] (Lightning), [1,3]<stderr>: (Open MPI --tag-output), [3]<stderr>: (horovodrun),
# "[3] " (per-process output tags)
_RANK_TAG = re.compile(
    r"(?:\[rank:? ?(?P<rank>\d{1,6})\]:?"
    r"|\[(?:\d{1,6},)?(?P<mpi>\d{1,6})\]<std(?:out|err)>:|\[(?P<bare>\d{1,5})\](?= ))\s*",
    re.IGNORECASE,
)
# torchrun --tee's "[{role}{local_rank}]:" (torch/distributed/elastic/multiprocessing/tail_log.py), role "default"
# unless --role names another
_ROLE_TAG = re.compile(r"\[(?:default|worker|trainer)(?P<local>\d{1,6})\]:\s*", re.IGNORECASE)
# Ray's "(RayTrainWorker pid=1, ip=10.0.0.3)" and SkyPilot's "(head, rank=0, pid=5634)", "(worker1, rank=1,
# pid=15406, ip=10.164.0.57)", "(setup pid=8665)", "(task, pid=1918)", older "(node-1 pid=23066, ip=...)": the
# node's address where it is given. SkyPilot's rank is the node's (SKYPILOT_NODE_RANK), not a process's: not read.
_RAY = re.compile(r"\((?:[\w.-]+,? )?(?:rank=\d+, )?pid=\d+(?:, ip=(?P<host>[\w.:-]+))?\)\s*")
_POD = re.compile(r"\[pod/(?P<host>[\w.-]+)/[\w.-]+\]\s*")
# Open MPI's (opal) signal handler and error messages: "[gpu-a02:12345] *** Process received signal ***"
_OMPI_PROC = re.compile(r"\[(?P<host>[A-Za-z][\w.-]{0,62}):\d{1,8}\] ")
_SRUN_LABEL = re.compile(r"(?P<task>\d{1,6}): ")
# pdsh / DeepSpeed launcher / syslog-ish "host: " — a host name holds a digit and is lower case, so that
# "RuntimeError: " or "NCCL: " never reads as a host; nor does a kernel driver's "nvidia-nvswitch3: ". An IPv4
# address is a host too (pdsh's prefix when DeepSpeed's hostfile lists addresses).
_HOST_COLON = re.compile(
    r"(?!(?:fp|bf|int|uint|float|sm|cuda|zero|stage|gpt|rank|step|epoch|iter)\d+:"
    r"|nvidia-(?:nvswitch\d*|modeset|uvm|peermem|drm|fs):)"
    r"(?P<host>(?=[a-z0-9.-]*\d)[a-z][a-z0-9.-]{1,62}|\d{1,3}(?:\.\d{1,3}){3}):\s+(?!\d)"
)
# After a timestamp: "gpu-f02 kernel: ", "hgx-07 train[99120]: ", "gpu-c12 [stderr] " (a host holds a digit).
_HOST_PROG = re.compile(
    r"(?P<host>(?=[A-Za-z0-9.-]*\d)[A-Za-z][A-Za-z0-9.-]{1,62}) "
    r"(?:\[(?:stdout|stderr)\]|[A-Za-z][\w./-]*(?:\[\d+\])?:)\s*"
)
# "[stderr] ", "|| ", and the container runtime's log files (CRI: "<RFC 3339 time> stderr F <line>", F a full line,
# P a part of one), as /var/log/pods and /var/log/containers hold them on a Kubernetes node
_STREAM = re.compile(r"\[(?:stdout|stderr)\]\s*|\|\|\s*|(?:stdout|stderr) [FP] ")
_PID_TAG = re.compile(r"\[\d{1,8}\]\s+(?=\[)")  # "[80746] [rank0]:" from some log collectors

# Facts named inside the body.
_NCCL_SOURCE = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[(?P<gpu>\d+)\] ")
_JSON_RANK = re.compile(r'"(?:rank|global_rank|RANK|process_index)"\s*:\s*"?(?P<rank>\d{1,6})\b')
_JSON_HOST = re.compile(
    r'"(?:host|hostname|node|nodename|HOSTNAME|_HOSTNAME)"\s*:\s*"(?P<host>[\w.-]{1,253})"'
)
_JAX_TASK = re.compile(r"/job:[\w-]+/replica:\d+/task:(?P<rank>\d+)")
_C10D_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (?P<rank>\d{1,6})\]")
_SRUN_TASK = re.compile(r"srun: error: (?P<host>[\w.-]+): tasks? (?P<task>\d{1,6})(?P<more>(?:[-,]\d+)*): ")
_MEGATRON = re.compile(r"\bRank (?P<rank>\d{1,6}): found (?:NaN|Inf)\b")
_DEVICE = re.compile(r"\bDevice: (?P<gpu>\d+)")
_NODE = re.compile(r"\bnode: (?P<host>[\w.-]+)")
_DS_RANK = re.compile(r"\[Rank (?P<rank>\d{1,6})\]|\bRank (?P<rank2>\d{1,6}) Skipping step\b")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\)")
# Ray's memory monitor: "Memory on the node (IP: 172.24.0.226, ID: 8289f8...)", the raylet's "at node (ID: .., IP: ..)"
_RAY_NODE = re.compile(r"\bnode \((?:IP: (?P<host>[\w.:]+), ID: \w+|ID: \w+, IP: (?P<host2>[\w.:]+))\)")
_ON_NODE = re.compile(r"\bON (?P<host>[\w.-]+) CANCELLED AT\b|\bNode failure on (?P<host2>[\w.-]+)")


@dataclass(frozen=True)
class LogLine:
    """One line: its position, the text without prefixes, and who wrote it, when known."""

    index: int
    raw: str
    body: str
    rank: int | None = None  # the job's rank (RANK), where the line names it
    host: str | None = None
    gpu: str | None = None
    pci: str | None = None
    time: float | None = (
        None  # seconds since the epoch; year 2000 when the format has no year (relative only)
    )
    task: int | None = None  # srun's task number (srun -l's label, srun's own "task N" lines)
    local_rank: int | None = None  # the worker's rank within its node (torchrun's tag)


def parse_line(index: int, raw: str) -> LogLine:
    """Split ``raw`` into prefixes and body and read who and when from both."""
    rest = raw.lstrip()
    rank: int | None = None
    task: int | None = None
    local_rank: int | None = None
    host: str | None = None
    gpu: str | None = None
    when: float | None = None
    stamped = False  # the previous prefix was a timestamp: a "host prog:" may follow
    for _ in range(8):  # bounded: each pass removes one prefix
        after_stamp, stamped = stamped, False
        if match := _ISO.match(rest):
            stamped = True
            when = when or _epoch(int(match["y"]), int(match["mo"]), match)
        elif match := _CTIME.match(rest):
            stamped = True
            when = when or _epoch(int(match["y"]), _MONTHS.get(match["mon"].lower(), 1), match)
        elif host is None and (match := _TALOS.match(rest)):
            host = match["host"]
        elif match := _RFC5424.match(rest):
            when = when or _epoch(int(match["y"]), int(match["mo"]), match)
            host = host or (match["host"] if match["host"] != "-" else None)
        elif match := _SYSLOG.match(rest):
            when = when or _epoch(2000, _MONTHS.get(match["mon"].lower(), 1), match)
            host = host or match["host"]
        elif match := _GLOG.match(rest):
            when = when or _epoch(2000, int(match["mo"]), match)
        elif host is None and after_stamp and (match := _HOST_PROG.match(rest)):
            host = match["host"]
        elif (
            (match := _UPTIME.match(rest))
            or (match := _STREAM.match(rest))
            or (match := _PID_TAG.match(rest))
        ):
            pass
        elif match := _RANK_TAG.match(rest):
            rank = int(match["rank"] or match["mpi"] or match["bare"]) if rank is None else rank
        elif match := _ROLE_TAG.match(rest):
            local_rank = int(match["local"]) if local_rank is None else local_rank
        elif (match := _RAY.match(rest)) or (match := _POD.match(rest)) or (match := _OMPI_PROC.match(rest)):
            host = host or match["host"]
        elif task is None and rank is None and local_rank is None and (match := _SRUN_LABEL.match(rest)):
            task = int(match["task"])
        elif host is None and (match := _HOST_COLON.match(rest)) and not _NCCL_SOURCE.match(rest):
            host = match["host"]
        else:
            break
        rest = rest[match.end() :]
    body = rest
    pci = None
    if (match := _NCCL_SOURCE.match(body)) or (" NCCL " in body and (match := _NCCL_SOURCE.search(body))):
        host, gpu = host or match["host"], match["gpu"]
    if rank is None and "/task:" in body and (match := _JAX_TASK.search(body)):
        rank = int(match["rank"])
    if body.startswith("{"):  # a JSON log record: its own rank and host fields
        if rank is None and (match := _JSON_RANK.search(body)):
            rank = int(match["rank"])
        if host is None and (match := _JSON_HOST.search(body)):
            host = match["host"]
    if rank is None and (match := _C10D_RANK.search(body) or _DS_RANK.search(body)):
        rank = int(next(g for g in match.groups() if g is not None))
    if match := _SRUN_TASK.search(body):
        host = match["host"]
        task = int(match["task"]) if task is None else task
    elif (match := _ON_NODE.search(body)) or ("node (" in body and (match := _RAY_NODE.search(body))):
        host = host or match["host"] or match["host2"]
    if ("found N" in body or "found I" in body) and (match := _MEGATRON.search(body)):
        rank = int(match["rank"]) if rank is None else rank
        if device := _DEVICE.search(body, match.end()):
            gpu = gpu or device["gpu"]
        if node := _NODE.search(body, match.end()):
            host = host or node["host"]
    if match := _XID.search(body):
        pci = normalise_pci(match["pci"])
    return LogLine(index, raw, body, rank, host, gpu, pci, when, task, local_rank)


# What read_layout looks at: srun -l's label before a rank or torchrun tag, the launchers that start one process per
# node, srun's own task lines, NCCL's and torchrun's summary's host names.
_TASK_TAGGED = re.compile(
    r"(?P<task>\d{1,6}): (?:\[rank:? ?(?P<rank>\d{1,6})\]|\[(?:default|worker|trainer)\d{1,6}\]:)",
    re.IGNORECASE,
)
_PER_NODE_LAUNCHER = re.compile(
    r"\[(?:default|worker|trainer)\d{1,6}\]:|torch[./]distributed[./](?:elastic|run|launch)\b|\btorchrun\b|"
    r"LocalElasticAgent|--world_info\b|\baccelerate launch\b",
    re.IGNORECASE,
)
_SUMMARY_HOST = re.compile(r"^\s*host\s*: (?P<host>[\w.-]+)\s*$")
MAX_LAYOUT_HOSTS = 4096  # hosts and tasks remembered: enough to tell one node from several, and to name them


@dataclass(frozen=True)
class Layout:
    """How the job was started, as far as its whole log tells: what its tasks and local ranks mean."""

    tasks_are_ranks: bool = True  # srun started one task per rank (no launcher per node under it)
    one_node: bool = True  # nothing in the log names a second node: a local rank is the job's rank
    # srun's task -> its node, from srun's own lines
    task_hosts: Mapping[int, str] = field(default_factory=dict)

    def resolve(self, line: LogLine) -> LogLine:
        """``line`` with the rank and host its task and local rank mean in this log."""
        rank, host = line.rank, line.host
        if rank is None and line.task is not None and self.tasks_are_ranks:
            rank = line.task
        if rank is None and line.local_rank is not None and self.one_node:
            rank = line.local_rank
        if host is None and line.task is not None:
            host = self.task_hosts.get(line.task)
        if (rank, host) == (line.rank, line.host):
            return line
        return dataclasses.replace(line, rank=rank, host=host)


def read_layout(lines: Iterable[str]) -> Layout:
    """The :class:`Layout` of a log, in one pass of a few regular expressions a line."""
    per_node = False
    tasks: set[int] = set()
    hosts: set[str] = set()
    task_hosts: dict[int, str] = {}
    for raw in lines:
        own = unshipped(raw.lstrip())
        if (tagged := _TASK_TAGGED.match(own)) and len(tasks) < MAX_LAYOUT_HOSTS:
            tasks.add(int(tagged["task"]))
            per_node = per_node or tagged["rank"] is None or tagged["rank"] != tagged["task"]
        per_node = per_node or bool(_PER_NODE_LAUNCHER.search(own))
        if len(hosts) >= MAX_LAYOUT_HOSTS:
            continue
        if own.startswith("srun: error: ") and (task := _SRUN_TASK.match(own)):
            hosts.add(task["host"])
            if not task["more"]:  # "tasks 0-3": several tasks on one node, each its own rank
                task_hosts.setdefault(int(task["task"]), task["host"])
        elif " NCCL " in own and (source := _NCCL_SOURCE.search(own)):
            hosts.add(source["host"])
        elif "host" in own and (summary := _SUMMARY_HOST.match(own)):
            hosts.add(summary["host"])
    return Layout(not per_node, len(tasks) <= 1 and len(hosts) <= 1, task_hosts)


def unshipped(raw: str) -> str:
    """``raw`` without what a log shipper or the container runtime put in front of the writer's own text: leading
    timestamps and a stream tag (``2025-06-01T12:00:00.1Z stderr F srun: error: ...``). For the lines read by
    their first words (srun's task ends, section headers), which a shipped copy of the log still holds."""
    rest = raw
    for _ in range(3):  # bounded: a time, a stream tag, a second time
        match = _ISO.match(rest) or _CTIME.match(rest) or _STREAM.match(rest)
        if match is None or not match.end():
            break
        rest = rest[match.end() :]
    return rest


def normalise_pci(text: str) -> str:
    """A PCI address as ``domain:bus:device`` in lower case without the function: ``0000:3b:00``.

    NVRM prints ``0000:3b:00``, DCGM ``00000000:3B:00.0``, NCCL ``busId 3b000``; they compare equal after this."""
    text = text.strip().lower()
    if ":" not in text:  # NCCL's busId: bus+device+function in hex digits, e.g. 3b000 or 1b0000
        digits = text.rjust(5, "0")
        return f"0000:{digits[-5:-3]}:{digits[-3:-1]}"
    parts = text.split(".")[0].split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    domain, bus, device = parts[-3:]
    return f"{domain[-4:].rjust(4, '0')}:{bus.rjust(2, '0')}:{device.rjust(2, '0')}"


def _epoch(year: int, month: int, match: re.Match[str]) -> float | None:
    try:
        moment = datetime(year, month, int(match["d"]), int(match["h"]), int(match["mi"]), int(match["s"]))
    except ValueError:
        return None
    return (moment - datetime(1970, 1, 1)).total_seconds()
