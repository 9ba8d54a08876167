"""Slurm commands (scontrol, squeue, scancel) built as argv, run over SSH, parsed by pure functions.

Contract: every value is checked against a strict pattern (:mod:`app.domain.params`) before it goes into an argv
(:class:`~app.domain.errors.ParamError` otherwise, and nothing runs). Methods return parsed data or raise
:mod:`app.domain.errors`: a non-zero exit is :class:`~app.domain.errors.CommandFailed` (exit code and output kept), and
Slurm's "Invalid job id specified" / "Invalid node name specified" / "Node X not found" are
:class:`~app.domain.errors.NotFound`. Transport errors come from the runner (:mod:`app.clients.ssh`).

Parsing: ``scontrol show node|job -o`` prints one ``Key=value`` line whose values may contain spaces
(``Reason=nightshift: Xid 79 [root@2026-...]``, ``JobName=my job``, paths). A value runs up to the next
*known* key of the record type (the 22.05 field sets below), and the first occurrence of a key wins. Job
owners choose JobName and Comment, so text inside them can shadow later job fields: nothing that grants
access is decided from a job record alone (see :func:`parse_owner`, from ``squeue``'s numeric ids, and
``run_as`` of :func:`tail_command`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Protocol

from app.domain.discovery import parse_node_addresses
from app.domain.errors import CommandFailed, CredentialRejected, NotFound, ParamError
from app.domain.hostlist import HostlistError, expand_hostlist
from app.domain.outcome import tail
from app.domain.params import SAFE_TEXT, SLURM_JOB_ID, SLURM_NODE_NAME, SLURM_RESERVED

if TYPE_CHECKING:
    from app.clients.ssh import CommandResult
    from app.config import Settings

# A Slurm hostlist expression as scontrol prints it: node1,node[3-5],gpu[01-04].
HOSTLIST = r"[A-Za-z0-9._\[\],-]{1,4096}"
PARTITION = r"[A-Za-z0-9_.-]{1,64}"
# A file path as Slurm reports it (StdOut=...): absolute, printable, no control characters.
REMOTE_PATH = r"/[^\x00-\x1f\x7f]{0,4095}"
MAX_TAIL_LINES = 10_000

# Field names of `scontrol show node -o` in 22.05 (plus the optional ones of slurm_print_node_info_msg).
NODE_KEYS = (
    "NodeName", "Arch", "CoresPerSocket", "CPUAlloc", "CPUEfctv", "CPUTot", "CPULoad", "CPUSpecList",
    "AvailableFeatures", "ActiveFeatures", "Gres", "GresDrain", "GresUsed", "NodeAddr", "NodeHostName",
    "Port", "Version", "OS", "RealMemory", "AllocMem", "FreeMem", "MemSpecLimit", "Sockets", "Boards",
    "State", "ThreadsPerCore", "TmpDisk", "Weight", "Owner", "MCS_label", "NextState", "Partitions",
    "BootTime", "SlurmdStartTime", "LastBusyTime", "ResumeAfterTime", "CfgTRES", "AllocTRES", "CapWatts",
    "CurrentWatts", "AveWatts", "LowestJoules", "ConsumedJoules", "ExtSensorsJoules", "ExtSensorsWatts",
    "ExtSensorsTemp", "Reason", "Comment", "Extra", "InstanceId", "InstanceType", "ReservationName",
    "CoreSpecCount",
)  # fmt: skip
# Field names of `scontrol show job -o` in 22.05 (plus the optional ones of slurm_sprint_job_info).
JOB_KEYS = (
    "JobId", "ArrayJobId", "ArrayTaskId", "ArrayTaskThrottle", "HetJobId", "HetJobOffset", "HetJobIdSet",
    "JobName", "UserId", "GroupId", "MCS_label", "Priority", "Nice", "Account", "QOS", "WCKey", "JobState",
    "Reason", "Dependency", "Requeue", "Restarts", "BatchFlag", "Reboot", "ExitCode", "DerivedExitCode",
    "RunTime", "TimeLimit", "TimeMin", "SubmitTime", "EligibleTime", "AccrueTime", "StartTime", "EndTime",
    "Deadline", "PreemptEligibleTime", "PreemptTime", "SuspendTime", "SecsPreSuspend", "LastSchedEval",
    "Scheduler", "Partition", "AllocNode:Sid", "ReqNodeList", "ExcNodeList", "NodeList", "BatchHost",
    "NumNodes", "NumCPUs", "NumTasks", "CPUs/Task", "ReqB:S:C:T", "TRES", "Socks/Node", "NtasksPerN:B:S:C",
    "CoreSpec", "MinCPUsNode", "MinMemoryNode", "MinMemoryCPU", "MinTmpDiskNode", "Features",
    "ClusterFeatures", "Prefer", "DelayBoot", "Reservation", "OverSubscribe", "Contiguous", "Licenses",
    "Network", "Command", "WorkDir", "AdminComment", "Comment", "StdErr", "StdIn", "StdOut", "Power",
    "CpusPerTres", "MemPerTres", "TresBind", "TresFreq", "TresPerJob", "TresPerNode", "TresPerSocket",
    "TresPerTask", "NtasksPerTRES", "MailUser", "MailType", "Container",
)  # fmt: skip

_NULL = {"(null)", "None", "N/A", ""}


@dataclass(frozen=True)
class NodeInfo:
    """A node as ``scontrol show node`` reports it. ``state`` is the base state (``mixed``), ``flags`` the
    ``+FLAG`` parts (``drain``, ``not_responding``...), both lower case; ``reason`` is "" when none is set."""

    name: str
    state: str
    flags: tuple[str, ...]
    reason: str
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        """Drained or draining: no new jobs start there."""
        return "drain" in self.flags

    @property
    def state_text(self) -> str:
        """``mixed+drain``: the whole state, as one word."""
        return "+".join((self.state, *self.flags))


@dataclass(frozen=True)
class JobInfo:
    """A job as ``scontrol show job`` reports it. Node lists are hostlist expressions, "" when empty."""

    job_id: str
    state: str
    nodes: str
    reason: str
    restarts: int
    stdout_path: str
    stderr_path: str
    requeue: bool
    exc_nodes: str
    req_nodes: str = ""
    user: str = ""


class CommandRunner(Protocol):
    """What :class:`SlurmClient` needs from a transport (:class:`app.clients.ssh.SshRunner`)."""

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult: ...

    def run_all(
        self, argvs: Sequence[Sequence[str]], timeout: float | None = None
    ) -> list[CommandResult]: ...

    def close(self) -> None: ...


def parse_record(line: str, keys: Iterable[str]) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol -o`` line. A value ends where the next known key starts;
    the first occurrence of a key wins; trailing blanks are dropped."""
    pattern = _boundary_pattern(tuple(keys))
    matches = list(pattern.finditer(line))
    record: dict[str, str] = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following is not None else len(line)
        record.setdefault(match.group(1), line[match.end() : end].strip())
    return record


@cache
def _boundary_pattern(keys: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(key) for key in sorted(set(keys), key=len, reverse=True))
    return re.compile(rf"(?:^|(?<=\s))({alternatives})=")


def parse_node(text: str) -> NodeInfo:
    """The :class:`NodeInfo` of ``scontrol show node -o NAME`` output (its first line)."""
    record = parse_record(text.strip().splitlines()[0] if text.strip() else "", NODE_KEYS)
    if "NodeName" not in record or "State" not in record:
        raise ValueError(f"not a node record: {text[:200]!r}")
    base, *flags = record["State"].lower().split("+")
    return NodeInfo(
        name=record["NodeName"],
        state=base,
        flags=tuple(flags),
        reason=_value(record.get("Reason", "")),
        partitions=tuple(p for p in _value(record.get("Partitions", "")).split(",") if p),
    )


def parse_job(text: str) -> JobInfo:
    """The :class:`JobInfo` of ``scontrol show job -o ID`` output (its first line: one job)."""
    record = parse_record(text.strip().splitlines()[0] if text.strip() else "", JOB_KEYS)
    if "JobId" not in record or "JobState" not in record:
        raise ValueError(f"not a job record: {text[:200]!r}")
    restarts = record.get("Restarts", "0")
    return JobInfo(
        job_id=record["JobId"],
        state=record["JobState"],
        nodes=_value(record.get("NodeList", "")),
        reason=_value(record.get("Reason", "")),
        restarts=int(restarts) if restarts.isdigit() else 0,
        stdout_path=_value(record.get("StdOut", "")),
        stderr_path=_value(record.get("StdErr", "")),
        requeue=record.get("Requeue", "0") == "1",
        exc_nodes=_value(record.get("ExcNodeList", "")),
        req_nodes=_value(record.get("ReqNodeList", "")),
        user=record.get("UserId", ""),
    )


def parse_owner(job_id: str, result: CommandResult) -> tuple[int, int]:
    """The (uid, gid) of ``job_owner_command`` output; :class:`NotFound` when squeue did not report them."""
    match = re.fullmatch(r"\s*([0-9]+) ([0-9]+)\s*", result.stdout)
    if not match:
        raise NotFound(f"job {job_id}: squeue did not report its owner", output=tail(result.output))
    return int(match.group(1)), int(match.group(2))


def _value(text: str) -> str:
    return "" if text in _NULL else text


def _checked(value: str, pattern: str, what: str) -> str:
    """``value`` if it fully matches ``pattern``, else :class:`ParamError` (nothing is run)."""
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise ParamError("slurm", what, f"{value!r} does not match the pattern {pattern}")
    return value


def _checked_node(node: str) -> str:
    """One Slurm node name; ``ALL`` (any case) is refused: scontrol reads it as every node."""
    _checked(node, SLURM_NODE_NAME, "node")
    if node.lower() in SLURM_RESERVED:
        raise ParamError("slurm", "node", f"{node!r} is a reserved word of Slurm (it names every node)")
    return node


def _checked_path(path: str) -> str:
    """An absolute remote path without ``..`` components or control characters."""
    _checked(path, REMOTE_PATH, "path")
    if ".." in path.split("/"):
        raise ParamError("slurm", "path", f"{path!r} contains a '..' component")
    return path


# --- argv builders: pure, validating; the actions' plan() shows exactly these ---


# Every node and its NodeAddr, one line per node and partition (read-only).
NODE_ADDRESSES = ("sinfo", "--noheader", "--Node", "--format=%N %o")
TOPOLOGY = ("scontrol", "show", "topology")


def show_node_command(node: str) -> list[str]:
    return ["scontrol", "show", "node", "-o", _checked_node(node)]


def drain_command(node: str, reason: str) -> list[str]:
    node, reason = _checked_node(node), _checked(reason, SAFE_TEXT, "reason")
    if not reason.strip():
        raise ParamError("slurm", "reason", "Slurm needs a reason to drain a node")
    return ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]


def resume_command(node: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={_checked_node(node)}", "State=RESUME"]


def reboot_command(node: str, reason: str) -> list[str]:
    """Reboot the node as soon as its jobs are gone (``ASAP`` drains it meanwhile); it comes back DOWN with
    ``reason``, so nothing runs there until it is validated and resumed."""
    node, reason = _checked_node(node), _checked(reason, SAFE_TEXT, "reason")
    if not reason.strip():
        raise ParamError("slurm", "reason", "Slurm needs a reason to reboot a node to DOWN")
    return ["scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", node]


def show_partition_command(partition: str) -> list[str]:
    return ["scontrol", "show", "partition", "-o", _checked(partition, PARTITION, "partition")]


def show_job_command(job_id: str) -> list[str]:
    return ["scontrol", "show", "job", "-o", _checked(job_id, SLURM_JOB_ID, "job")]


def job_owner_command(job_id: str) -> list[str]:
    # %U and %G are numeric ids: fields the job owner cannot shape, unlike the text of `scontrol show job`.
    return [
        "squeue",
        "--noheader",
        "--states=all",
        f"--jobs={_checked(job_id, SLURM_JOB_ID, 'job')}",
        "--format=%U %G",
    ]


def node_jobs_command(node: str) -> list[str]:
    """The ids of the jobs running on ``node`` (``%i``: no user-controlled text)."""
    return ["squeue", "--noheader", "--states=RUNNING", f"--nodelist={_checked_node(node)}", "--format=%i"]


def requeue_command(job_id: str) -> list[str]:
    return ["scontrol", "requeue", _checked(job_id, SLURM_JOB_ID, "job")]


def cancel_command(job_id: str) -> list[str]:
    # --verbose: without it, scancel of an unknown job id exits 0 silently (22.05).
    return ["scancel", "--verbose", _checked(job_id, SLURM_JOB_ID, "job")]


CHECKPOINT_SIGNALS = ("USR1", "USR2")


def signal_command(job_id: str, signal: str) -> list[str]:
    """``scancel --signal``: ``USR1`` goes to every step's tasks (not the batch shell), ``B:USR1`` (sbatch
    --signal's notation) to the batch step only; the job runs on."""
    batch, _, name = signal.rpartition(":")
    if name not in CHECKPOINT_SIGNALS or batch not in ("", "B"):
        raise ParamError(
            "scancel", "signal", f"must be one of {', '.join(CHECKPOINT_SIGNALS)}, B: for the batch step"
        )
    target = ["--batch"] if batch else []
    return ["scancel", "--verbose", *target, f"--signal={name}", _checked(job_id, SLURM_JOB_ID, "job")]


def comment_command(job_id: str) -> list[str]:
    return ["squeue", "--noheader", f"--jobs={_checked(job_id, SLURM_JOB_ID, 'job')}", "--format=%k"]


def exclude_command(job_id: str, exc_nodes: str, req_nodes: str | None = None) -> list[str]:
    """``scontrol update`` setting ExcNodeList (and ReqNodeList when given; "" clears either)."""
    argv = ["scontrol", "update", f"JobId={_checked(job_id, SLURM_JOB_ID, 'job')}"]
    argv.append(f"ExcNodeList={_checked(exc_nodes, HOSTLIST, 'exclude') if exc_nodes else ''}")
    if req_nodes is not None:
        argv.append(f"ReqNodeList={_checked(req_nodes, HOSTLIST, 'required') if req_nodes else ''}")
    return argv


def hostnames_command(hostlist: str) -> list[str]:
    return ["scontrol", "show", "hostnames", _checked(hostlist, HOSTLIST, "hostlist")]


def tail_command(path: str, lines: int, run_as: tuple[int, int] | None = None) -> list[str]:
    """``tail -n N -- path``, under ``setpriv`` with the given (uid, gid) when ``run_as`` is set."""
    if isinstance(lines, bool) or not isinstance(lines, int) or not 1 <= lines <= MAX_TAIL_LINES:
        raise ParamError("slurm", "lines", f"expected 1..{MAX_TAIL_LINES}, got {lines!r}")
    argv = ["tail", "-n", str(lines), "--", _checked_path(path)]
    if run_as is None:
        return argv
    uid, gid = run_as
    return ["setpriv", f"--reuid={uid:d}", f"--regid={gid:d}", "--clear-groups", "--", *argv]


# The command forms that change Slurm state or read a job owner's file; a non-root account runs them through
# `sudo -n`, and deploy/slurm/sudoers allows exactly these forms (tests/integration/test_least_privilege.py).
_PRIVILEGED = {
    ("scontrol", "update"),
    ("scontrol", "requeue"),
    ("scontrol", "reboot"),
    ("scancel",),
    ("setpriv",),
}
_SUDO_REFUSED = re.compile(r"^sudo: (?:a password is required|.* is not allowed to execute)", re.MULTILINE)


def privileged(argv: Sequence[str]) -> bool:
    """Whether ``argv`` needs root (a state change, or a file read as its owner)."""
    return tuple(argv[:2]) in _PRIVILEGED or tuple(argv[:1]) in _PRIVILEGED


class SlurmClient:
    """Slurm administration through a :class:`CommandRunner`. Build with :meth:`from_settings`. With ``sudo``,
    the :func:`privileged` commands run as ``sudo -n -- <argv>``; a refusal by sudo is
    :class:`~app.domain.errors.CredentialRejected`."""

    def __init__(self, runner: CommandRunner, sudo: bool = False):
        self.runner = runner
        self.sudo = sudo

    @classmethod
    def from_settings(cls, settings: Settings) -> SlurmClient:
        from app.clients.ssh import SshRunner

        cfg = settings.slurm
        return cls(SshRunner.from_settings(settings), sudo=cfg.sudo and cfg.user != "root")

    def as_sent(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as it is sent: behind ``sudo -n --`` when it needs root and the account is not root."""
        return ["sudo", "-n", "--", *argv] if self.sudo and privileged(argv) else list(argv)

    def close(self) -> None:
        self.runner.close()

    def node_info(self, node: str) -> NodeInfo:
        return parse_node(self.run(show_node_command(node)).stdout)

    def drain(self, node: str, reason: str) -> CommandResult:
        return self.run(drain_command(node, reason))

    def resume(self, node: str) -> CommandResult:
        return self.run(resume_command(node))

    def reboot(self, node: str, reason: str) -> CommandResult:
        return self.run(reboot_command(node, reason))

    def partition_nodes(self, partition: str) -> list[str]:
        """The node names of a partition (its ``Nodes=`` hostlist, expanded; values there hold no blanks)."""
        found = re.search(r"(?:^|\s)Nodes=(\S+)", self.run(show_partition_command(partition)).stdout)
        hostlist = _value(found.group(1)) if found else ""
        return self.expand_hostlist(hostlist) if hostlist else []

    def job_info(self, job_id: str) -> JobInfo:
        return parse_job(self.run(show_job_command(job_id)).stdout)

    def node_jobs(self, node: str) -> list[str]:
        """The ids of the jobs running on ``node`` (the scheduler's view, whatever the GPUs' job labels say)."""
        return [j for j in self.run(node_jobs_command(node)).stdout.split() if re.fullmatch(SLURM_JOB_ID, j)]

    def requeue(self, job_id: str) -> CommandResult:
        return self.run(requeue_command(job_id))

    def cancel(self, job_id: str) -> CommandResult:
        result = self.run(cancel_command(job_id))
        if "Invalid job id specified" in result.stderr:
            raise NotFound(f"job {job_id}: Invalid job id specified", output=tail(result.output))
        return result

    def job_comment(self, job_id: str) -> str:
        """The job's comment (``squeue --format=%k``; "" when it has none); NotFound for a job squeue does not list."""
        result = self.checked(self.run(comment_command(job_id)))
        if not result.stdout.strip():
            raise NotFound(f"job {job_id}: not in the queue", output=tail(result.output))
        comment = result.stdout.strip().splitlines()[0]
        return "" if comment == "(null)" else comment

    def signal(self, job_id: str, signal: str) -> CommandResult:
        """Send ``signal`` to the job's running steps (``scancel --signal``); NotFound for an unknown job."""
        result = self.run(signal_command(job_id, signal))
        if "Invalid job id specified" in result.stderr:
            raise NotFound(f"job {job_id}: Invalid job id specified", output=tail(result.output))
        return result

    def update_job_exclude(self, job_id: str, nodes: str, required_nodes: str | None = None) -> CommandResult:
        """Set the job's ExcNodeList to the hostlist ``nodes`` (and its ReqNodeList when given).
        Slurm 22.05 only accepts this while the job is pending or completing, not while it runs."""
        return self.run(exclude_command(job_id, nodes, required_nodes))

    def topology(self, *, switches: bool) -> tuple[str, dict[str, str]]:
        """The fleet's nodes with their NodeAddr (``sinfo``) and, when ``switches``, ``scontrol show topology``'s
        text ("" without a topology plugin), in one round trip (read-only)."""
        argvs = [NODE_ADDRESSES, *([TOPOLOGY] if switches else [])]
        results = [self.checked(result) for result in self.run_all([list(argv) for argv in argvs])]
        nodes = parse_node_addresses(results[0].stdout)
        text = results[1].stdout if switches else ""
        # Without a topology plugin scontrol says so in words ("No topology information available"): no lines.
        return "\n".join(line for line in text.splitlines() if "=" in line), nodes

    def expand_hostlist(self, hostlist: str) -> list[str]:
        """The node names of a hostlist expression (``node[1-3]`` → node1, node2, node3), expanded here
        (:mod:`app.domain.hostlist`, no round trip); one that parser refuses goes to ``scontrol show hostnames``."""
        command = hostnames_command(hostlist)  # validates the expression first
        try:
            return expand_hostlist(hostlist)
        except HostlistError:
            return self.run(command).stdout.split()

    def run(self, argv: list[str]) -> CommandResult:
        """Run ``argv`` on the Slurm host; a non-zero exit raises :class:`CommandFailed` or :class:`NotFound`."""
        return self.checked(self.runner.run(self.as_sent(argv)))

    def run_all(self, argvs: Sequence[list[str]]) -> list[CommandResult]:
        """Run independent commands at once (one round trip, :meth:`SshRunner.run_all`); the results unchecked,
        in order: pass each to :meth:`checked` (a failure of one does not hide the others' results)."""
        return self.runner.run_all([self.as_sent(argv) for argv in argvs])

    @staticmethod
    def checked(result: CommandResult) -> CommandResult:
        """``result`` if it exited 0, else :class:`NotFound` (Slurm's unknown job/node messages),
        :class:`CredentialRejected` (sudo refused: deploy/slurm/sudoers is missing or older than the command) or
        :class:`CommandFailed`."""
        if result.exit_code == 0:
            return result
        argv = list(result.argv)
        text = result.stderr.strip() or result.stdout.strip()
        output = tail(result.output)
        if _SUDO_REFUSED.search(text):
            raise CredentialRejected(
                f"{shlex.join(argv)}: sudo refused ({tail(text, 300)}); install deploy/slurm/sudoers for the "
                "account (docs/slurm.md)",
                output=output,
            )
        if "Invalid job id specified" in text:
            raise NotFound(f"{shlex.join(argv)}: {text}", output=output)
        if "Invalid node name specified" in text or re.search(r"^Node \S+ not found", text, re.MULTILINE):
            raise NotFound(f"{shlex.join(argv)}: {text}", output=output)
        raise CommandFailed(
            f"`{shlex.join(argv)}` exited {result.exit_code}: {tail(text, 500)}",
            exit_code=result.exit_code,
            output=output,
        )
