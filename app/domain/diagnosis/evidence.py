"""Reading a log once: the votes, markers, Xids and facts that :mod:`app.domain.diagnosis` weighs.

Pure: strings in, a :class:`Reading` out. Each line is classified by the signature catalogue; lines that vote, mark
or carry context (NCCL's rank table, torchrun's failure summary, grad-norm figures) are parsed for who wrote
them (:mod:`app.domain.diagnosis.lines`). Nothing here decides the verdict.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.domain.diagnosis import launcher as launchers
from app.domain.diagnosis import xid as xids
from app.domain.diagnosis.lines import Layout, LogLine, normalise_pci, read_layout, unshipped
from app.domain.diagnosis.lines import parse_line as parse_one
from app.domain.diagnosis.signatures import Signature, SignatureCatalogue

MAX_LINE_CHARS = 4096  # a pathological multi-megabyte "line" is matched on its head only

# Context worth parsing even when no signature matches: NCCL's rank table, torchrun's failure summary,
# world size, gradient norms, restarts.
_CONTEXT = re.compile(
    r"\bnranks \d|\bnRanks \d|^\s*(?:\[[^\]]*\]:?\s*)*(?:host|rank|exitcode)\s*: |Root Cause \(first observed|"
    r"world[_ ]size|WORLD_SIZE|grad[_ ]norm|(?i:resum(?:ing|ed)|load(?:ing|ed) (?:the )?checkpoint|restart)|"
    r"monitoredBarrier|last enqueued NCCL work"
)
_NCCL_RANK = re.compile(
    r"\brank (?P<rank>\d+) nranks (?P<n>\d+) cudaDev (?P<dev>\d+)(?: nvmlDev \d+)? busId (?P<bus>[0-9a-fA-F]+)"
)
_NCCL_NRANKS = re.compile(r"\bn[Rr]anks (?P<n>\d+)")
_WORLD = re.compile(r"(?i)world[_ ]size['\"]?\s*[:=]\s*(?P<n>\d+)")
# gloo's timeout of a collective's transfer (third_party/gloo/gloo/transport/tcp/unbound_buffer.cc, pair.cc)
_GLOO_TIMEOUT = re.compile(
    r"Timed out waiting \d+ms for (?:recv|send) operation|Application timeout caused pair closure"
)
_GRAD_NORM = re.compile(r"(?i)grad[_ ]norm['\"]?\s*[:=]\s*(?P<v>[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))")
_RESTART = re.compile(r"(?i)\bresum(?:ing|ed)\b|\bload(?:ing|ed) (?:the )?checkpoint|\brestart(?:ing|ed)?\b")
_SEQ = re.compile(r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)")
_WATCHDOG = "Watchdog caught collective operation timeout"
_ENQUEUED = re.compile(r"last enqueued NCCL work: (?P<n>-?\d+)")
_BARRIER = re.compile(r"\bRanks? (?P<ranks>\d+(?:, ?\d+)*) failed to pass monitoredBarrier")
# A rank other than 0 in monitored_barrier: rank 0 (the barrier's root) failed it (ProcessGroupGloo.cpp).
_BARRIER_ROOT = re.compile(
    r"reached monitoredBarrier, but received errors while waiting for send/recv from rank (?P<rank>\d+)"
)
# ProcessGroupNCCL's rank that waits for the communicator's unique id, which its root publishes in the store
# (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp; "retreiving" in releases before 2.1)
_UNIQUE_ID_ROOT = re.compile(r"retr(?:ie|ei)ving ncclUniqueId from \[(?P<rank>\d+)\]")
# c10d's TCPStore client failing to reach the store's host (the rendezvous endpoint, MASTER_ADDR).
_UNREACHABLE = re.compile(
    r"trying to connect to \((?P<a>[A-Za-z][\w.-]*), \d+\)|"
    r"failed to connect/validate to host (?P<b>[A-Za-z][\w.-]*):\d+"
)
# JAX's coordination barrier names the tasks that never arrived, one a line after this.
_JAX_TIMED_OUT = "Timed out task names:"
_JAX_TASK_LINE = re.compile(r"^\s*/job:[\w-]+/replica:\d+/task:(?P<task>\d+)\s*$")
# srun's end of one node's tasks (slurm/src/srun: "srun: error: node7: task 3: Killed", "... tasks 0-3: Exited with
# exit code 1"); Killed is SIGKILL, which nothing in the job sends itself.
_SRUN_TASK_END = re.compile(
    r"^srun: error: (?P<host>[\w.-]+): tasks? [\d,-]+: (?P<end>Killed|Exited with exit code \d+|Terminated)\s*$"
)
# kubectl describe pod: the node the pod ran on, for every line of that section.
_K8S_NODE = re.compile(r"^Node:\s+(?P<host>[A-Za-z0-9][\w.-]*)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SECTION = re.compile(r"==> (?P<title>.{1,200}) <==\s*$")  # tail's and our collect actions' section headers
_HOSTNAME = re.compile(r"(?=[A-Za-z0-9.-]*\d)[A-Za-z][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*")
_ITERATION = re.compile(r"(?i)\b(?:iteration|iter|step)\b\s*[:=]?\s*(?P<n>\d+)")


@dataclass(frozen=True)
class Vote:
    """One line's vote for a category."""

    line: LogLine
    signature: Signature

    @property
    def category(self) -> str:
        return self.signature.category

    @property
    def weight(self) -> float:
        return self.signature.weight


@dataclass(frozen=True)
class Marker:
    """A line marking shutdown, completion, progress or recovery (see :data:`app.domain.diagnosis.signatures.ROLES`)."""

    index: int
    signature: Signature
    raw: str


@dataclass
class Reading:
    """Everything one pass over the lines found."""

    line_count: int = 0
    votes: list[Vote] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    noise: int = 0  # lines silenced as known chatter
    xid_lines: list[tuple[LogLine, xids.XidEvent]] = field(default_factory=list)
    rank_hosts: dict[int, str] = field(default_factory=dict)
    rank_gpus: dict[int, str] = field(default_factory=dict)
    pci_gpus: dict[tuple[str | None, str], str] = field(default_factory=dict)  # (host, pci) -> cudaDev
    ranks_seen: set[int] = field(default_factory=set)
    world_size: int | None = None
    # nranks of NCCL's rank-table lines: one size, one communicator (no tensor- or pipeline-parallel groups mixed in)
    comm_sizes: set[int] = field(default_factory=set)
    launcher: launchers.LauncherReading = field(default_factory=launchers.LauncherReading)  # torchrun's agent
    grad_norms: list[tuple[float, LogLine]] = field(default_factory=list)
    restarts: list[int] = field(default_factory=list)  # line indexes of resume/restart messages
    timeouts: dict[int, tuple[int, str, LogLine]] = field(default_factory=dict)  # rank -> (seq, op, line)
    # the ranks the others name as missing, with the line naming them: monitored_barrier's and JAX's barrier's
    # ranks that did not arrive, the root whose NCCL unique id the others could not get from the store
    missing: dict[int, LogLine] = field(default_factory=dict)
    enqueued: dict[int, tuple[int, LogLine]] = field(default_factory=dict)  # rank -> last enqueued NCCL work
    unreachable: dict[str, LogLine] = field(default_factory=dict)  # store hosts the ranks could not reach
    # srun's word on each node's task: the nodes whose task was killed by SIGKILL (from outside: the node lost, the
    # OOM killer), and the nodes whose task exited with a status of its own.
    srun_killed: dict[str, LogLine] = field(default_factory=dict)
    srun_exited: set[str] = field(default_factory=set)
    layout: Layout = field(default_factory=Layout)  # what srun's tasks and torchrun's local ranks mean here

    def first(self, role: str) -> Marker | None:
        return next((m for m in self.markers if m.signature.role == role), None)

    def last(self, role: str) -> Marker | None:
        return next((m for m in reversed(self.markers) if m.signature.role == role), None)

    def stopped_before(self, index: int) -> Marker | None:
        """The stop (shutdown or completion marker) that line ``index`` follows with no progress or restart in
        between: the job was stopped or had finished when the line was written. None when it ran on."""
        for marker in reversed(self.markers):  # markers are in line order
            if marker.index >= index:
                continue
            if marker.signature.role in ("shutdown", "completed"):
                return marker
            if marker.signature.role == "progress":
                return None
        return None

    def restarted_between(self, start: int, end: int) -> bool:
        return any(start < r < end for r in self.restarts)

    def after(self, role: str, index: int) -> list[Marker]:
        return [m for m in self.markers if m.signature.role == role and m.index > index]


def read(lines: Sequence[str], catalogue: SignatureCatalogue) -> Reading:
    """Classify and parse ``lines`` (already bounded by the caller) in one pass."""
    reading = Reading(line_count=len(lines), layout=read_layout(lines))
    agent = reading.launcher
    jax_barrier: LogLine | None = None  # the barrier timeout whose missing tasks the next lines name
    section_starts = [0]  # the line each section starts at
    section_nodes: dict[int, str] = {}  # a section's start -> the Kubernetes node it names ("Node:")
    section_host: str | None = None  # from a "==> dmesg node7 <==" header: where the lines below come from
    layout = reading.layout

    def parse_line(index: int, text: str) -> LogLine:
        line = layout.resolve(parse_one(index, text))
        return dataclasses.replace(line, host=section_host) if section_host and not line.host else line

    for index, raw in enumerate(lines):
        probe = raw[:MAX_LINE_CHARS]
        if "\x1b[" in probe:  # terminal colours (rich, Lightning, coloredlogs) are not part of the text
            probe = raw = _ANSI.sub("", probe)
        parsed: LogLine | None = None
        own = unshipped(probe)  # the writer's own words, for the lines read by how they start
        if own.startswith("==> ") and (header := _SECTION.match(own)):
            section_host = next((word for word in header["title"].split() if _HOSTNAME.fullmatch(word)), None)
            section_starts.append(index)
        elif own.startswith("Node:") and (k8s_node := _K8S_NODE.match(own)):
            section_nodes[section_starts[-1]] = k8s_node["host"]
            section_host = k8s_node["host"]
        if own.startswith("srun: error: ") and (task := _SRUN_TASK_END.match(own)):
            if task["end"] == "Killed":
                reading.srun_killed.setdefault(task["host"], parse_line(index, probe))
            else:
                reading.srun_exited.add(task["host"])
        if jax_barrier is not None and (task := _JAX_TASK_LINE.match(own)):
            reading.missing.setdefault(int(task["task"]), jax_barrier)
        elif jax_barrier is not None and probe.strip():
            jax_barrier = None
        if event := xids.xid_from_line(probe):
            parsed = parse_line(index, probe)
            reading.xid_lines.append((parsed, event))
        else:
            match = catalogue.classify(own)
            if match.cause is not None:
                parsed = parse_line(index, probe)
                reading.votes.append(Vote(parsed, match.cause))
            if match.marker is not None:
                if match.marker.role == "noise":
                    reading.noise += 1
                else:
                    reading.markers.append(Marker(index, match.marker, raw.strip()))
        if agent.reading_all or launchers.CONTEXT.search(probe):
            parsed = parsed or parse_line(index, probe)
            agent.feed(index, parsed.body, probe, parsed.host)
        if not _CONTEXT.search(probe) and parsed is None:
            continue
        parsed = parsed or parse_line(index, probe)
        if parsed.rank is not None:
            reading.ranks_seen.add(parsed.rank)
            if parsed.host:
                reading.rank_hosts.setdefault(parsed.rank, parsed.host)
        body = parsed.body
        if match_rank := _NCCL_RANK.search(body):
            rank = int(match_rank["rank"])
            reading.ranks_seen.add(rank)
            reading.world_size = reading.world_size or int(match_rank["n"])
            reading.comm_sizes.add(int(match_rank["n"]))
            reading.rank_gpus.setdefault(rank, match_rank["dev"])
            if parsed.host:
                reading.rank_hosts.setdefault(rank, parsed.host)
            reading.pci_gpus.setdefault((parsed.host, normalise_pci(match_rank["bus"])), match_rank["dev"])
        elif match_n := _NCCL_NRANKS.search(body) or _WORLD.search(body):
            reading.world_size = reading.world_size or int(match_n["n"])
        if "grad" in body and (norm := _GRAD_NORM.search(body)):
            reading.grad_norms.append((float(norm["v"]), parsed))
        if _RESTART.search(body):
            reading.restarts.append(index)
        if (
            "connect" in body
            and (store := _UNREACHABLE.search(body))
            and (host := store["a"] or store["b"]) != "localhost"
        ):
            reading.unreachable.setdefault(host, parsed)
        if _JAX_TIMED_OUT in body:
            jax_barrier = parsed
        if "monitoredBarrier" in body and (barrier := _BARRIER.search(body)):
            for rank_text in barrier["ranks"].split(","):
                reading.missing.setdefault(int(rank_text), parsed)
        elif "monitoredBarrier" in body and (root := _BARRIER_ROOT.search(body)):
            reading.missing.setdefault(int(root["rank"]), parsed)
        if "ncclUniqueId" in body and (root := _UNIQUE_ID_ROOT.search(body)):
            reading.missing.setdefault(int(root["rank"]), parsed)
        if parsed.rank is not None and "last enqueued" in body and (enqueued := _ENQUEUED.search(body)):
            reading.enqueued.setdefault(parsed.rank, (int(enqueued["n"]), parsed))
        if _WATCHDOG in body and parsed.rank is not None and (seq := _SEQ.search(body)):
            reading.timeouts.setdefault(parsed.rank, (int(seq["seq"]), seq["op"], parsed))
        elif parsed.rank is not None and _GLOO_TIMEOUT.search(body):
            reading.timeouts.setdefault(parsed.rank, (-1, "gloo", parsed))
    agent.finish()
    if section_nodes:  # a pod's section names its node anywhere in it: every line of it is from that node
        for i, vote in enumerate(reading.votes):
            start = section_starts[bisect.bisect_right(section_starts, vote.line.index) - 1]
            if start in section_nodes:
                reading.votes[i] = Vote(
                    dataclasses.replace(vote.line, host=section_nodes[start]), vote.signature
                )
    for failure in agent.failures:
        if failure.rank is None:
            continue
        reading.ranks_seen.add(failure.rank)
        if failure.host and failure.host != "localhost":
            reading.rank_hosts.setdefault(failure.rank, failure.host)
        if failure.error and (_GLOO_TIMEOUT.search(failure.error) or _WATCHDOG in failure.error):
            line = layout.resolve(parse_one(failure.index, failure.text))
            reading.timeouts.setdefault(failure.rank, (-1, "gloo", line))
    return reading


def iteration_of(line: LogLine) -> int | None:
    """The iteration or step number a line names, if any."""
    match = _ITERATION.search(line.body)
    return int(match["n"]) if match else None


def exploding(norms: Iterable[tuple[float, LogLine]]) -> tuple[float, float, LogLine] | None:
    """(baseline, peak, line) when finite gradient norms grew by two orders of magnitude over the run's
    median to above 1000; None otherwise. NaN and inf norms are the numerical signatures' business."""
    finite = [(value, line) for value, line in norms if math.isfinite(value)]
    if len(finite) < 4:
        return None
    head = sorted(value for value, _ in finite[: max(2, len(finite) // 2)])
    baseline = head[len(head) // 2]
    peak, line = max(finite, key=lambda item: item[0])
    if peak >= 1000 and peak >= 100 * max(baseline, 1e-9) and line.index > finite[0][1].index:
        return baseline, peak, line
    return None
