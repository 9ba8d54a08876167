"""``make demo``: the whole loop on a simulated GPU cluster, narrated one line per stage.

``python -m sim.demo [--keep]`` starts, under a fresh ``var/demo/`` and on loopback with free ports, a real Slurm
(munged, slurmctld, slurmd node1..node4, sshd) and :func:`sim.stack.launch_stack` around it (simulated DCGM
exporters, Prometheus with the fast rules, Alertmanager, a Grafana stand-in, ``nightshift serve`` acting on Slurm
over SSH with the Slurm actions whitelisted). It submits a two-node training job to node1 + node2 as a real batch
job: by default (``--trainer torch``) a real ``torch.distributed`` DDP job (sbatch → srun → torchrun c10d →
:mod:`sim.torch_trainer`, gloo on CPU, DCP checkpoints); ``--trainer sim`` the simulated one
(:mod:`sim.trainer`).
Then it plays one failure of it: Xid 79 on node2 GPU 3 and the rank there dies (SIGKILL: the real job's other rank
fails in its all-reduce; the simulated job's ranks log NCCL's errors), node2's exporter reports the Xid (several
alerts) → one job incident naming node2 its culprit → one requeue excluding node2 → the job runs on two other
nodes from its checkpoint →
progress verified → the Grafana annotation region; and node2 apart from the job: drained, validated with
``dcgmi diag -r 2`` (the simulator's look-alike, failing while the Xid is there) → held for a person.

Then it prints where to look. Without ``--keep`` it stops every process by PID and exits 0; with ``--keep`` it
stays up until Ctrl-C. A stage that does not happen in time ends the demo with exit status 1, naming the stage
and showing the tail of the daemon log that explains it.

The playbooks are copies of playbooks/ with 10 s recheck/verify windows (:func:`sim.stack.fast_playbooks`), to
match the fast rules; the output says so. The shipped files are never edited.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

import requests

from sim import faults
from sim.cluster import REPO_ROOT
from sim.procs import wait_until
from sim.stack import (
    FAST_VERIFY_INTERVAL,
    FAST_WINDOW,
    MissingBinary,
    SlurmCluster,
    Stack,
    launch_slurm,
    launch_stack,
)

DEMO_DIR = REPO_ROOT / "var" / "demo"
MARKER = ".nightshift-demo"
JOB_NAME = "llama-70b"
JOB_NODES = ("node1", "node2")
CULPRIT = "node2"
TRAINERS = ("torch", "sim")  # the real torch.distributed job (sim.torch_trainer), or the simulated one
# Seconds for the job to start training: the real one imports torch in four processes (torchrun and a worker per
# node), ~15 s each on a loaded two-core machine.
START_TIMEOUT = {"torch": 240.0, "sim": 60.0}
XID, XID_GPU = 79, 3
# Repair states after which the demo's node stays as it is until a person acts (held) or it is in service.
REPAIR_END = ("held", "returned", "advisory", "not_ours")
# Step statuses after which a step will not change again by itself.
FINISHED_STEPS = ("ok", "would_run", "skipped", "invalid", "failed", "ambiguous", "credential_error")

ACCESS_LOG = re.compile(r'^\S+ - \S+ \[[^\]]+\] "[A-Z]+ ')  # gunicorn's default access log format
T = TypeVar("T")


class StageFailed(Exception):
    """A stage did not happen (in time); ``log`` is the name and tail of the daemon log that tells why."""

    def __init__(self, message: str, log: tuple[str, Callable[[], str]] | None = None):
        super().__init__(message)
        self.log = (log[0], log[1]()) if log else None


class Narrator:
    """One line per stage, prefixed with the seconds since the demo started."""

    def __init__(
        self,
        out: TextIO = sys.stdout,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.out = out
        self.clock = clock
        self.start = clock()
        self.wall_start = wall()  # the same moment on the wall clock: ledger times are wall times

    def say(self, message: str) -> None:
        print(f"[{self.clock() - self.start:6.1f}s] {message}", file=self.out, flush=True)

    def section(self, title: str) -> None:
        print(f"\n== {title}", file=self.out, flush=True)

    def at(self, moment: datetime, message: str) -> None:
        """A line for something that happened at ``moment`` (told later, in order with the rest)."""
        print(f"[{(moment - self.wall_start).total_seconds():6.1f}s] {message}", file=self.out, flush=True)


@dataclass(frozen=True, order=True)
class Event:
    """Something that happened, when: an alert seen firing, a ledger row, the job seen running again."""

    at: datetime
    message: str


def observed(events: list[Event]) -> Callable[[str], None]:
    """Record a message as happening now (what the demo sees by polling Prometheus and Slurm)."""
    return lambda message: events.append(Event(datetime.now(UTC), message))


# Ledger rows the timeline leaves out: the alerts' own receipts (told as Prometheus fired them) and each guard
# that let the incident pass (the decisive verdicts, stops included, are told).
QUIET_LEDGER = {"alert_received"}


def ledger_events(ledger: Sequence[dict[str, Any]], incident: int) -> list[Event]:
    """The ledger rows of a job incident (its node repair's included: they carry the incident's id) as events at
    their own time, each one line: what Nightshift decided and did, in the order it did it."""
    events = []
    for row in ledger:
        if row["kind"] in QUIET_LEDGER or (row["kind"] == "guard" and row["data"].get("decision") == "pass"):
            continue
        message = " ".join(str(row["message"]).split())
        command = " ; ".join(
            _remote(line) for line in str(row["data"].get("command") or "").splitlines() if line
        )
        if command and command not in message:
            message += f" ({command})"
        subject = "" if message.startswith("node ") else f"incident #{incident} "
        events.append(Event(datetime.fromisoformat(row["ts"]), f"{subject}{row['kind']}: {_cut(message)}"))
    return events


def _cut(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@contextlib.contextmanager
def explained_by(log: tuple[str, Callable[[], str]]) -> Iterator[None]:
    """Turn a wait that timed out (AssertionError from ``wait_until``) into StageFailed with ``log``'s tail."""
    try:
        yield
    except AssertionError as exc:
        raise StageFailed(str(exc), log) from None


def wait_for(
    what: str, check: Callable[[], T | None], timeout: float, log: tuple[str, Callable[[], str]]
) -> T:
    """Poll ``check`` until it returns something truthy; StageFailed with the tail of ``log`` after ``timeout``."""
    with explained_by(log):
        return wait_until(check, timeout, what, interval=0.25)  # type: ignore[return-value]


def _logs(stack: Stack) -> dict[str, tuple[str, Callable[[], str]]]:
    """The daemon logs that explain each kind of stage, by kind."""
    return {
        "prometheus": ("prometheus", stack.prometheus.log_tail),
        "nightshift": (
            "nightshift (access log left out)",
            lambda: _without_access_log(stack.nightshift.daemon.log_path),
        ),
        "slurm": ("slurm daemons", stack.slurm.log_tails),
        "grafana": ("grafana stand-in", stack.grafana.log_tail),
        "alertmanager": ("alertmanager", stack.alertmanager.log_tail),
    }


def _without_access_log(path: Path, lines: int = 40) -> str:
    """The last ``lines`` of a gunicorn log that are not access log entries (the demo's own polling)."""
    kept = [line for line in path.read_text(errors="replace").splitlines() if not ACCESS_LOG.match(line)]
    return "\n".join(kept[-lines:])


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S")


def _labels(labels: dict[str, str], keys: Sequence[str]) -> str:
    return ", ".join(f"{key}={labels[key]}" for key in keys if key in labels)


def _remote(command: str) -> str:
    """The command as the Slurm host runs it, without the login-shell wrapper (``bash -lc '...'``)."""
    try:
        argv = shlex.split(command)
    except ValueError:  # a description, not a shell line
        return command
    return argv[2] if argv[:2] == ["bash", "-lc"] and len(argv) == 3 else command


def _relative(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


# --- stages ------------------------------------------------------------------------------------------------------


def submit_job(stack: Stack, say: Narrator, trainer: str) -> str:
    """Submit the two-node training job and wait until both ranks train and have checkpointed."""
    if trainer == "torch":
        job = stack.submit_torch(JOB_NAME, JOB_NODES)
        launch = "srun node.sh → torchrun --nnodes 2 --rdzv-backend c10d -m sim.torch_trainer (DDP, gloo)"
        saved = f"DCP checkpoints every 10 steps into checkpoints/{JOB_NAME}/step-<N>"
    else:
        job = stack.submit_trainer(JOB_NAME, JOB_NODES)
        launch = "--wrap 'srun python -m sim.trainer'"
        saved = f"checkpoints every 25 steps into checkpoints/{JOB_NAME}/rank0 and rank1"
    nodes = ",".join(JOB_NODES)
    say.say(f"training job {job} ({JOB_NAME}) submitted: sbatch --requeue --nodes=2 -w {nodes}: {launch}")
    with explained_by(_logs(stack)["slurm"]):
        step = stack.wait_training(job, JOB_NODES, timeout=START_TIMEOUT[trainer])
    say.say(f"job {job} RUNNING on {' + '.join(JOB_NODES)}, training: step {step}")
    query = f'min(training_last_checkpoint_timestamp_seconds{{slurm_job_id="{job}"}}) > 0'
    wait_for(
        f"a checkpoint on both ranks of job {job}",
        lambda: stack.prometheus.query(query),
        60,
        _logs(stack)["prometheus"],
    )
    say.say(f"both ranks checkpointed ({saved})")
    return job


def alerts_firing(stack: Stack, say: Callable[[str], None], expected: set[tuple[str, str]]) -> int:
    """Tell each alert when Prometheus is seen firing it, until every (alertname, Hostname) of ``expected`` has;
    how many distinct alerts fired."""
    told: set[tuple[str, ...]] = set()
    keys = ("Hostname", "gpu", "xid", "xid_class", "error_class", "slurm_job_id")

    def all_fired() -> bool:
        for alert in stack.prometheus.alerts():
            labels = alert["labels"]
            key = tuple(labels.get(k, "") for k in ("alertname", *keys))
            if key not in told:
                told.add(key)
                say(f"alert firing in Prometheus: {labels['alertname']}{{{_labels(labels, keys)}}}")
        return expected <= {(key[0], key[1]) for key in told}

    wait_for(
        ", ".join(f"{name} on {node}" for name, node in sorted(expected)),
        all_fired,
        60,
        _logs(stack)["prometheus"],
    )
    return len(told)


def job_incident(
    stack: Stack, say: Callable[[str], None], job: str, restart_timeout: float
) -> dict[str, Any]:
    """Wait for the job's one incident to recover the job and close, telling (``say``) when the job is seen
    running again; the incident once closed. What Nightshift did is in its ledger (:func:`ledger_events`)."""
    logs = _logs(stack)
    nightshift = stack.nightshift

    def opened() -> dict[str, Any] | None:
        return next((i for i in nightshift.incidents(job=job) if i.get("kind") == "job"), None)

    number = wait_for(f"the incident of job {job}", opened, 60, logs["nightshift"])["id"]

    def acted() -> dict[str, Any] | None:
        detail = nightshift.incident(number)
        steps = [s for s in detail["steps"] if s["phase"] == "steps"]
        done = steps and all(s["status"] in FINISHED_STEPS for s in steps)
        return detail if done or detail["incident"]["outcome"] else None

    detail = wait_for(f"the recovery of incident #{number}", acted, 90, logs["nightshift"])
    steps = [s for s in detail["steps"] if s["phase"] == "steps"]
    if not steps or any(s["status"] != "ok" for s in steps):
        row = detail["incident"]
        raise StageFailed(
            f"incident #{number}: no recovery ran ({row['state']}: {row['reason']})", logs["nightshift"]
        )

    with explained_by(logs["slurm"]):
        nodes = stack.wait_running(job, avoid=[CULPRIT])
    wait_for(f"job {job} resumed", lambda: stack.resumes(job), restart_timeout, logs["slurm"])
    say(
        f"job {job} RUNNING on {' + '.join(nodes)}, both ranks resumed from checkpoint step {stack.resumes(job)[-1]}"
    )

    def closed() -> dict[str, Any] | None:
        detail = nightshift.incident(number)
        return detail if detail["incident"]["outcome"] else None

    detail = wait_for(f"incident #{number} to close", closed, 90, logs["nightshift"])
    row = detail["incident"]
    if row["outcome"] != "recovered":
        raise StageFailed(f"incident #{number} ended {row['outcome']}: {row['reason']}", logs["nightshift"])
    return detail


def node_repair(stack: Stack, node: str) -> dict[str, Any]:
    """Wait for ``node``'s repair to be held or back in service; its repair row."""

    def settled() -> dict[str, Any] | None:
        try:
            current = stack.nightshift.get(f"/api/v1/nodes/{node}")["current"]
        except requests.HTTPError:  # 404 until a repair of the node exists
            return None
        return current if current["state"] in REPAIR_END else None

    return wait_for(f"{node}'s repair to settle", settled, 120, _logs(stack)["nightshift"])


def tell_repair(stack: Stack, say: Narrator, node: str, current: dict[str, Any]) -> None:
    """Where ``node``'s repair ended, and what its validation found."""
    for step in current["steps"] or []:
        finding = next((line for line in (step["output"] or "").splitlines() if "Warning:" in line), "")
        if finding or step["exit_code"] not in (None, 0):
            say.say(
                f"{node} repair step {step['name']} found: exit {step['exit_code']}"
                + (f", {' '.join(finding.strip('| ').split())}" if finding else "")
            )
    if current["state"] == "held":
        say.say(
            f"{node} held for a person, still drained ({stack.slurm.node_reason(node)}): {current['held_reason']}"
        )
    else:
        say.say(f"{node} {current['state']}: {stack.slurm.node_state(node)}")


def episode(stack: Stack, say: Narrator, job: str, trainer: str) -> None:
    say.section(
        f"Xid {XID} (GPU fell off the bus) on {CULPRIT} GPU {XID_GPU}, under a job on {' + '.join(JOB_NODES)}"
    )
    stack.inject_xid(CULPRIT, XID, XID_GPU)
    if trainer == "torch":
        # The rank on the faulty node dies with its GPU; its peer's all-reduce fails (gloo: connection reset).
        pid = faults.signal_rank(stack.sim.state_dir, JOB_NAME, signal.SIGKILL, node=CULPRIT)
        say.say(f"fault injected: Xid {XID} on {CULPRIT} GPU {XID_GPU}, its rank (pid {pid}) killed with it")
        expected = {("GpuXidError", CULPRIT), ("TrainingJobError", JOB_NODES[0])}
    else:
        say.say(f"fault injected: Xid {XID} on {CULPRIT} GPU {XID_GPU}")
        expected = {("GpuXidError", CULPRIT), *(("TrainingJobError", node) for node in JOB_NODES)}
    say.say(
        "watching Prometheus, Slurm and Nightshift; what happened is told below in the order it happened "
        "(Nightshift's part from its ledger)"
    )
    events: list[Event] = []
    fired = alerts_firing(stack, observed(events), expected)
    detail = job_incident(stack, observed(events), job, START_TIMEOUT[trainer])
    repair = node_repair(stack, CULPRIT)
    number = detail["incident"]["id"]
    events += ledger_events(stack.nightshift.incident(number)["ledger"], number)
    for event in sorted(events):
        say.at(event.at, event.message)
    tell_repair(stack, say, CULPRIT, repair)
    others = [i for i in stack.nightshift.incidents() if i["id"] != number]
    for other in others:  # what else the episode's alerts opened, said as it is
        say.say(
            f"also incident #{other['id']} ({other.get('kind')}, {other['playbook']}, node {other['node']}): "
            f"{other['state']}, {other['reason']}"
        )
    requeues = sum(1 for s in detail["steps"] if s["action"] == "slurm.requeue_job" and s["status"] == "ok")
    say.say(
        f"one failure: {fired} alerts from {len(JOB_NODES)} ranks and {CULPRIT}'s exporter → one job incident "
        f"(+{len(others)} other), {requeues} requeue, the job running again; {CULPRIT} {repair['state']}"
    )

    def region() -> dict[str, Any] | None:
        return next(iter(stack.grafana.annotations("nightshift", f"job:{job}", "outcome:recovered")), None)

    annotation = wait_for(f"the Grafana region of incident #{number}", region, 30, _logs(stack)["grafana"])
    seconds = (annotation["timeEnd"] - annotation["time"]) / 1000
    say.say(
        f"Grafana annotation {annotation['id']}: region {_clock(annotation['time'])} → "
        f"{_clock(annotation['timeEnd'])} UTC ({seconds:.1f} s), tags {', '.join(annotation['tags'])}"
    )
    people_heard(stack, say, number)


def people_heard(stack: Stack, say: Narrator, number: int) -> None:
    """What reached people, in the local sink: Alertmanager's chat message and Nightshift's notification."""

    def received(path: str, match: Callable[[Any], bool]) -> Any:
        return next((r.body for r in stack.notices.received if r.path == path and match(r.body)), None)

    chat = wait_for(
        "Alertmanager's message to the people channel",
        lambda: received("/people", lambda body: "GpuXidError" in body["attachments"][0]["title"]),
        30,
        _logs(stack)["alertmanager"],
    )
    say.say(f"people channel (local sink /people): {chat['attachments'][0]['title']}")
    notice = wait_for(
        f"Nightshift's notification of incident #{number}",
        lambda: received("/notify", lambda body: body["nightshift"].get("incident") == number),
        30,
        _logs(stack)["nightshift"],
    )
    say.say(f"notification (local sink /notify): {notice['text'].splitlines()[0]}")


def where_to_look(stack: Stack, say: Narrator, keep: bool) -> None:
    settings = _relative(stack.nightshift.settings_path)
    token = stack.operator_token_file.read_text().strip()
    say.section("where to look" + ("" if keep else " (the servers stop with the demo; --keep keeps them up)"))
    rows = [
        ("UI", f"{stack.nightshift.url}/   (operator token: {token}, in {_relative(stack.operator_token_file)})"),
        ("API", f"{stack.nightshift.url}/api/v1/incidents   (Authorization: Bearer <viewer token in "
         f"{_relative(stack.base / 'viewer.token')}>)"),
        ("metrics", f"{stack.nightshift.url}/metrics"),
        ("Prometheus", f"{stack.prometheus.url}/classic/alerts   (Debian's build; /alerts upstream)"),
        ("Alertmanager", f"{stack.alertmanager.url}/#/alerts"),
        ("Grafana stand-in", f"{stack.grafana.url}/api/annotations?tags=nightshift (bearer token in "
         f"{_relative(stack.grafana.token_file)})"),
        ("ledger", f".venv/bin/nightshift export --config {settings}"),
        ("logs", f"{_relative(stack.base.parent)}/**/*.log, the job's output in {_relative(stack.slurm.jobs_dir)}"),
    ]  # fmt: skip
    for name, where in rows:
        print(f"  {name:<17} {where}", flush=True)


# --- main --------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="stay up after the scenarios until Ctrl-C")
    parser.add_argument("--dir", type=Path, default=DEMO_DIR, help="state directory, emptied first")
    parser.add_argument(
        "--trainer", choices=TRAINERS, default="torch",
        help="torch: a real torch.distributed DDP job (torchrun, gloo, DCP checkpoints); sim: the simulated one",
    )  # fmt: skip
    return parser.parse_args(argv)


def _fresh(directory: Path) -> Path:
    """Empty ``directory`` (only ever a previous demo's, which carries the marker) and mark it as the demo's."""
    marker = directory / MARKER
    if directory.exists() and any(directory.iterdir()) and not marker.exists():
        raise StageFailed(f"refusing to empty {directory}: it is not a demo directory (no {MARKER} in it)")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    directory.chmod(0o755)  # munged checks that every directory above its socket is world-executable
    marker.touch()
    return directory.resolve()


def run(args: argparse.Namespace, say: Narrator, stop: contextlib.ExitStack) -> None:
    base = _fresh(args.dir)
    print(f"Nightshift demo: state and logs in {_relative(base)}/ (fresh)", flush=True)
    say.say("starting Slurm: munged, slurmctld, slurmd node1..node4, sshd")
    slurm: SlurmCluster = launch_slurm(base / "slurm")
    stop.callback(slurm.stop)
    say.say(
        "starting the DCGM exporters (node1..node4), the Grafana stand-in, Alertmanager, Prometheus, nightshift"
    )
    stack = launch_stack(base / "stack", slurm)
    stop.callback(stack.close)
    say.say(
        f"up: nightshift {stack.nightshift.url}, Prometheus {stack.prometheus.url}, Alertmanager "
        f"{stack.alertmanager.url}"
    )
    say.say(
        f"playbooks: {_relative(stack.playbooks)}/, copies of playbooks/ with recheck/verify windows of "
        f"{FAST_WINDOW}, polled every {FAST_VERIFY_INTERVAL} (the fast rules of rules/sim/ judge 10 s windows)"
    )
    job = submit_job(stack, say, args.trainer)
    episode(stack, say, job, args.trainer)
    say.section(f"done in {say.clock() - say.start:.0f} s")
    where_to_look(stack, say, args.keep)
    if args.keep:
        print("\nrunning until Ctrl-C", flush=True)
        while True:
            time.sleep(3600)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    say = Narrator()
    # Ctrl-C ends --keep even when a shell started the demo with SIGINT ignored (a background job); a terminated
    # demo unwinds the same way, so every process is stopped by PID.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    code = 0
    with contextlib.ExitStack() as stop:
        try:
            run(args, say, stop)
        except KeyboardInterrupt:
            print("\ninterrupted", flush=True)
        except (MissingBinary, StageFailed, AssertionError) as exc:
            # AssertionError: a daemon did not start; the launcher's message carries its log.
            print(f"\nerror: {exc}", file=sys.stderr, flush=True)
            if isinstance(exc, StageFailed) and exc.log:
                print(
                    f"--- last lines of the {exc.log[0]} log ---\n{exc.log[1]}", file=sys.stderr, flush=True
                )
            code = 1
        finally:
            print("stopping every process ...", flush=True)
    print("stopped", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
