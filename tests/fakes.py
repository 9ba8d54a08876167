"""Hand-written fakes at our own seams (clock, actions, Prometheus) for unit tests of the engine."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from app.actions.base import Action, ActionContext, Plan
from app.domain.errors import Unavailable
from app.domain.outcome import Ok, Outcome
from app.domain.params import NODE_NAME, SAFE_TEXT, SLURM_JOB_ID, Param

START = datetime(2026, 12, 2, 3, 0, 0, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when told to; ``sleep`` advances it, and ``wait`` returns once it has been advanced
    far enough (or its event is set)."""

    STOP_POLL_S = (
        0.05  # how often a wait looks at its event, which does not wake it (real time, never the clock's)
    )

    def __init__(self, start: datetime = START):
        self._now = start
        self._moved = threading.Condition()

    def now(self) -> datetime:
        with self._moved:
            return self._now

    def advance(self, seconds: float = 0, **delta: float) -> None:
        with self._moved:
            self._now += timedelta(seconds=seconds, **delta)
            self._moved.notify_all()

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        with self._moved:
            until = self._now + timedelta(seconds=seconds)
            while not stop.is_set() and self._now < until:
                self._moved.wait(self.STOP_POLL_S)
        return stop.is_set()


@dataclass
class Script:
    """What a fake action returns, call by call (the last one repeats)."""

    outcomes: list[Outcome] = field(default_factory=lambda: [Ok(output="done")])
    calls: list[dict[str, Any]] = field(default_factory=list)

    def next(self, params: Mapping[str, Any]) -> Outcome:
        self.calls.append(dict(params))
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]


class FakeAction(Action):
    """A configurable action whose runs are recorded in ``script.calls``."""

    def __init__(
        self,
        name: str,
        *,
        read_only: bool = False,
        return_to_service: bool = False,
        takes_out: bool = False,
        params: Mapping[str, Param] | None = None,
        script: Script | None = None,
    ):
        self.name = name  # type: ignore[misc]
        self.read_only = read_only  # type: ignore[misc]
        self.return_to_service = return_to_service  # type: ignore[misc]
        self.takes_out = takes_out  # type: ignore[misc]
        self.params = params or {"node": Param(pattern=NODE_NAME, required=False)}  # type: ignore[misc]
        self.script = script or Script()

    def plan(self, params: Mapping[str, Any]) -> Plan:
        return Plan(
            summary=f"{self.name} {dict(params)}",
            command=f"{self.name} " + " ".join(f"{k}={v}" for k, v in sorted(params.items())),
        )

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        return self.script.next(params)


def fake_actions() -> dict[str, FakeAction]:
    """The actions the engine tests' playbooks use, with Slurm-like parameter schemas."""
    node = Param(pattern=NODE_NAME)
    return {
        "fake.drain": FakeAction(
            "fake.drain",
            takes_out=True,
            params={"node": node, "reason": Param(pattern=SAFE_TEXT, required=False)},
        ),
        "fake.requeue": FakeAction("fake.requeue", params={"job": Param(pattern=SLURM_JOB_ID)}),
        "fake.resume": FakeAction("fake.resume", return_to_service=True, params={"node": node}),
        "fake.logs": FakeAction(
            "fake.logs",
            read_only=True,
            params={"job": Param(pattern=SLURM_JOB_ID)},
            script=Script(
                [
                    Ok(
                        output="log",
                        data={"log": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."},
                    )
                ]
            ),
        ),
        "fake.notice": FakeAction("fake.notice", read_only=True, params={"text": Param(max_length=4000)}),
    }


class FakeHttpPoster:
    """The notification webhook at Nightshift's HTTP seam (``Clients.http``): every body posted, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def post_json(self, url: str, body: dict[str, Any], headers: Any = None) -> int:
        self.bodies.append(body)
        return 200


@dataclass
class FakeSample:
    labels: dict[str, str]
    value: float
    timestamp: float = 0.0


class FakePrometheus:
    """Answers queries from a dict expr → list of samples; records every query; can be made unreachable."""

    name: ClassVar[str] = "prometheus"

    def __init__(self) -> None:
        self.answers: dict[str, list[FakeSample]] = {}
        # Answers that depend on the evaluation time (``at``, None: the server's now), as a series over time is.
        self.over_time: dict[str, Callable[[datetime | None], list[FakeSample]]] = {}
        self.default: list[FakeSample] = []
        self.down = False
        self.queries: list[str] = []

    def query(self, expr: str, at: datetime | None = None) -> list[FakeSample]:
        """The answer keyed by ``expr``, or by ``expr`` with other range durations: the engine shortens the ranges
        of a verification query to the time since its action (app/domain/promql_window.py)."""
        self.queries.append(expr)
        if self.down:
            raise Unavailable("prometheus: connection refused")
        if expr in self.over_time:
            return self.over_time[expr](at)
        if expr in self.answers:
            return list(self.answers[expr])
        ranges = {_any_range(key): answer for key, answer in self.answers.items()}
        return list(ranges.get(_any_range(expr), self.default))

    def ready(self) -> bool:
        return not self.down


def _any_range(expr: str) -> str:
    return re.sub(r"\[[0-9smhdwy]+(:[0-9smhdwy]*)?\]", "[*]", expr)


@dataclass
class FakeSlurmNode:
    state: str = "idle"
    flags: set[str] = field(default_factory=set)
    reason: str = ""
    partition: str = "gpu"
    reboots: int = 0
    reboot_polls: int = 0  # `show node` looks left until a requested reboot is done (-1: never comes back)


class FakeSlurmHost:
    """A Slurm login host at our CommandRunner seam: the scontrol commands the node actions send, on a few nodes.

    ``scontrol reboot ASAP nextstate=DOWN`` drains the node and flags it; after ``reboot_polls`` looks it comes back
    DOWN with the reason. Every argv is recorded in ``commands``."""

    def __init__(self, *names: str, reboot_polls: int = 1, topology: str = ""):
        self.nodes = {name: FakeSlurmNode(reboot_polls=reboot_polls) for name in names}
        self.reboot_polls = reboot_polls
        self.commands: list[tuple[str, ...]] = []
        self.topology = topology  # what `scontrol show topology` prints
        self.down = False  # the host unreachable: every command fails as SSH does

    def run_all(self, argvs: Any, timeout: float | None = None) -> list[Any]:
        return [self.run(argv, timeout) for argv in argvs]

    def run(self, argv: Any, timeout: float | None = None) -> Any:
        from app.clients.ssh import CommandResult

        argv = tuple(argv)
        self.commands.append(argv)
        if self.down:
            raise Unavailable("ssh slurm-login: connection refused")
        out, code = self._answer(argv)
        return CommandResult(
            argv, " ".join(argv), code, out if code == 0 else "", "" if code == 0 else out, 0.01
        )

    def close(self) -> None:
        pass

    def changes(self, node: str) -> list[tuple[str, ...]]:
        """The commands that changed ``node`` (update, reboot), in order."""
        return [
            c
            for c in self.commands
            if c[1] in ("update", "reboot") and (f"NodeName={node}" in c or c[-1] == node)
        ]

    def _answer(self, argv: tuple[str, ...]) -> tuple[str, int]:
        match argv:
            case ("scontrol", "show", "node", "-o", name):
                return self._show(name)
            case ("scontrol", "show", "partition", "-o", part):
                names = ",".join(n for n, node in self.nodes.items() if node.partition == part)
                return f"PartitionName={part} AllocNodes=ALL Nodes={names} State=UP\n", 0
            case ("scontrol", "show", "hostnames", hostlist):
                return "\n".join(hostlist.split(",")) + "\n", 0
            case ("scontrol", "show", "topology"):
                return self.topology or "No topology information available\n", 0
            case ("sinfo", "--noheader", "--Node", "--format=%N %o"):
                return "".join(f"{name} 10.1.0.{i}\n" for i, name in enumerate(self.nodes, start=1)), 0
            case ("scontrol", "update", node_arg, "State=DRAIN", reason):
                node = self.nodes[node_arg.removeprefix("NodeName=")]
                node.flags.add("drain")
                node.reason = reason.removeprefix("Reason=")
                return "", 0
            case ("scontrol", "update", node_arg, "State=RESUME"):
                node = self.nodes[node_arg.removeprefix("NodeName=")]
                node.flags.discard("drain")
                node.state = "idle" if node.state == "down" else node.state
                node.reason = ""
                return "", 0
            case ("scontrol", "reboot", "ASAP", "nextstate=DOWN", reason, name):
                node = self.nodes[name]
                node.flags.update({"drain", "reboot_requested"})
                node.reason = reason.removeprefix("reason=")
                node.reboot_polls = self.reboot_polls
                return "", 0
        return f"unexpected command {argv}", 1

    def _show(self, name: str) -> tuple[str, int]:
        node = self.nodes.get(name)
        if node is None:
            return f"Node {name} not found", 1
        if "reboot_requested" in node.flags:
            if node.reboot_polls == 0:
                node.flags -= {"reboot_requested", "drain"}
                node.state, node.reboots = "down", node.reboots + 1
            elif node.reboot_polls > 0:
                node.reboot_polls -= 1
        state = "+".join([node.state.upper(), *sorted(f.upper() for f in node.flags)])
        reason = f" Reason={node.reason} [root@2026-12-02T03:00:00]" if node.reason else ""
        return f"NodeName={name} Arch=x86_64 State={state} Partitions={node.partition}{reason}\n", 0


class FakeNodeShell:
    """A node's shell at our CommandRunner seam, for background checks (app/clients/node_check.py): a started check
    ends at once with the next exit code (the last repeats); None plays one that never ends, ``clock`` telling how
    long it has run. ``started`` holds every start script, ``stopped`` counts the clean-ups."""

    def __init__(self, *exit_codes: int | None, output: str = "Diagnostic Result: Pass\n", clock: Any = None):
        self.exit_codes = list(exit_codes) or [0]
        self.output = output
        self.clock = clock
        self.started: list[str] = []
        self.stopped = 0
        self._checks: dict[str, tuple[int | None, Any]] = {}

    def run(self, argv: Any, timeout: float | None = None) -> Any:
        from app.clients.ssh import CommandResult

        script = argv[-1]
        found = re.match(r"(?:set -e; )?d=(\S+);", script)
        assert found, script
        workdir, now = found.group(1), self.clock.now() if self.clock else None
        if script.endswith("echo started"):
            code = self.exit_codes.pop(0) if len(self.exit_codes) > 1 else self.exit_codes[0]
            self.started.append(script)
            self._checks[workdir] = (code, now)
            out = "started\n"
        elif script.endswith("echo stopped"):
            self._checks.pop(workdir, None)
            self.stopped += 1
            out = "stopped\n"
        elif workdir not in self._checks:
            out = "absent\n"
        else:
            code, at = self._checks[workdir]
            elapsed = int((now - at).total_seconds()) if now is not None else 0
            out = (
                f"running {elapsed}\n"
                if code is None
                else f"done {elapsed} {code}\n" + (self.output if code == 0 else "Fail\n")
            )
        return CommandResult(tuple(argv), " ".join(argv), 0, out, "", 0.01)

    def close(self) -> None:
        pass


def node_repair_playbook(name: str, scheduler: str, node_repair: str) -> str:
    """A node-scoped playbook for repair tests: its ``node_repair:`` section is ``node_repair`` (YAML flow style)."""
    read = (
        'slurm.job_info, with: {job: "1"}'
        if scheduler == "slurm"
        else "kubernetes.pod_logs, with: {namespace: default, pod: p}"
    )
    return (
        f"apiVersion: nightshift/v1\nkind: Playbook\nmetadata: {{name: {name}}}\n"
        "match: ['alertname=\"GpuXidError\"']\n"
        f'target: {{scheduler: {scheduler}, node: "{{{{ labels.Hostname }}}}"}}\n'
        f"steps: [{{action: {read}}}]\nnode_repair: {node_repair}\n"
    )


class FakeSlurm:
    """What the engine asks Slurm about a job (``job_info``, ``expand_hostlist``), from ``jobs``: id → (state,
    comma-separated nodes). An unknown job raises NotFound, as ``scontrol show job`` does. A checkpoint request
    (``job_comment``, ``signal``) reads ``comments`` and records the signals sent in ``signals``."""

    name: ClassVar[str] = "slurm"

    def __init__(
        self,
        jobs: Mapping[str, tuple[str, str]] | None = None,
        default: tuple[str, str] | None = None,
        comments: Mapping[str, str] | None = None,
        node_states: Mapping[str, str] | None = None,
    ) -> None:
        """``default``: what any other job is (None: an unknown job is not found). ``node_states``: what
        ``scontrol show node`` says of these nodes (``idle``, ``idle+drain``; any other is not found)."""
        self.jobs: dict[str, tuple[str, str]] = dict(jobs or {})
        self.node_states = dict(node_states or {})
        self.default = default
        self.lookups = 0
        self.comments = dict(comments or {})
        self.signals: list[tuple[str, str]] = []

    def job_comment(self, job_id: str) -> str:
        self.job_info(job_id)  # NotFound for an unknown job
        return self.comments.get(job_id, "")

    def signal(self, job_id: str, signal: str) -> Any:
        from app.clients.slurm import signal_command
        from app.clients.ssh import CommandResult

        argv = signal_command(job_id, signal)
        self.signals.append((job_id, signal))
        return CommandResult(tuple(argv), " ".join(argv), 0, "", "", 0.01)

    def job_info(self, job_id: str) -> Any:
        from app.clients.slurm import JobInfo
        from app.domain.errors import NotFound

        self.lookups += 1
        if job_id not in self.jobs and self.default is None:
            raise NotFound(f"scontrol show job {job_id}: Invalid job id specified")
        state, nodes = self.jobs.get(job_id) or self.default or ("", "")
        return JobInfo(job_id, state, nodes, "None", 0, "", "", True, "")

    def expand_hostlist(self, hostlist: str) -> list[str]:
        return [node for node in hostlist.split(",") if node]

    def node_info(self, node: str) -> Any:
        """Only the ``node_states`` nodes are known (no partition: the blast radius's share of a partition is
        unknown, its absolute limit applies)."""
        from app.clients.slurm import NodeInfo
        from app.domain.errors import NotFound

        if node in self.node_states:
            state, *flags = self.node_states[node].split("+")
            return NodeInfo(node, state, tuple(flags), "")
        raise NotFound(f"scontrol show node {node}: Node {node} not found")
