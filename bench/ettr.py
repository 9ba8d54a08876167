"""Effective training time ratio (ETTR) over a simulated month of a 1,024-GPU job: Nightshift against two baselines.

A training job on 128 nodes x 8 GPUs (136 nodes in the partition: 8 spares) runs for ``--days`` (30) of simulated
time. Faults arrive as a Poisson process at the Llama 3 rate (419 unexpected interruptions in 54 days on 16,384
GPUs, "The Llama 3 Herd of Models", 2024, table 5), scaled to 1,024 GPUs (0.49 a day), with the paper's mix of
causes, plus silent hangs and stragglers at the stated rates (``Params``). Each run replays the same fault draws
three ways:

* ``nightshift``: the real decision code. Every fault raises the alerts the shipped rules would (labels as
  rules/README.md states them, after each rule's detection delay) and they are ingested by a real
  :class:`app.engine.Engine` over the shipped ``playbooks/`` with every Slurm action granted: matching,
  job-episode correlation, guards, diagnosis of the job's log (generated with sim/logtext.py), culprit
  exclusion, node repair. Time is an injected FakeClock; the scheduler is simulated at Nightshift's own seam
  (the ``scontrol``/``squeue``/``tail`` commands the Slurm client sends, answered by :class:`SimSlurm`), the
  node's validation by :class:`SimNodeShell`, Prometheus by :class:`SimPrometheus`. What the engine hands to a
  person (needs_human, failed, advisory, an alert no playbook matches) waits for the person.
* ``person``: no automation; the on-call person acts after ``day_delay`` or ``night_delay`` (22:00-07:00) plus
  ``fix_minutes``, and always does the right thing (excludes the faulty node, requeues).
* ``naive``: a loop that requeues the job whenever it exits, at once and without excluding anything; what the
  loop cannot see (hangs, stragglers) and a crash loop wait for the person as above.

Physical consequences (the model, not Nightshift's code): a crash loses the work since the last checkpoint; a
restart costs ``restart_minutes`` (queue, load, warm-up); a node-bound hardware fault stays until the node is
repaired (a reboot fixes it with ``reboot_fixes``) and crashes the job again ``recrash_minutes`` after a restart
that lands on it (Slurm reuses the allocation: the node is picked again unless excluded or drained); a host fault
takes the node DOWN for ``host_down_hours`` and Slurm requeues the job itself; storage outages last
``storage_outage_minutes``. ETTR = training progress / wall time.

    python -m bench.ettr [--days 30] [--seeds 4] [--out bench/results/ettr.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app import build_engine
from app.actions import default_registry
from app.alertmanager import parse_notification
from app.clients import Clients
from app.clients.prometheus import Sample
from app.clients.slurm import SlurmClient
from app.clients.ssh import CommandResult
from app.config import Settings
from app.permissions import Grant, Permissions
from app.playbooks import load_playbooks
from sim import logtext

REPO = Path(__file__).resolve().parents[1]
TICK = 30.0  # seconds between engine rounds while anything is going on
VALIDATION_SECONDS = 600  # dcgmi diag -r 2 on a node of 8 GPUs, assumed
START = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)  # a Monday, midnight
JOB, TRAIN_JOB = "4242", "llama3-1k"

# Llama 3 (table 5): share of the 419 unexpected interruptions by root cause. The paper's five GPU/network causes
# as the issue quotes them; "the rest" (35.7%) split by assumption into software (job crash, nodes fine), host
# (the node goes DOWN: maintenance, power, NIC) and storage (a transient I/O outage).
MIX = {
    "faulty_gpu": 0.301,
    "hbm3": 0.172,
    "network": 0.084,
    "gpu_sram": 0.045,
    "gpu_gsp": 0.041,
    "software": 0.179,
    "host": 0.140,
    "storage": 0.038,
}
LLAMA3_PER_GPU_DAY = 419 / (54 * 16_384)
NODE_BOUND = {"faulty_gpu", "hbm3", "gpu_sram", "gpu_gsp"}


@dataclass(frozen=True)
class Params:
    days: float = 30.0
    nodes: int = 128
    gpus_per_node: int = 8
    spares: int = 8
    hangs_per_day: float = 1 / 7  # silent hangs (no exit, no error), assumed
    stragglers_per_day: float = 1 / 10  # a node slows the whole job (thermal), assumed
    straggler_speed: float = 0.55
    checkpoint_minutes: float = 30.0
    restart_minutes: float = 10.0
    recrash_minutes: float = 3.0
    reboot_fixes: float = 0.5  # share of node-bound GPU faults a reboot (the repair's first step) clears
    reboot_minutes: float = 15.0
    host_down_hours: float = 4.0
    storage_outage_minutes: float = 10.0
    day_delay_minutes: float = 20.0
    night_delay_minutes: float = 120.0
    fix_minutes: float = 15.0
    manual_repair_hours: float = (
        24.0  # a node out of service (drained, held) is repaired by hand and returned
    )
    scheduler_notice_minutes: float = 1.0  # how soon the naive loop sees the job has exited
    slurm_node_timeout_minutes: float = 5.0  # SlurmdTimeout: a dead host is DOWN and its job requeued

    @property
    def interruptions_per_day(self) -> float:
        return LLAMA3_PER_GPU_DAY * self.nodes * self.gpus_per_node


# Detection delay of each alert: the rule's window and `for` (rules/*.yml, production) plus Alertmanager's 10 s
# group_wait, in seconds.
DETECT = {
    "GpuXidError": 70,
    "GpuEccDoubleBitError": 70,
    "TrainingJobError": 70,
    "TrainingHang": 20 * 60 + 10,
    "TrainingThroughputDrop": 15 * 60 + 10,
    "GpuThermalThrottle": 5 * 60 + 10,
    "SlurmNodeDown": 5 * 60 + 10,
    "TrainingMetricsAbsent": 10 * 60 + 10,
}


@dataclass
class Fault:
    at: float  # seconds since START
    kind: str
    node: str = ""
    gpu: int = 0


def node_names(p: Params) -> list[str]:
    return [f"gpu{i:03d}" for i in range(1, p.nodes + p.spares + 1)]


def draw_faults(p: Params, rng: random.Random) -> list[Fault]:
    """Fault arrivals over the run (the node is drawn later, from the allocation of the moment)."""
    faults: list[Fault] = []
    horizon = p.days * 86400
    for rate, kinds in (
        (p.interruptions_per_day, list(MIX)),
        (p.hangs_per_day, ["hang"]),
        (p.stragglers_per_day, ["straggler"]),
    ):
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate / 86400)
            if t >= horizon:
                break
            kind = rng.choices(kinds, weights=[MIX.get(k, 1) for k in kinds])[0]
            faults.append(Fault(t, kind, gpu=rng.randrange(p.gpus_per_node)))
    return sorted(faults, key=lambda f: f.at)


# --- the physical world: nodes and the job ----------------------------------------------------------------------


@dataclass
class Node:
    fault: str | None = None  # a node-bound hardware fault present
    slow: bool = False  # straggler
    down_until: float = -1.0  # host fault: Slurm has it DOWN
    drained: bool = False
    drain_reason: str = ""
    reboot_until: float = -1.0
    down_after_reboot: bool = False  # came back DOWN (nextstate=DOWN) until resumed
    drained_at: float = -1.0

    def take_out(self, at: float, reason: str) -> None:
        if not self.drained:
            self.drained_at = at
        self.drained, self.drain_reason = True, reason


@dataclass
class Job:
    """Progress accounting: progress is ideal-training seconds; checkpoints every C wall seconds of running."""

    p: Params
    state: str = "RUNNING"  # RUNNING | PENDING | FAILED
    hung: bool = False
    loading_until: float = 0.0
    start_at: float = -1.0  # PENDING: when it starts
    allocation: list[str] = field(default_factory=list)
    exc: set[str] = field(default_factory=set)
    progress: float = 0.0
    checkpoint: float = 0.0
    next_checkpoint: float = 0.0
    clock: float = 0.0
    restarts: int = 0
    log: str = ""
    recrash_at: float = -1.0
    recrash_kind: str = ""
    crashed_at: float = -1.0
    pending_since: float = -1.0

    def speed(self, nodes: dict[str, Node]) -> float:
        if self.state != "RUNNING" or self.hung or self.clock < self.loading_until:
            return 0.0
        return self.p.straggler_speed if any(nodes[n].slow for n in self.allocation) else 1.0

    def advance(self, to: float, nodes: dict[str, Node]) -> None:
        interval = self.p.checkpoint_minutes * 60
        while self.clock < to:
            if self.state == "RUNNING" and not self.hung and self.clock < self.loading_until:
                self.clock = min(to, self.loading_until)  # loading the checkpoint, warming up
                continue
            speed = self.speed(nodes)
            if speed == 0:
                self.clock = to
                return
            step_end = min(to, self.next_checkpoint)
            self.progress += speed * (step_end - self.clock)
            self.clock = step_end
            if self.clock >= self.next_checkpoint:
                self.checkpoint = self.progress
                self.next_checkpoint = self.clock + interval

    def crash(self, log: str) -> None:
        self.progress = self.checkpoint
        self.state, self.hung, self.log = "FAILED", False, log
        self.recrash_at, self.crashed_at = -1.0, self.clock

    def requeue(self, at: float, delay: float = 60.0) -> None:
        self.pending_since = at
        self.progress = self.checkpoint
        self.state, self.hung, self.start_at = "PENDING", False, at + delay
        self.recrash_at = -1.0
        self.restarts += 1


class World:
    """The cluster's truth; one per policy run. Time in seconds since START."""

    def __init__(self, p: Params, rng: random.Random):
        self.p, self.rng = p, rng
        self.names = node_names(p)
        self.nodes = {n: Node() for n in self.names}
        self.job = Job(p, allocation=self.names[: p.nodes], next_checkpoint=p.checkpoint_minutes * 60)
        self.now = 0.0
        self.recrashes = 0  # restarts that landed on a still-faulty node
        self.storage_until = -1.0
        self.repaired_by_hand: list[
            str
        ] = []  # nodes a person repaired and returned, not yet told to Nightshift

    def usable(self, name: str) -> bool:
        node = self.nodes[name]
        return (
            not node.drained
            and node.down_until <= self.now
            and node.reboot_until <= self.now
            and not (node.down_after_reboot)
        )

    def advance(self, to: float) -> None:
        """Move time to ``to``, starting a pending job and re-crashing one that restarted onto a fault."""
        while True:
            events = [t for t in (self.job.start_at, self.job.recrash_at) if self.now <= t <= to]
            step = min(events, default=to)
            self.job.advance(step, self.nodes)
            self.now = step
            for name, node in self.nodes.items():
                if 0 <= node.reboot_until <= self.now:
                    node.reboot_until = -1.0
                if node.drained and self.now >= node.drained_at + self.p.manual_repair_hours * 3600:
                    node.fault, node.slow, node.drained, node.down_after_reboot = None, False, False, False
                    node.drain_reason = ""
                    self.repaired_by_hand.append(name)
            if self.job.state == "PENDING" and 0 <= self.job.start_at <= self.now:
                self._start()
            elif 0 <= self.job.recrash_at <= self.now and self.job.state == "RUNNING":
                self.recrashes += 1
                self.job.crash(self.recrash_log(self.job.recrash_kind))
            if step >= to:
                return

    def _start(self) -> None:
        job = self.job
        previous = [n for n in job.allocation if self.usable(n) and n not in job.exc]
        others = [n for n in self.names if n not in previous and self.usable(n) and n not in job.exc]
        allocation = (previous + others)[: self.p.nodes]
        if len(allocation) < self.p.nodes:
            job.start_at = self.now + 300  # not enough nodes: wait in the queue
            return
        job.allocation, job.state, job.start_at = allocation, "RUNNING", -1.0
        job.loading_until = self.now + self.p.restart_minutes * 60 - 60
        job.next_checkpoint = job.loading_until + self.p.checkpoint_minutes * 60
        bad = [n for n in allocation if self.nodes[n].fault]
        if self.storage_until > self.now:
            job.recrash_at, job.recrash_kind = job.loading_until + 30, "storage"
        elif bad:
            job.recrash_at, job.recrash_kind = (
                self.now + self.p.recrash_minutes * 60,
                self.nodes[bad[0]].fault or "",
            )

    def recrash_log(self, kind: str) -> str:
        """The log of a restart that died again on a node still at fault (or on storage still out)."""
        bad = next((n for n in self.job.allocation if self.nodes[n].fault), self.job.allocation[0])
        peer = next(n for n in self.job.allocation if n != bad)
        ctx = logtext.Context(hostname=peer, pid=5000, job=TRAIN_JOB, step=int(self.job.progress))
        if kind == "storage":
            return logtext.storage_io(ctx)
        culprit = logtext.Context(hostname=bad, pid=5001, job=TRAIN_JOB, step=ctx.step)
        return (
            logtext.gpu_fault(culprit, self.now, "unspecified launch failure", 2)
            + "\n"
            + logtext.peer_lost(ctx, self.now, bad)
        )

    def hurting(self) -> bool:
        """The job is down, hung or slowed (the state a person would act on)."""
        job = self.job
        if job.state == "FAILED" or job.hung:
            return True
        if job.state == "PENDING" and self.now > job.pending_since + 1800:
            return True  # queued for half an hour: not enough nodes outside its exclusion list
        return job.state == "RUNNING" and self.now > job.loading_until and job.speed(self.nodes) < 1.0

    def needs_fix(self) -> bool:
        """What a person looking at the alerts would fix: the job hurts, or a node at fault is in its way."""
        return self.hurting() or any(self.nodes[n].fault or self.nodes[n].slow for n in self.job.allocation)

    def host_requeue_due(self) -> float:
        """When Slurm itself requeues the failed job because one of its nodes died, or -1."""
        job = self.job
        if job.state == "FAILED" and any(self.nodes[n].down_until > job.crashed_at for n in job.allocation):
            return job.crashed_at + self.p.slurm_node_timeout_minutes * 60
        return -1.0

    # --- what a person (or the naive loop) does --------------------------------------------------------------

    def person_fix(self) -> None:
        """The right fix, done by hand: drain every node with a fault or a slowdown in the job's way, requeue."""
        for name in self.job.allocation:
            node = self.nodes[name]
            if node.fault or node.slow:
                node.take_out(self.now, "person")
        # The job's exclusion list keeps only nodes still at fault (Slurm's ExcNodeList survives requeues).
        self.job.exc = {n for n in self.job.exc if self.nodes[n].fault or self.nodes[n].slow}
        if self.job.state != "PENDING":
            self.job.requeue(self.now)


def person_delay(p: Params, at: float) -> float:
    hour = (START + timedelta(seconds=at)).hour
    night = hour >= 22 or hour < 7
    return (p.night_delay_minutes if night else p.day_delay_minutes) * 60 + p.fix_minutes * 60


# --- fault effects common to every policy ------------------------------------------------------------------------


def apply_fault(world: World, fault: Fault) -> list[dict[str, Any]]:
    """Make ``fault`` true in ``world`` and return the alerts the rules would raise, each with ``at``."""
    p, job, rng = world.p, world.job, world.rng
    fault.node = rng.choice(job.allocation)
    node = world.nodes[fault.node]
    peer = rng.choice([n for n in job.allocation if n != fault.node])
    ctx = logtext.Context(
        hostname=peer, pid=4000 + rng.randrange(1000), job=TRAIN_JOB, step=int(job.progress)
    )
    running = job.state == "RUNNING"
    kind, t = fault.kind, world.now
    base = {"slurm_job_id": JOB}
    training = {**base, "train_job": TRAIN_JOB, "Hostname": peer}
    gpu = {**base, "Hostname": fault.node, "gpu": str(fault.gpu)}
    alerts: list[tuple[str, dict[str, str]]] = []
    if kind in NODE_BOUND:
        node.fault = kind
        if not running:
            return []
        xid = {"faulty_gpu": "79", "hbm3": "48", "gpu_sram": "95", "gpu_gsp": "119"}[kind]
        xid_class = "reboot" if xid == "79" else "reset_gpu"
        fault_ctx = logtext.Context(
            hostname=fault.node, pid=ctx.pid, job=TRAIN_JOB, step=ctx.step, gpu=fault.gpu
        )
        job.crash(
            logtext.gpu_fault(fault_ctx, t, "unspecified launch failure", 2)
            + "\n"
            + logtext.peer_lost(ctx, t, fault.node)
        )
        alerts.append(("GpuXidError", {**gpu, "xid": xid, "xid_class": xid_class}))
        if kind == "hbm3":
            alerts.append(("GpuEccDoubleBitError", gpu))
        alerts.append(("TrainingJobError", {**training, "error_class": "nccl"}))
    elif kind == "network":
        if not running:
            return []
        job.crash(logtext.nccl(ctx, t))
        alerts.append(("TrainingJobError", {**training, "error_class": "nccl"}))
    elif kind == "software":
        if not running:
            return []
        job.crash(logtext.cuda_oom(ctx))
        alerts.append(("TrainingJobError", {**training, "error_class": "cuda_oom"}))
    elif kind == "host":
        node.down_until = t + p.host_down_hours * 3600
        if not running:
            return []
        job.crash(logtext.peer_lost(ctx, t, fault.node))
        alerts.append(("TrainingJobError", {**training, "error_class": "nccl"}))
        alerts.append(("SlurmNodeDown", {"Hostname": fault.node, "node_name": fault.node}))
    elif kind == "storage":
        world.storage_until = t + p.storage_outage_minutes * 60
        if not running:
            return []
        job.crash(logtext.storage_io(ctx))
        alerts.append(("TrainingJobError", {**training, "error_class": "storage_io"}))
    elif kind == "hang":
        if not running:
            return []
        job.hung, job.log = True, ""
        alerts.append(("TrainingHang", {**training}))
    elif kind == "straggler":
        node.slow = True
        if not running:
            return []
        alerts.append(("GpuThermalThrottle", gpu))
        alerts.append(("TrainingThroughputDrop", {**training, "Hostname": fault.node}))
    return [{"alertname": name, "labels": labels, "at": t + DETECT[name]} for name, labels in alerts]


# --- the baselines -----------------------------------------------------------------------------------------------


def run_baseline(p: Params, faults: Sequence[Fault], seed: int, naive: bool) -> dict[str, Any]:
    world = World(p, random.Random(seed))
    job, horizon = world.job, p.days * 86400
    person_at = -1.0
    queue = [*faults, Fault(horizon, "end")]
    while world.now < horizon:
        due = [queue[0].at, horizon, person_at, world.host_requeue_due()]
        if naive and job.state == "FAILED":
            due.append(job.crashed_at + p.scheduler_notice_minutes * 60)
        world.advance(max(world.now, min(t for t in due if t >= 0)))
        if world.now >= horizon:
            break
        if 0 <= world.host_requeue_due() <= world.now:
            job.requeue(world.now)  # Slurm's own requeue (--requeue) when a node of the job died
        elif (
            naive and job.state == "FAILED" and world.now >= job.crashed_at + p.scheduler_notice_minutes * 60
        ):
            job.requeue(world.now)
        if 0 <= person_at <= world.now:
            person_at = -1.0
            if world.needs_fix():
                world.person_fix()
        if queue[0].at <= world.now:
            alerts = apply_fault(world, queue.pop(0))
            if alerts and person_at < 0:
                person_at = min(a["at"] for a in alerts) + person_delay(p, world.now)
        if (
            person_at < 0
            and world.needs_fix()
            and (not naive or job.recrash_at >= 0 or job.hung or job.state == "RUNNING")
        ):
            # Still hurting after a fix (a second faulty node, storage still out), or the loop restarts onto a
            # faulty node: the alerts are still there for the person.
            person_at = world.now + person_delay(p, world.now)
    return summary(world, p, horizon, wrong=0, handed=0, held=0)


def summary(world: World, p: Params, horizon: float, *, wrong: int, handed: int, held: int) -> dict[str, Any]:
    return {
        "ettr": world.job.progress / horizon,
        "restarts": world.job.restarts,
        "restarts_onto_faulty_node": world.recrashes,
        "wrong_actions": wrong,
        "handed_to_person": handed,
        "nodes_held": held,
    }


# --- Nightshift: the real engine against the simulated scheduler ---------------------------------------------


class SimSlurm:
    """The Slurm host at Nightshift's CommandRunner seam: the commands the Slurm client sends, on the world."""

    def __init__(self, world: World):
        self.world = world
        self.commands: list[tuple[str, ...]] = []
        # A node taken out or excluded while healthy, a requeue of a job training at full speed; and of those,
        # the healthy nodes put on the job's exclusion list.
        self.wrong = 0
        self.healthy_excluded = 0

    def _healthy(self, name: str) -> bool:
        node = self.world.nodes.get(name)
        return node is not None and not (node.fault or node.slow or node.down_until > self.world.now)

    def run(self, argv: Any, timeout: float | None = None) -> CommandResult:
        argv = tuple(argv)
        self.commands.append(argv)
        out, code = self._answer(argv)
        return CommandResult(
            argv, " ".join(argv), code, out if code == 0 else "", "" if code == 0 else out, 0.01
        )

    def run_all(self, argvs: Sequence[Sequence[str]], timeout: float | None = None) -> list[CommandResult]:
        return [self.run(argv) for argv in argvs]

    def close(self) -> None:
        pass

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
            case ("squeue", *_):
                return "1000 1000\n", 0
            case ("scontrol", "requeue", _):
                if job.state == "PENDING":
                    return f"scontrol: error: Job {JOB} is pending execution", 1
                if not world.hurting() and not any(world.nodes[n].fault for n in job.allocation):
                    self.wrong += 1
                job.requeue(world.now)
                return "", 0
            case ("scontrol", "update", jobid, exc, *_) if jobid.startswith("JobId="):
                excluded = {n for n in exc.removeprefix("ExcNodeList=").split(",") if n}
                healthy = sum(1 for n in excluded - job.exc if self._healthy(n))
                self.wrong += healthy
                self.healthy_excluded += healthy
                job.exc = excluded
                return "", 0
            case ("scontrol", "show", "hostnames", hostlist):
                return "\n".join(hostlist.split(",")) + "\n", 0
            case ("setpriv", *rest) if "tail" in rest:
                return job.log + "\n", 0
            case ("tail", *_):
                return job.log + "\n", 0
            case ("scontrol", "show", "node", "-o", name):
                return self._show(name)
            case ("scontrol", "show", "partition", "-o", part):
                return f"PartitionName={part} Nodes={','.join(world.names)} State=UP\n", 0
            case ("scontrol", "update", node_arg, "State=DRAIN", reason):
                name = node_arg.removeprefix("NodeName=")
                self.wrong += not node_is_drained(world, name) and self._healthy(name)
                world.nodes[name].take_out(world.now, reason.removeprefix("Reason="))
                return "", 0
            case ("scontrol", "update", node_arg, "State=RESUME"):
                node = world.nodes[node_arg.removeprefix("NodeName=")]
                node.drained = node.down_after_reboot = False
                node.drain_reason = ""
                return "", 0
            case ("scontrol", "reboot", "ASAP", "nextstate=DOWN", reason, name):
                self.wrong += self._healthy(name)
                node = world.nodes[name]
                node.reboot_until = world.now + world.p.reboot_minutes * 60
                node.down_after_reboot = True
                node.take_out(world.now, reason.removeprefix("reason="))
                if node.fault and world.rng.random() < world.p.reboot_fixes:
                    node.fault = None
                node.slow = False
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
        if node.reboot_until > world.now:
            flags.append("REBOOT_REQUESTED")
        state = "+".join([base, *flags])
        reason = f" Reason={node.drain_reason} [root@2026-01-05T00:00:00]" if node.drain_reason else ""
        return f"NodeName={name} Arch=x86_64 State={state} Partitions=gpu{reason}\n", 0


def node_is_drained(world: World, name: str) -> bool:
    return world.nodes[name].drained


class SimNodeShell:
    """One node's shell at the validation's seam (app/clients/node_check.py: start detached, probe, stop): the
    check (``dcgmi diag -r 2``) takes ``VALIDATION_SECONDS`` and passes when the node has no fault left."""

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
            self.started, self.passes = self.world.now, node.fault is None and not node.slow
            out = "started\n"
        elif "echo stopped" in script:
            self.started, out = None, "stopped\n"
        elif self.started is None:
            out = "absent\n"
        else:
            elapsed = int(self.world.now - self.started)
            if elapsed < VALIDATION_SECONDS:
                out = f"running {elapsed}\n"
            else:
                verdict = "Pass" if self.passes else "Fail"
                out = f"done {elapsed} {0 if self.passes else 1}\nDiagnostic Result: {verdict}\n"
        return CommandResult(tuple(argv), " ".join(argv), 0, out, "", 0.1)

    def close(self) -> None:
        pass


class SimPrometheus:
    """Answers the engine's queries from the world: a verification (``training_step_total``) has a sample while
    the job makes progress; a re-check has one while an alert it names fires."""

    name = "prometheus"

    def __init__(self, world: World, firing: dict[tuple[str, str], dict[str, Any]]):
        self.world, self.firing = world, firing

    def query(self, expr: str, at: datetime | None = None) -> list[Sample]:
        if "training_step_total" in expr or "training_samples_total" in expr:
            job, sample = self.world.job, [Sample({"slurm_job_id": JOB}, 1.0, 0.0)]
            progressing = job.speed(self.world.nodes) > 0
            if "changes(" in expr and "== 0" in expr:  # a hang's re-check: exported, not stepping
                return sample if job.state == "RUNNING" and job.hung else []
            return sample if progressing else []
        names = set(re.findall(r'alertname="([A-Za-z]+)"', expr)) or set(re.findall(r"\b(DCGM_\w+)", expr))
        host = re.search(r'Hostname="([^"]+)"', expr)
        for (name, _), alert in self.firing.items():
            labels = alert["labels"]
            if (name in names or not names) and (host is None or labels.get("Hostname") == host.group(1)):
                return [Sample(dict(labels), 1.0, 0.0)]
        return []

    def ready(self) -> bool:
        return True


class Pager:
    """The notification webhook: counts what reached people."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def post_json(self, url: str, body: dict[str, Any], headers: Any = None) -> int:
        self.bodies.append(body)
        return 200


def payload(alerts: Sequence[dict[str, Any]], status: str, at: float) -> str:
    stamp = (START + timedelta(seconds=at)).isoformat().replace("+00:00", "Z")
    items = []
    for a in alerts:
        labels = {"alertname": a["alertname"], "severity": "critical", **a["labels"]}
        items.append(
            {
                "status": status,
                "labels": labels,
                "annotations": {"summary": a["alertname"]},
                "startsAt": (START + timedelta(seconds=a["at"])).isoformat().replace("+00:00", "Z"),
                "endsAt": stamp if status == "resolved" else "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": f"{abs(hash((a['alertname'], json.dumps(a['labels'], sort_keys=True)))):016x}",
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


def run_nightshift(p: Params, faults: Sequence[Fault], seed: int, workdir: Path) -> dict[str, Any]:
    world = World(p, random.Random(seed))
    firing: dict[tuple[str, str], dict[str, Any]] = {}
    slurm_host = SimSlurm(world)
    pager = Pager()
    registry = default_registry()
    settings = Settings(data_dir=str(workdir))
    settings.notify.webhook_url = "http://people.example/hook"
    settings.slurm.host = "slurm-login"
    clients = Clients(
        settings,
        slurm=SlurmClient(slurm_host),
        prometheus=SimPrometheus(world, firing),
        http=pager,
        **{f"node:{name}": SimNodeShell(world, name) for name in world.names},
    )
    clock = Clock(world)
    grants = [a.name for a in registry if a.name.startswith(("slurm.", "checkpoint.")) and not a.read_only]
    engine = build_engine(
        settings,
        clock=clock,
        clients=clients,
        registry=registry,
        playbooks=load_playbooks([REPO / "playbooks"], registry),
        permissions=Permissions(Grant(action=name) for name in grants),
    )
    job, horizon = world.job, p.days * 86400
    pending: list[dict[str, Any]] = []  # alerts raised, not yet delivered
    person_at, chat_at, busy_until, handed, seen = -1.0, -1.0, -1.0, 0, 0
    queue = [*faults, Fault(horizon, "end")]
    while world.now < horizon:
        due = [
            queue[0].at,
            horizon,
            person_at,
            chat_at,
            world.host_requeue_due(),
            *(a["at"] for a in pending),
        ]
        target = min(t for t in due if t >= 0)
        if firing or pending or world.now < busy_until or world.hurting():
            target = min(target, world.now + TICK)
        world.advance(max(world.now, target))
        if world.now >= horizon:
            break
        if 0 <= world.host_requeue_due() <= world.now:
            job.requeue(world.now)
        for name in world.repaired_by_hand:
            # The person who repaired a node Nightshift holds releases it (POST /api/v1/nodes/<node>/release).
            with contextlib.suppress(LookupError, ValueError):
                engine.repairs.release(name, by="person", note="repaired by hand")
        world.repaired_by_hand.clear()
        if queue[0].at <= world.now:
            raised = apply_fault(world, queue.pop(0))
            pending += raised
            if raised and chat_at < 0:
                # The people channel shows every alert (alerts/alertmanager.yml): a person looks after their
                # usual delay plus half an hour's trust in Nightshift, and acts only if the job still hurts.
                chat_at = min(a["at"] for a in raised) + person_delay(p, world.now) + 1800
        ready = [a for a in pending if a["at"] <= world.now]
        if ready:
            pending = [a for a in pending if a["at"] > world.now]
            for a in ready:
                firing[(a["alertname"], json.dumps(a["labels"], sort_keys=True))] = a
            engine.ingest(parse_notification(payload(ready, "firing", world.now)))
            busy_until = world.now + 2 * 3600  # verifications, backoffs and node repairs run meanwhile
        engine.run_until_idle(limit=500)
        if (
            firing
            and job.state == "RUNNING"
            and job.speed(world.nodes) >= 1.0
            and world.now > job.loading_until + 120
        ):
            done = list(firing.values())
            firing.clear()
            engine.ingest(parse_notification(payload(done, "resolved", world.now)))
            engine.run_until_idle(limit=500)
        pages = [b for b in pager.bodies[seen:] if _needs_person(b)]
        seen = len(pager.bodies)
        if pages and person_at < 0 and world.hurting():
            handed += 1
            person_at = world.now + person_delay(p, world.now)
        for moment in ("person", "chat"):
            at = person_at if moment == "person" else chat_at
            if 0 <= at <= world.now:
                if moment == "person":
                    person_at = -1.0
                else:
                    chat_at = -1.0
                if world.needs_fix():
                    world.person_fix()
    result = summary(world, p, horizon, wrong=slurm_host.wrong, handed=handed, held=engine.repairs.held())
    result["incidents"] = len(engine.incidents(limit=1000))
    result["pages"] = sum(1 for b in pager.bodies if _needs_person(b))
    result["healthy_nodes_excluded"] = slurm_host.healthy_excluded
    result["exclusion_list_at_end"] = len(job.exc)
    return result


def _needs_person(body: dict[str, Any]) -> bool:
    data = body.get("nightshift", {})
    return data.get("outcome") in {
        "needs_human",
        "failed",
        "advisory",
        "credential_error",
        "unverified",
    } or bool(data.get("unmatched"))


# --- the run -----------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ettr.json")
    args = parser.parse_args(argv)
    p = Params(days=args.days)
    results: dict[str, list[dict[str, Any]]] = {"nightshift": [], "person": [], "naive": []}
    started = time.monotonic()
    for seed in range(args.seeds):
        faults = draw_faults(p, random.Random(seed))
        copies = [[Fault(f.at, f.kind, f.node, f.gpu) for f in faults] for _ in range(3)]
        results["person"].append(run_baseline(p, copies[0], seed, naive=False))
        results["naive"].append(run_baseline(p, copies[1], seed, naive=True))
        workdir = Path(tempfile.mkdtemp(prefix="ettr-"))
        try:
            results["nightshift"].append(run_nightshift(p, copies[2], seed, workdir))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(
            f"seed {seed}: {len(faults)} faults "
            + ", ".join(f"{k} {v[-1]['ettr']:.4f}" for k, v in results.items()),
            flush=True,
        )
    table = {name: aggregate(runs) for name, runs in results.items()}
    report = {
        "params": asdict(p),
        "seeds": args.seeds,
        "seconds": round(time.monotonic() - started, 1),
        "interruptions_per_day": p.interruptions_per_day,
        "table": table,
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(table, args.seeds, p))
    return 0


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ettrs = sorted(r["ettr"] for r in runs)
    keys = (
        "restarts",
        "restarts_onto_faulty_node",
        "wrong_actions",
        "healthy_nodes_excluded",
        "handed_to_person",
        "nodes_held",
    )
    return {
        "ettr_mean": sum(ettrs) / len(ettrs),
        "ettr_min": ettrs[0],
        "ettr_max": ettrs[-1],
        **{f"{k}_per_month": sum(r.get(k, 0) for r in runs) / len(runs) for k in keys},
    }


def markdown(table: dict[str, dict[str, Any]], seeds: int, p: Params) -> str:
    lines = [
        f"ETTR over {p.days:g} simulated days, {p.nodes} nodes x {p.gpus_per_node} GPUs, {seeds} seeds (mean, min-max)",
        "",
        "| policy | ETTR | restarts | restarts onto a faulty node | wrong actions (healthy nodes excluded) "
        "| handed to a person | nodes held at the end |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['ettr_mean']:.4f} ({row['ettr_min']:.4f}-{row['ettr_max']:.4f}) "
            f"| {row['restarts_per_month']:.1f} | {row['restarts_onto_faulty_node_per_month']:.1f} "
            f"| {row['wrong_actions_per_month']:.1f} ({row['healthy_nodes_excluded_per_month']:.1f}) "
            f"| {row['handed_to_person_per_month']:.1f} "
            f"| {row['nodes_held_per_month']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
