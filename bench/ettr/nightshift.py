"""Nightshift in the simulated world: the real engine, the shipped playbooks, the scheduler at its seam.

The alerts of :mod:`bench.ettr.world` are ingested by a real :class:`app.engine.Engine` (SQLite, an injected
clock): matching, job episodes, guards, the diagnosis of the job's log (the texts of :mod:`sim.logtext`, as the
trainer prints them), requeues with ``ExcNodeList``, planned swaps (checkpoint request, wait, requeue), node
repairs (drain, reboot, ``dcgmi diag`` validation, resume or hold), every Slurm action granted. The scheduler is
simulated at Nightshift's own seam: :class:`SimSlurm` answers the exact ``scontrol``/``squeue``/``scancel``/
``tail`` commands the Slurm client sends, on the world; :class:`SimNodeShell` the validation's start/probe/stop
scripts; :class:`SimPrometheus` the verifications, re-checks and checkpoint-time queries. What Nightshift hands to a
person (a page: needs_human, failed, advisory, an approval, an alert no playbook matches) goes to :class:`People`,
if there are any.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from app import build_engine
from app.actions import default_registry
from app.clients import Clients
from app.clients.prometheus import Sample
from app.clients.slurm import SlurmClient
from app.clients.ssh import CommandResult
from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.domain.hostlist import expand_hostlist
from app.domain.permissions import Grant, Permissions
from app.domain.playbooks import load_playbooks
from app.engine import Engine
from bench.ettr.causes import KINDS
from bench.ettr.responders import People
from bench.ettr.world import JOB, START, TRAIN_JOB, Alert, World
from bench.runner import AnsweringRunner
from sim import logtext

REPO = Path(__file__).resolve().parents[2]
TICK = 30.0  # seconds between engine rounds while anything is going on
IDLE_TICK = 300.0  # ...and while the job hurts with no alert firing (it waits in the queue)
# Issue 25's playbooks: left out for the run "without issue 25's features".
ISSUE25_PLAYBOOKS = ("fail-slow.yaml", "planned-swap.yaml")
PAGED_OUTCOMES = {"needs_human", "failed", "advisory", "credential_error", "unverified"}


def playbook_files(issue25: bool) -> list[Path]:
    return [
        path
        for path in sorted((REPO / "playbooks").glob("*.yaml"))
        if issue25 or path.name not in ISSUE25_PLAYBOOKS
    ]


def job_log(world: World) -> str:
    """What the job's ranks have printed about its trouble by now (the log Nightshift's diagnosis reads)."""
    trouble = world.trouble
    if trouble is None:
        return ""
    kind, culprit, at = trouble
    job = world.job
    peer = next((n for n in job.allocation if n != culprit), culprit)
    step = int(job.progress)
    ctx = logtext.Context(hostname=peer, pid=5000, job=TRAIN_JOB, step=step)
    bad = logtext.Context(hostname=culprit, pid=5001, job=TRAIN_JOB, step=step)
    watchdog_done = world.now >= at + world.p.watchdog_minutes * 60
    effect = KINDS[kind].effect
    lines: list[str] = []
    if KINDS[kind].xid:
        lines.append(logtext.gpu_fault(bad, at, "unspecified launch failure", 2))
    elif kind == "software_bug":
        lines.append(
            "Traceback (most recent call last):\n"
            '  File "train.py", line 240, in train_step\n'
            "    batch = pack(sequences, self.max_len)\n"
            "ValueError: cannot pack 3 sequences into 2 rows"
        )
    if effect == "outage":
        lines.append(logtext.storage_io(ctx))
    elif effect == "crash" or (effect in ("stall_then_crash", "node_down") and watchdog_done):
        if kind == "nccl_watchdog":
            lines.append(logtext.nccl(ctx, at))
        else:
            lines.append(logtext.peer_lost(ctx, at, culprit))
    elif effect == "nan":
        lines.append(f"[rank0] step {step}: loss nan, grad_norm nan")
    return "\n".join(lines)


class SimSlurm(AnsweringRunner):
    """The Slurm host at Nightshift's CommandRunner seam: the commands the Slurm client sends, on the world."""

    def __init__(self, world: World):
        self.world = world
        self.wrong = 0  # a healthy node taken out or excluded, a requeue of a job training at full speed
        self.healthy_excluded = 0

    def _healthy(self, name: str) -> bool:
        node = self.world.nodes.get(name)
        return node is not None and node.healthy(self.world.now)

    def _answer(self, argv: tuple[str, ...]) -> tuple[str, int]:
        world, job = self.world, self.world.job
        match argv:
            case ("scontrol", "show", "job", "-o", _):
                # A failed job keeps its last NodeList; a requeued one waiting in the queue has none.
                nodes = ",".join(job.allocation) if job.state in ("RUNNING", "FAILED") else ""
                return (
                    f"JobId={JOB} JobName={TRAIN_JOB} UserId=train(1000) JobState={job.state} Reason=None "
                    f"Requeue=1 Restarts={job.restarts} NodeList={nodes or '(null)'} "
                    f"ReqNodeList=(null) ExcNodeList={','.join(sorted(job.exc)) or '(null)'} "
                    f"StdErr=/shared/logs/{JOB}.out StdOut=/shared/logs/{JOB}.out\n",
                    0,
                )
            case ("squeue", *rest) if "--format=%k" in rest:
                return "nightshift.checkpoint_signal=USR1\n", 0  # the job uses the progress library
            case ("squeue", *rest) if "--format=%i" in rest:
                name = next(a.removeprefix("--nodelist=") for a in rest if a.startswith("--nodelist="))
                running = job.state == "RUNNING" and name in world.in_job
                return (f"{JOB}\n" if running else ""), 0
            case ("squeue", *_):
                return "1000 1000\n", 0
            case ("scancel", "--verbose", *_, signal, _) if signal.startswith("--signal="):
                if job.state != "RUNNING":
                    return f"scancel: error: Kill job error on job id {JOB}: Job/step already completing", 1
                world.request_checkpoint()
                return f"scancel: Signal 10 to job {JOB}\n", 0
            case ("scontrol", "requeue", _):
                if job.state == "PENDING":
                    return f"scontrol: error: Job {JOB} is pending execution", 1
                if not world.hurting() and not world.culprits():
                    self.wrong += 1
                world.requeue(rollback=False)
                return "", 0
            case ("scontrol", "update", jobid, exc, *_) if jobid.startswith("JobId="):
                excluded = set(expand_hostlist(exc.removeprefix("ExcNodeList=")))
                healthy = sum(1 for n in excluded - job.exc if self._healthy(n))
                self.wrong += healthy
                self.healthy_excluded += healthy
                job.exc = excluded
                return "", 0
            case ("scontrol", "show", "hostnames", hostlist):
                return "\n".join(expand_hostlist(hostlist)) + "\n", 0
            case ("setpriv", *rest) if "tail" in rest:
                return job_log(world) + "\n", 0
            case ("tail", *_):
                return job_log(world) + "\n", 0
            case ("scontrol", "show", "node", "-o", name):
                return self._show(name)
            case ("scontrol", "show", "partition", "-o", part):
                return f"PartitionName={part} Nodes={','.join(world.names)} State=UP\n", 0
            case ("scontrol", "update", node_arg, "State=DRAIN", reason):
                name = node_arg.removeprefix("NodeName=")
                self.wrong += not world.nodes[name].drained and self._healthy(name)
                world.nodes[name].take_out(world.now, reason.removeprefix("Reason="))
                return "", 0
            case ("scontrol", "update", node_arg, "State=RESUME"):
                node = world.nodes[node_arg.removeprefix("NodeName=")]
                node.drained = node.down_after_reboot = False
                node.drain_reason = ""
                return "", 0
            case ("scontrol", "reboot", "ASAP", "nextstate=DOWN", reason, name):
                self.wrong += self._healthy(name)
                world.reboot(name, reason.removeprefix("reason="))
                return "", 0
        return f"unexpected command {argv}", 1

    def _show(self, name: str) -> tuple[str, int]:
        world = self.world
        node = world.nodes.get(name)
        if node is None:
            return f"Node {name} not found", 1
        in_job = world.job.state == "RUNNING" and name in world.job.allocation
        base = (
            "DOWN"
            if node.down_until > world.now or node.down_after_reboot
            else ("ALLOCATED" if in_job else "IDLE")
        )
        flags = []
        if node.drained:
            flags.append("DRAIN")
        if node.reboot_until > world.now or name in world.reboot_asap:
            flags.append("REBOOT_REQUESTED")
        state = "+".join([base, *flags])
        reason = f" Reason={node.drain_reason} [root@2026-01-05T00:00:00]" if node.drain_reason else ""
        return f"NodeName={name} Arch=x86_64 State={state} Partitions=gpu{reason}\n", 0


class SimNodeShell:
    """One node's shell at the validation's seam (app/clients/node_check.py: start detached, probe, stop): the
    check (``dcgmi diag -r 2``) takes ``validation_seconds`` and passes when the node has no fault left."""

    def __init__(self, world: World, name: str):
        self.world, self.name = world, name
        self.started: float | None = None
        self.passes = False

    def run(self, argv: Any, timeout: float | None = None) -> CommandResult:
        script = argv[-1]
        if self.world.nodes[self.name].down_until > self.world.now:
            refused = f"ssh: connect to host {self.name} port 22: No route to host"
            return CommandResult(tuple(argv), " ".join(argv), 255, "", refused, 3.0)
        if "echo started" in script:
            node = self.world.nodes[self.name]
            # dcgmi diag finds a GPU fault and a throttled GPU; silent data corruption and a NIC escape it.
            self.started = self.world.now
            self.passes = node.speed >= 1 and node.fault in (None, "silent_data_corruption", "nic")
            out = "started\n"
        elif "echo stopped" in script:
            self.started, out = None, "stopped\n"
        elif self.started is None:
            out = "absent\n"
        else:
            elapsed = int(self.world.now - self.started)
            if elapsed < self.world.p.validation_seconds:
                out = f"running {elapsed}\n"
            else:
                verdict = "Pass" if self.passes else "Fail"
                out = f"done {elapsed} {0 if self.passes else 1}\nDiagnostic Result: {verdict}\n"
        return CommandResult(tuple(argv), " ".join(argv), 0, out, "", 0.1)

    def close(self) -> None:
        pass


class SimPrometheus:
    """Answers the engine's queries from the world: a verification has a sample while the job makes progress
    (and its loss is a number); a hang's re-check while the run is stuck; the checkpoint time is the job's
    newest; a re-check that names an alert (or a DCGM metric) has one while such an alert fires."""

    name = "prometheus"

    def __init__(self, world: World, firing: dict[str, Alert]):
        self.world, self.firing = world, firing

    def query(self, expr: str, at: datetime | None = None) -> list[Sample]:
        world, job = self.world, self.world.job
        sample = [Sample({"slurm_job_id": JOB}, 1.0, 0.0)]
        if "training_last_checkpoint_timestamp_seconds" in expr:
            if job.state != "RUNNING":
                return []
            stamp = (START + timedelta(seconds=job.checkpoint_time)).timestamp()
            return [Sample({"slurm_job_id": JOB}, stamp, 0.0)]
        if "training_loss" in expr:
            return sample if job.state == "RUNNING" and not job.nan else []
        if "training_rank_step_seconds" in expr:
            return []  # evidence for the ledger only
        if "training_step_total" in expr or "training_samples_total" in expr:
            if "changes(" in expr and "== 0" in expr:  # a hang's re-check: exported, not stepping
                return sample if job.state == "RUNNING" and job.stalled else []
            if "increase(" in expr or "rate(" in expr:  # a verification: the job steps
                return sample if world.speed() > 0 else []
            # The step counter itself, now or at an instant of the last hours.
            when = world.now if at is None else (at - START).total_seconds()
            progress = world.progress_at(when)
            return [] if progress is None else [Sample({"slurm_job_id": JOB}, progress / 10, when)]
        names = set(re.findall(r'alertname="([A-Za-z]+)"', expr)) or set(re.findall(r"\b(DCGM_\w+)", expr))
        host = re.search(r'Hostname="([^"]+)"', expr)
        for alert in self.firing.values():
            labels = alert.labels
            name = labels.get("alertname", alert.alertname)
            if (name in names or not names or any(n.startswith("DCGM_") for n in names)) and (
                host is None or labels.get("Hostname") == host.group(1)
            ):
                return [Sample(dict(labels), 1.0, 0.0)]
        return []

    def ready(self) -> bool:
        return True


class Pager:
    """The notification webhook: what reached people."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def post_json(self, url: str, body: dict[str, Any], headers: Any = None) -> int:
        self.bodies.append(body)
        return 200


def _stamp(at: float) -> str:
    return (START + timedelta(seconds=at)).isoformat().replace("+00:00", "Z")


def payload(alerts: Sequence[Alert], status: str, now: float) -> str:
    """An Alertmanager webhook body (version 4) for ``alerts``."""
    items = []
    for a in alerts:
        labels = {"alertname": a.alertname, **a.labels}
        key = json.dumps(labels, sort_keys=True).encode()
        items.append(
            {
                "status": status,
                "labels": labels,
                "annotations": {"summary": a.alertname},
                "startsAt": _stamp(a.at),
                "endsAt": _stamp(now) if status == "resolved" else "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": hashlib.sha1(key).hexdigest()[:16],
            }
        )
    return json.dumps(
        {
            "version": "4",
            "groupKey": "{}:{}",
            "truncatedAlerts": 0,
            "status": status,
            "receiver": "nightshift",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager",
            "alerts": items,
        }
    )


class Clock:
    def __init__(self, world: World):
        self.world = world

    def now(self) -> datetime:
        return START + timedelta(seconds=self.world.now)

    def sleep(self, seconds: float) -> None:
        self.world.advance(self.world.now + seconds)

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait()  # the world stands still while a step runs: only its end ends the wait


def engine_for(
    world: World,
    workdir: Path,
    playbooks: Sequence[Path],
    slurm: SimSlurm,
    pager: Pager,
    firing: dict[str, Alert],
) -> Engine:
    """The engine as the app builds it (:func:`app.build_engine`), over the simulated world's clients, with every
    Slurm action granted."""
    registry = default_registry()
    settings = Settings(data_dir=str(workdir))
    settings.notify.webhook_url = "http://people.example/hook"
    settings.slurm.host = "slurm-login"
    clients = Clients(
        settings,
        slurm=SlurmClient(slurm),
        prometheus=SimPrometheus(world, firing),
        http=pager,
        **{f"node:{name}": SimNodeShell(world, name) for name in world.names},
    )
    grants = [a.name for a in registry if a.name.startswith(("slurm.", "checkpoint.")) and not a.read_only]
    return build_engine(
        settings,
        clock=Clock(world),
        clients=clients,
        registry=registry,
        playbooks=load_playbooks(list(playbooks), registry),
        permissions=Permissions(Grant(action=name) for name in grants),
    )


def needs_person(body: dict[str, Any]) -> bool:
    data = body.get("nightshift", {})
    return data.get("outcome") in PAGED_OUTCOMES or bool(data.get("unmatched"))


class Nightshift:
    """The real engine as a responder: alerts in, actions on the world, pages to ``people`` (or to nobody)."""

    def __init__(self, world: World, workdir: Path, people: People | None, issue25: bool = True):
        self.world, self.people = world, people
        self.firing: dict[str, Alert] = {}
        self.slurm = SimSlurm(world)
        self.pager = Pager()
        self.engine = engine_for(world, workdir, playbook_files(issue25), self.slurm, self.pager, self.firing)
        self.busy_until = -1.0
        self.seen = 0
        self.handed = 0

    def next_due(self) -> float:
        world = self.world
        if self.firing or world.outbox or world.now < self.busy_until:
            return world.now + TICK
        if world.hurting():
            return (
                world.now + IDLE_TICK
            )  # nothing fires: its timers (backoffs, repairs) are all that can move
        return math.inf

    def on_alerts(self, world: World, alerts: list[Alert]) -> None:
        for a in alerts:
            self.firing[json.dumps({"alertname": a.alertname, **a.labels}, sort_keys=True)] = a
        self.engine.ingest(parse_notification(payload(alerts, "firing", world.now)))
        self.busy_until = world.now + 2 * 3600  # verifications, backoffs and node repairs run meanwhile

    def step(self, world: World) -> None:
        for name in world.repaired_by_hand:
            # The technician who repaired a node Nightshift holds releases it (POST /api/v1/nodes/<node>/release).
            with contextlib.suppress(LookupError, ValueError):
                self.engine.repairs.release(name, by="technician", note="repaired by hand")
        world.repaired_by_hand.clear()
        self.engine.run_until_idle(limit=500)
        job = world.job
        if (
            self.firing
            and job.state == "RUNNING"
            and world.speed() >= 1.0
            and world.now > job.loading_until + 120
        ):
            done = list(self.firing.values())
            self.firing.clear()
            self.engine.ingest(parse_notification(payload(done, "resolved", world.now)))
            self.engine.run_until_idle(limit=500)
        pages = [b for b in self.pager.bodies[self.seen :] if needs_person(b)]
        self.seen = len(self.pager.bodies)
        if pages:
            self.handed += len(pages)
            if self.people is not None:
                self.people.page(world)

    def summary(self) -> dict[str, Any]:
        return {
            "incidents": len(self.engine.incidents(limit=1000)),
            "pages": sum(1 for b in self.pager.bodies if needs_person(b)),
            "healthy_nodes_excluded": self.slurm.healthy_excluded,
            "engine_wrong_actions": self.slurm.wrong,
            "nodes_held": self.engine.repairs.held(),
        }
