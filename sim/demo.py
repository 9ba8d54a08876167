"""``make demo``: the whole loop on a simulated GPU cluster, narrated one line per stage.

``python -m sim.demo [--keep]`` starts, under a fresh ``var/demo/`` and on loopback with free ports, a real Slurm
(munged, slurmctld, slurmd node1..node4, sshd) and :func:`sim.stack.launch_stack` around it (simulated DCGM
exporters, Prometheus with the fast rules, Alertmanager, a Grafana stand-in, ``nightshift serve`` acting on Slurm
over SSH with the Slurm actions whitelisted). It submits a training job to node1 as a real batch job, then plays:

1. Xid 79 on node1 GPU 3 → GpuXidError → incident → drain node1, requeue the job excluding node1 → the job runs
   on node2 from its last checkpoint → progress verified → the Grafana annotation region.
2. A silent hang of the job → TrainingHang → incident → requeue → running again → verified → annotation.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

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
JOB_NAME = "llama-7b"
FIRST_NODE = "node1"
XID, XID_GPU = 79, 3
XID_PLAYBOOK = "gpu-xid-node-fault-slurm"
HANG_PLAYBOOK = "training-hang-slurm"
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

    def __init__(self, out: TextIO = sys.stdout, clock: Callable[[], float] = time.monotonic):
        self.out = out
        self.clock = clock
        self.start = clock()

    def say(self, message: str) -> None:
        print(f"[{self.clock() - self.start:6.1f}s] {message}", file=self.out, flush=True)

    def section(self, title: str) -> None:
        print(f"\n== {title}", file=self.out, flush=True)


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
    argv = shlex.split(command)
    return argv[2] if argv[:2] == ["bash", "-lc"] and len(argv) == 3 else command


def _relative(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


# --- stages ------------------------------------------------------------------------------------------------------


def submit_job(stack: Stack, say: Narrator) -> str:
    """Submit the training job to node1 and wait until it trains, watched by Prometheus."""
    job = stack.submit_trainer(JOB_NAME, FIRST_NODE)
    say.say(
        f"training job {job} ({JOB_NAME}) submitted: sbatch --requeue -w {FIRST_NODE} --wrap 'python -m sim.trainer'"
    )
    with explained_by(_logs(stack)["slurm"]):
        step = stack.wait_training(job, FIRST_NODE)
    say.say(f"job {job} RUNNING on {FIRST_NODE}, training: step {step}")
    return job


def alert_firing(stack: Stack, say: Narrator, alertname: str, **labels: str) -> None:
    def firing() -> list[dict[str, Any]]:
        return [
            alert for alert in stack.prometheus.alerts(alertname) if labels.items() <= alert["labels"].items()
        ]

    (alert, *_) = wait_for(f"{alertname} firing", firing, 60, _logs(stack)["prometheus"])
    keys = ("Hostname", "gpu", "xid", "xid_class", "train_job", "slurm_job_id")
    say.say(f"alert firing in Prometheus: {alertname}{{{_labels(alert['labels'], keys)}}}")


def remediation(
    stack: Stack, say: Narrator, playbook: str, job: str, after_incident: int, leaves: str | None
) -> int:
    """Narrate one incident of ``playbook`` from the webhook to its Grafana region; returns its id.

    ``leaves``: the node the job must leave (requeue excluding it), None when any node will do."""
    logs = _logs(stack)
    nightshift = stack.nightshift
    restarts = stack.slurm.job_restarts(job)

    with explained_by(logs["nightshift"]):
        incident = stack.wait_incident(playbook, after=after_incident)
    number = incident["id"]
    say.say(
        f"webhook received: incident #{number} opened (playbook {playbook}, node {incident['node']},"
        f" job {incident['job']})"
    )

    told: set[tuple[str, int]] = set()

    def steps_finished() -> dict[str, Any] | None:
        """The incident once its steps are finished or it closed; tells each new diagnosis and finished step."""
        detail = nightshift.incident(number)
        for row in detail["ledger"]:
            if row["kind"] == "diagnosis" and ("ledger", row["id"]) not in told:
                told.add(("ledger", row["id"]))
                say.say(f"diagnosis: {row['message']}")
        steps = [s for s in detail["steps"] if s["phase"] == "steps"]
        for step in steps:
            if step["status"] in FINISHED_STEPS and ("step", step["id"]) not in told:
                told.add(("step", step["id"]))
                command = " ; ".join(_remote(line) for line in (step["command"] or "").splitlines() if line)
                say.say(f"step {step['name']}: {step['status']} ({command})")
        finished = steps and all(s["status"] in FINISHED_STEPS for s in steps)
        return detail if finished or detail["incident"]["outcome"] else None

    detail = wait_for(f"the steps of incident #{number}", steps_finished, 60, logs["nightshift"])
    steps = [s for s in detail["steps"] if s["phase"] == "steps"]
    failed = [s for s in steps if s["status"] != "ok"]
    if not steps or failed:
        row = detail["incident"]
        why = f"step {failed[0]['name']} {failed[0]['status']}" if failed else "no step ran"
        raise StageFailed(f"incident #{number}: {why} ({row['state']}: {row['reason']})", logs["nightshift"])

    def running_again() -> str | None:
        node = stack.slurm.job_nodes(job)
        moved = node and node != leaves
        back = stack.slurm.squeue_state(job) == "RUNNING" and stack.slurm.job_restarts(job) > restarts
        return node if moved and back and len(stack.resumes(job)) > restarts else None

    node = wait_for(f"job {job} RUNNING again", running_again, 60, logs["slurm"])
    say.say(f"job {job} RUNNING on {node} (resumed from checkpoint step {stack.resumes(job)[-1]})")

    with explained_by(logs["nightshift"]):
        row = stack.wait_closed(number)["incident"]
    if row["outcome"] != "recovered":
        raise StageFailed(f"incident #{number} ended {row['outcome']}: {row['reason']}", logs["nightshift"])
    say.say(f"progress verified: incident #{number} recovered ({row['reason']})")

    def region() -> dict[str, Any] | None:
        tags = ("nightshift", f"playbook:{playbook}", f"job:{job}", "outcome:recovered")
        return next(iter(stack.grafana.annotations(*tags)), None)

    annotation = wait_for(f"the Grafana region of incident #{number}", region, 30, logs["grafana"])
    seconds = (annotation["timeEnd"] - annotation["time"]) / 1000
    say.say(
        f"Grafana annotation {annotation['id']}: region {_clock(annotation['time'])} → "
        f"{_clock(annotation['timeEnd'])} UTC ({seconds:.1f} s), tags {', '.join(annotation['tags'])}"
    )
    return number


def xid_scenario(stack: Stack, say: Narrator, job: str) -> int:
    say.section(f"1. Xid {XID} (GPU fell off the bus) on {FIRST_NODE} GPU {XID_GPU}")
    faults.inject_xid(stack.sim.state_dir, FIRST_NODE, XID_GPU, XID)
    say.say(f"fault injected: Xid {XID} on {FIRST_NODE} GPU {XID_GPU}")
    alert_firing(stack, say, "GpuXidError", Hostname=FIRST_NODE, xid=str(XID))
    number = remediation(stack, say, XID_PLAYBOOK, job, after_incident=0, leaves=FIRST_NODE)
    say.say(f"{FIRST_NODE} stays drained ({stack.slurm.node_reason(FIRST_NODE)}) until a person resumes it")
    people_heard(stack, say, number)
    return number


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


def hang_scenario(stack: Stack, say: Narrator, job: str, after_incident: int) -> None:
    say.section(f"2. silent hang of {JOB_NAME} (job {job})")
    node = stack.slurm.job_nodes(job)
    with explained_by(_logs(stack)["prometheus"]):
        stack.wait_window(job, node)
    faults.inject_job_fault(stack.sim.state_dir, JOB_NAME, "hang")
    say.say(f"fault injected: {JOB_NAME} hangs on {node} (stops stepping, stays alive, logs nothing)")
    alert_firing(stack, say, "TrainingHang", slurm_job_id=job)
    remediation(stack, say, HANG_PLAYBOOK, job, after_incident=after_incident, leaves=None)


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
    job = submit_job(stack, say)
    incident = xid_scenario(stack, say, job)
    hang_scenario(stack, say, job, after_incident=incident)
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
