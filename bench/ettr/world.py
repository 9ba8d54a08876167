"""The physical world of the benchmark: the nodes, the training job, what a fault does to them, and the alerts
the shipped rules raise about it (pure apart from the random draws of ``rng``; time in seconds since START).

The job trains at full speed on ``nodes`` nodes (``spares`` more in the partition), at the pace of its slowest
node; it writes a checkpoint every ``checkpoint_interval`` seconds of running, which stalls it for
``checkpoint_seconds``; a crash loses the work since the last checkpoint; a restart spends ``restart_minutes``
(queue, start-up, loading the checkpoint) before it trains again. Slurm reuses the allocation: a restarted job
lands on the same nodes unless they are excluded, drained or down. What each kind of fault does is
:data:`bench.ettr.causes.KINDS`'s effect, played here; the alerts are those :mod:`bench.ettr.detection` found the
rules raise for it, delivered after their delay (plus Alertmanager's group_wait) if the condition that raised them
still holds then (:data:`STILL_FIRING`).

Lost training time is charged to a fault class: the one whose effect the job suffers (stalled, down, slowed,
restarting, its work since the checkpoint lost), or ``checkpointing`` for the checkpoints' own stalls.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bench.ettr import signals
from bench.ettr.causes import KINDS, Fault
from bench.ettr.detection import Detection
from sim import gpus

START = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)  # a Monday, midnight
JOB, TRAIN_JOB = signals.JOB_ID, signals.TRAIN_JOB
GROUP_WAIT = 10.0  # alerts/alertmanager.yml: group_wait
IB_RETRY = float(signals.IB_RETRY_SECONDS)
NAN_AGAIN_SECONDS = 300.0  # a job resumed from a corrupted checkpoint shows the NaN again this soon (assumed)
HISTORY_SECONDS = (
    7200.0  # how far back the world remembers the job's progress (Prometheus's answers for the past)
)
HEALTHY = "none (a healthy job restarted)"  # the class of time lost while no fault ails the job


@dataclass(frozen=True)
class Physics:
    """The job and its cluster: every figure a stated parameter (sources in :mod:`bench.ettr.causes`)."""

    days: float = 30.0
    nodes: int = 128
    gpus_per_node: int = 8
    spares: int = 8
    checkpoint_seconds: float = 5.0  # the stall of one checkpoint (assumed: asynchronous saving)
    checkpoint_interval: float = 1800.0  # seconds of running between checkpoints
    restart_minutes: float = 10.0  # requeue to training again: queue, start-up, loading the checkpoint
    watchdog_minutes: float = 10.0  # PyTorch ProcessGroupNCCL's default timeout
    recrash_minutes: float = 3.0  # a restart onto a node still at fault fails again this soon
    reboot_fixes: float = 0.5  # share of GPU faults a reboot (the repair's first step) clears (assumed)
    reboot_minutes: float = 15.0
    validation_seconds: float = 600.0  # dcgmi diag -r 2 on 8 GPUs (assumed)
    manual_repair_hours: float = 24.0  # a node out of service (drained, held, dead) is repaired by hand
    slurm_node_timeout_minutes: float = 5.0  # SlurmdTimeout: a dead node is DOWN and its job requeued
    queue_seconds: float = 60.0  # a requeued job waits this long before it starts

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class Node:
    """One node's truth. Any change marks it in ``touched`` (the world's set of nodes to watch), so the world
    scans only the nodes something happened to, not all of a 2,000-node cluster at every event."""

    name: str = ""
    touched: set[str] | None = field(default=None, repr=False, compare=False)
    fault: str | None = None  # a node-bound fault present (a kind name)
    speed: float = 1.0  # below 1: a straggler
    slow_until: float = math.inf
    slow_kind: str = ""
    warned: str = ""  # a warning signal whose fault has not struck yet
    down_until: float = -1.0  # host down: Slurm has it DOWN
    drained: bool = False
    drain_reason: str = ""
    reboot_until: float = -1.0
    down_after_reboot: bool = False  # came back DOWN (nextstate=DOWN) until resumed
    drained_at: float = -1.0

    def __setattr__(self, key: str, value: object) -> None:
        object.__setattr__(self, key, value)
        touched = self.__dict__.get("touched")
        if touched is not None and key not in ("name", "touched"):
            touched.add(self.__dict__["name"])

    def take_out(self, at: float, reason: str) -> None:
        if not self.drained:
            self.drained_at = at
        self.drained, self.drain_reason = True, reason

    def healthy(self, now: float) -> bool:
        return not (self.fault or self.speed < 1.0 or self.warned or self.down_until > now)

    def pristine(self, now: float) -> bool:
        """Nothing about it to watch any more."""
        return (
            self.healthy(now)
            and not self.drained
            and self.reboot_until < now
            and not self.down_after_reboot
            and self.down_until < now
        )


@dataclass
class Alert:
    """An alert raised about the world, delivered at ``at`` if ``still(world)`` holds then."""

    alertname: str
    labels: dict[str, str]
    at: float
    still: Callable[[World], bool]


@dataclass
class Job:
    """Progress accounting: progress is ideal-training seconds at full speed."""

    p: Physics
    state: str = "RUNNING"  # RUNNING | PENDING | FAILED
    run: int = 0  # which run of the job (a restart starts a new one)
    stalled: bool = False  # not stepping (stuck in a collective, or hung)
    exit_at: float = -1.0  # a stalled run exits then (its watchdog), or -1: it never does (a silent hang)
    nan: bool = False  # the loss is NaN: steps are worthless
    tainted_at: float = -1.0  # progress at which silent data corruption began in this run (-1: none)
    loading_until: float = 0.0
    start_at: float = -1.0
    allocation: list[str] = field(default_factory=list)
    exc: set[str] = field(default_factory=set)
    progress: float = 0.0
    checkpoint: float = 0.0
    checkpoint_tainted: bool = False
    clean_checkpoint: float = 0.0  # the newest checkpoint written before any corruption
    checkpoint_time: float = 0.0  # wall time of the newest checkpoint
    next_checkpoint: float = 0.0
    checkpoint_requested: bool = False
    clock: float = 0.0
    restarts: int = 0
    log: str = ""
    recrash_at: float = -1.0
    recrash_kind: str = ""
    nan_at: float = -1.0
    crashed_at: float = -1.0
    pending_since: float = -1.0
    run_started: float = 0.0

    def age(self, now: float) -> float:
        return now - self.run_started


class World:
    """The cluster's truth; one per policy run."""

    def __init__(self, p: Physics, detection: Detection, rng: random.Random, straggler_speed: float = 0.6):
        self.p, self.detection, self.rng = p, detection, rng
        self.straggler_speed = straggler_speed
        self.names = [
            f"gpu{i:04d}" if p.nodes + p.spares > 999 else f"gpu{i:03d}"
            for i in range(1, p.nodes + p.spares + 1)
        ]
        self.touched: set[str] = set()
        self.nodes = {n: Node(name=n, touched=self.touched) for n in self.names}
        self.touched.clear()  # building them is no change
        self.replicate_peers = False  # raise a peer's alert for every peer (the engine sees each), or once
        self.job = Job(p, allocation=self.names[: p.nodes], next_checkpoint=p.checkpoint_interval)
        self.in_job = set(self.job.allocation)
        self.now = 0.0
        self.outbox: list[Alert] = []
        self.lost: dict[str, float] = {}  # fault class → ideal-training seconds lost
        self.blame = HEALTHY
        self.trouble: tuple[str, str, float] | None = None  # (kind, node, when) of what ails the current run
        self.recrashes = 0  # restarts that landed on a node still at fault
        self.wrong = 0  # healthy nodes taken out or excluded, requeues of a healthy job
        self.outage_until = -1.0
        self.history: deque[tuple[float, bool, float]] = deque()
        self.reboot_asap: dict[str, str] = {}  # node → reason: rebooted once no running job holds it
        self.slurm_requeue_at = -1.0
        self.repaired_by_hand: list[str] = []  # returned by the technicians, not yet told to Nightshift
        self.on_event: list[Callable[[str, str, Fault | None], None]] = []  # the oracle's eyes

    # --- time ------------------------------------------------------------------------------------------------

    def speed(self) -> float:
        job = self.job
        if job.state != "RUNNING" or job.stalled or job.nan or job.clock < job.loading_until:
            return 0.0
        return min((self.nodes[n].speed for n in self.touched if n in self.in_job), default=1.0)

    def _charge(self, seconds: float, cause: str) -> None:
        if seconds > 0:
            self.lost[cause] = self.lost.get(cause, 0.0) + seconds

    def _progress(self, to: float) -> None:
        """Train from the job's clock to ``to`` (no event in between): checkpoints and their stalls."""
        job, p = self.job, self.p
        while job.clock < to:
            speed = self.speed()
            if job.state == "RUNNING" and not job.stalled and job.clock < job.loading_until:
                end = min(to, job.loading_until)
                self._charge(end - job.clock, self.blame)
                job.clock = end
                continue
            if speed == 0:
                self._charge(to - job.clock, self.blame)
                job.clock = to
                return
            due = job.clock if job.checkpoint_requested else job.next_checkpoint
            end = min(to, due)
            job.progress += speed * (end - job.clock)
            self._charge((1 - speed) * (end - job.clock), self.blame)
            job.clock = end
            if job.clock >= due:
                # The stall may run past ``to``: the job's clock runs ahead, and the next call starts from it.
                self._write_checkpoint()
                self._charge(p.checkpoint_seconds, "checkpointing")
                job.clock += p.checkpoint_seconds

    def _write_checkpoint(self) -> None:
        job = self.job
        job.checkpoint = job.progress
        job.checkpoint_time = job.clock + self.p.checkpoint_seconds  # the moment it is written
        job.checkpoint_tainted = job.tainted_at >= 0
        if not job.checkpoint_tainted:
            job.clean_checkpoint = job.progress
        job.next_checkpoint = job.clock + self.p.checkpoint_interval
        job.checkpoint_requested = False

    def next_event(self) -> float:
        job = self.job
        times = [self.slurm_requeue_at]
        if job.state == "RUNNING":
            times += [job.recrash_at, job.exit_at, job.nan_at]
        elif job.state == "PENDING":
            times.append(job.start_at)
        for node in (self.nodes[n] for n in self.touched):
            times += [node.reboot_until, node.slow_until if node.speed < 1 else -1.0]
            if node.drained:
                times.append(node.drained_at + self.p.manual_repair_hours * 3600)
            if node.down_until > self.now and node.down_until < math.inf:
                times.append(node.down_until)
        return min((t for t in times if t >= self.now and t < math.inf), default=math.inf)

    def advance(self, to: float) -> None:
        """Move time to ``to``, playing the world's own events on the way."""
        stuck = 0
        while True:
            step = min(self.next_event(), to)
            stuck = stuck + 1 if step <= self.now else 0
            if stuck > 1000:
                raise RuntimeError(f"the world's events do not move past t={self.now}")
            self._progress(step)
            self.now = step
            self._events()
            self._remember()
            if step >= to:
                return

    def _remember(self) -> None:
        """Keep the last hours of (time, whether the job's processes run, progress): the step counter Prometheus
        would answer for a past instant."""
        job, history = self.job, self.history
        running = job.state == "RUNNING" and not (job.exit_at >= 0 and job.exit_at <= self.now)
        entry = (self.now, running, job.progress)
        if history and history[-1][0] == self.now:
            history[-1] = entry
        else:
            history.append(entry)
        while len(history) > 2 and history[1][0] < self.now - HISTORY_SECONDS:
            history.popleft()

    def progress_at(self, at: float) -> float | None:
        """The job's progress (seconds of training) at ``at``, or None when no process of it ran then."""
        before = [entry for entry in self.history if entry[0] <= at]
        if not before:
            return None
        _, running, progress = before[-1]
        return progress if running else None

    def _events(self) -> None:
        job, now, p = self.job, self.now, self.p
        if (
            self.blame != HEALTHY
            and job.state == "RUNNING"
            and job.clock >= job.loading_until
            and not (job.stalled or job.nan or job.tainted_at >= 0 or self.speed() < 1 or self.culprits())
        ):
            self.blame = HEALTHY  # recovered: what is lost from now on is not that fault's
        for name in sorted(self.touched):
            node = self.nodes[name]
            if 0 <= node.reboot_until <= now:
                node.reboot_until = -1.0
            if node.fault and KINDS[node.fault].effect == "node_down" and node.down_until <= now:
                node.fault = None  # the technicians replaced the part while the host was down
            if node.speed < 1 and node.slow_until <= now:
                node.speed, node.slow_until, node.slow_kind = 1.0, math.inf, ""
            if node.drained and now >= node.drained_at + p.manual_repair_hours * 3600:
                node.fault, node.speed, node.warned = None, 1.0, ""
                node.drained, node.down_after_reboot, node.drain_reason = False, False, ""
                self.repaired_by_hand.append(name)
            if node.pristine(now):
                self.touched.discard(name)
        for name, reason in list(self.reboot_asap.items()):
            if not (job.state == "RUNNING" and name in self.in_job):
                del self.reboot_asap[name]
                self._reboot(name, reason)
        if 0 <= self.slurm_requeue_at <= now:
            self.slurm_requeue_at = -1.0
            if job.state != "PENDING":
                self.requeue(rollback=False)  # Slurm's own requeue (--requeue) when a node of the job died
        if 0 <= job.exit_at <= now and job.state == "RUNNING":
            self._crash_now()
        if 0 <= job.nan_at <= now and job.state == "RUNNING":
            job.nan_at, job.nan = -1.0, True
            culprit = self._sdc_node() or job.allocation[0]
            self.blame = "silent_data_corruption"
            self.trouble = ("silent_data_corruption", culprit, now)
            self.raise_alerts("silent_data_corruption", culprit, 0)
        if job.state == "PENDING" and 0 <= job.start_at <= now:
            self._start()
        elif 0 <= job.recrash_at <= now and job.state == "RUNNING":
            self.recrashes += 1
            kind = job.recrash_kind
            job.recrash_at = -1.0
            bad = self._faulty_in_job() or job.allocation[0]
            self.blame = kind
            self.trouble = (kind, bad, self.now)
            self._stall(kind)
            self.raise_alerts(kind, bad, 0)

    # --- the job -----------------------------------------------------------------------------------------------

    def usable(self, name: str) -> bool:
        if name not in self.touched:
            return True
        node = self.nodes[name]
        return (
            not node.drained
            and node.down_until <= self.now
            and node.reboot_until <= self.now
            and not node.down_after_reboot
        )

    def _start(self) -> None:
        job, p = self.job, self.p
        previous = [n for n in job.allocation if self.usable(n) and n not in job.exc]
        kept = set(previous)
        others = [n for n in self.names if n not in kept and self.usable(n) and n not in job.exc]
        allocation = (previous + others)[: p.nodes]
        if len(allocation) < p.nodes:
            job.start_at = (
                self.now + 300
            )  # not enough nodes outside its exclusion list: it waits in the queue
            return
        job.allocation, job.state, job.start_at = allocation, "RUNNING", -1.0
        self.in_job = set(allocation)
        job.run += 1
        job.run_started = self.now
        self.trouble = None
        job.stalled, job.exit_at, job.nan, job.nan_at, job.tainted_at = False, -1.0, False, -1.0, -1.0
        job.loading_until = self.now + p.restart_minutes * 60 - p.queue_seconds
        job.clock = self.now
        job.next_checkpoint = job.loading_until + p.checkpoint_interval
        if job.checkpoint_tainted:
            job.nan_at = job.loading_until + NAN_AGAIN_SECONDS  # resumed from a corrupted checkpoint
            job.tainted_at = job.progress
        bad = self._faulty_in_job()
        if self.outage_until > self.now:
            job.recrash_at, job.recrash_kind = job.loading_until + 30, "dependency_outage"
        elif bad:
            kind = self.nodes[bad].fault or ""
            if KINDS[kind].effect == "nan":
                job.tainted_at = job.progress
                job.nan_at = job.loading_until + self.rng.uniform(0, 3600)
            elif KINDS[kind].effect != "slow":
                job.recrash_at, job.recrash_kind = self.now + p.recrash_minutes * 60, kind
        for name in sorted(self.touched & self.in_job):
            node = self.nodes[name]
            if node.speed < 1:
                self.raise_alerts(node.slow_kind or "thermal_straggler", name, 0)

    def _faulty_in_job(self) -> str | None:
        return next((n for n in sorted(self.touched) if n in self.in_job and self.nodes[n].fault), None)

    def _sdc_node(self) -> str | None:
        return next(
            (
                n
                for n in sorted(self.touched)
                if n in self.in_job and self.nodes[n].fault == "silent_data_corruption"
            ),
            None,
        )

    def _stall(self, kind: str) -> None:
        """The job stops stepping now because of ``kind``: the work since the checkpoint is lost; it exits when
        the watchdog (or NCCL's IB error) takes the ranks down, unless someone restarts it first."""
        job, effect = self.job, KINDS[kind].effect
        if job.state != "RUNNING":
            return
        self._lose_since_checkpoint(kind)
        job.stalled = True
        job.recrash_at = -1.0
        if effect == "hang":
            job.exit_at = -1.0
        elif effect == "crash":
            job.exit_at = self.now + IB_RETRY
        elif effect == "outage":
            job.exit_at = self.now
        else:
            job.exit_at = self.now + self.p.watchdog_minutes * 60

    def _lose_since_checkpoint(self, cause: str) -> None:
        job = self.job
        self._charge(job.progress - job.checkpoint, cause)
        job.progress = job.checkpoint

    def _crash_now(self) -> None:
        job = self.job
        self._lose_since_checkpoint(self.blame)
        job.state, job.stalled, job.exit_at, job.crashed_at = "FAILED", False, -1.0, self.now
        job.recrash_at = job.nan_at = -1.0

    def requeue(self, rollback: bool, delay: float | None = None) -> None:
        """Requeue the job (it restarts from its newest checkpoint, or the newest clean one with ``rollback``)."""
        job = self.job
        self._lose_since_checkpoint(self.blame)
        if rollback and job.checkpoint_tainted:
            self._charge(job.checkpoint - job.clean_checkpoint, self.blame)
            job.progress = job.checkpoint = job.clean_checkpoint
            job.checkpoint_tainted = False
        job.pending_since = self.now
        job.state, job.stalled, job.exit_at, job.nan = "PENDING", False, -1.0, False
        job.start_at = self.now + (self.p.queue_seconds if delay is None else delay)
        job.recrash_at, job.nan_at = -1.0, -1.0
        job.restarts += 1

    def reboot(self, name: str, reason: str) -> None:
        """``scontrol reboot ASAP nextstate=DOWN``: drained at once, rebooted once the job no longer runs there."""
        self.nodes[name].take_out(self.now, reason)
        if self.job.state == "RUNNING" and name in self.in_job:
            self.reboot_asap[name] = reason
        else:
            self._reboot(name, reason)

    def _reboot(self, name: str, reason: str) -> None:
        node = self.nodes[name]
        node.reboot_until = self.now + self.p.reboot_minutes * 60
        node.down_after_reboot = True
        node.take_out(self.now, reason)
        if node.fault and self.rng.random() < self.p.reboot_fixes:
            node.fault = None
        node.speed, node.warned = 1.0, ""  # a reboot resets throttling and applies pending row remaps

    def request_checkpoint(self) -> bool:
        """Ask the running job to checkpoint (the progress library's request): it does at its next step (with the
        checkpoint's stall), unless it is not stepping (stuck, or still loading)."""
        job = self.job
        if job.state != "RUNNING" or job.stalled or job.nan:
            return False
        job.checkpoint_requested = True
        return True

    def checkpoint_now(self) -> None:
        """Checkpoint the running job at once (the oracle's and the planned maintenance's): the work so far is
        saved; the job stalls for the checkpoint."""
        job = self.job
        if job.state != "RUNNING" or job.stalled or job.nan or job.clock < job.loading_until:
            return
        self._write_checkpoint()
        self._charge(self.p.checkpoint_seconds, "checkpointing")
        job.clock = self.now + self.p.checkpoint_seconds

    def hurting(self) -> bool:
        """The job is down, stuck, worthless or slowed (what a person acts on)."""
        job = self.job
        if job.state == "FAILED" or job.stalled or job.nan:
            return True
        if job.state == "PENDING" and self.now > job.pending_since + 1800:
            return True  # queued for half an hour: not enough nodes outside its exclusion list
        return job.state == "RUNNING" and self.now > job.loading_until and self.speed() < 1.0

    def culprits(self) -> list[str]:
        """The job's nodes at fault (slow, warned, down) that nobody has taken out yet, in name order."""
        nodes = self.nodes
        return sorted(
            n
            for n in self.touched
            if n in self.in_job and not nodes[n].healthy(self.now) and not nodes[n].drained
        )

    def needs_fix(self) -> bool:
        return self.hurting() or bool(self.culprits())

    # --- faults --------------------------------------------------------------------------------------------

    def warn(self, fault: Fault) -> None:
        """``fault``'s warning signal starts on a node of the job (the fault strikes ``fault.lead`` later); what
        is done about it on a healthy job (a swap) is charged to the fault it warns of."""
        fault.node = self._pick(fault)
        if not self.hurting():
            self.blame = fault.kind
        self.nodes[fault.node].warned = KINDS[fault.kind].warning
        self.raise_alerts(f"warn:{KINDS[fault.kind].warning}", fault.node, fault.gpu)
        for see in self.on_event:
            see("warning", fault.node, fault)

    def strike(self, fault: Fault) -> None:
        """Make ``fault`` true now (and tell whoever watches the truth)."""
        if self._strike(fault):
            for see in self.on_event:
                see("strike", fault.node, fault)

    def _pick(self, fault: Fault) -> str:
        allocation = self.job.allocation
        return allocation[min(int(fault.pick * len(allocation)), len(allocation) - 1)]

    def _strike(self, fault: Fault) -> bool:
        job, kind = self.job, KINDS[fault.kind]
        if not fault.node:
            fault.node = self._pick(fault)
        node = self.nodes[fault.node]
        if fault.warned and not node.warned:
            return False  # the node was rebooted or repaired after its warning: the repair caught the fault
        node.warned = ""
        in_job = job.state == "RUNNING" and fault.node in self.in_job
        if kind.node_bound:
            node.fault = fault.kind
        if kind.effect == "planned":
            if job.state == "RUNNING":
                self.checkpoint_now()
                self.blame = fault.kind
                self.requeue(rollback=False)
            return False
        if kind.effect == "outage":
            self.outage_until = self.now + fault.length
        if kind.effect == "node_down":
            node.down_until = self.now + (fault.length if fault.length else self.p.manual_repair_hours * 3600)
            if kind.node_bound:
                node.fault = fault.kind
        if kind.effect == "slow":
            node.speed = min(node.speed, self.straggler_speed)
            node.slow_kind = fault.kind
            node.slow_until = self.now + fault.length if fault.length else math.inf
        job_wide = kind.effect in ("outage", "hang") or fault.kind in ("nccl_watchdog", "network_flap")
        if not (in_job or (job_wide and job.state == "RUNNING")):
            return True
        self.blame = fault.kind
        self.trouble = (fault.kind, fault.node, self.now)
        if kind.effect == "nan":
            job.tainted_at = job.progress
            job.nan_at = self.now + fault.length
            return True
        if kind.effect != "slow":
            self._stall(fault.kind)
            if kind.effect == "node_down":
                self.slurm_requeue_at = self.now + self.p.slurm_node_timeout_minutes * 60
        self.raise_alerts(fault.kind, fault.node, fault.gpu)
        return True

    # --- alerts ------------------------------------------------------------------------------------------------

    def raise_alerts(self, kind: str, culprit: str, gpu: int) -> None:
        """Queue the alerts the rules raise for ``kind`` on ``culprit`` now (see :mod:`bench.ettr.detection`)."""
        job = self.job
        run = job.run
        peers = [n for n in job.allocation if n != culprit]
        if not self.replicate_peers:
            peers = peers[:1]
        for detected in self.detection.of(kind, job.age(self.now)):
            hosts = {"culprit": [culprit], "peer": peers, "job": [""]}[detected.role]
            for host in hosts:
                labels = _instantiate(detected.label_dict(), culprit, host, gpu)
                still = _still(detected.alertname, run, host or culprit, kind)
                self.outbox.append(
                    Alert(detected.alertname, labels, self.now + detected.delay + GROUP_WAIT, still)
                )

    def due_alerts(self) -> list[Alert]:
        """The alerts due now whose condition still holds (the rest never fire)."""
        ready = [a for a in self.outbox if a.at <= self.now]
        self.outbox = [a for a in self.outbox if a.at > self.now]
        return [a for a in ready if a.still(self)]

    def next_alert(self) -> float:
        return min((a.at for a in self.outbox), default=math.inf)


def _instantiate(labels: dict[str, str], culprit: str, host: str, gpu: int) -> dict[str, str]:
    out = {}
    for key, value in labels.items():
        value = value.replace(signals.CULPRIT, culprit)
        if host:
            value = value.replace(signals.PEERS[0], host)
        out[key] = value
    if out.get("Hostname") == culprit and "gpu" in out:
        out["gpu"], out["UUID"] = str(gpu), gpus.gpu_uuid(culprit, gpu)
        out["pci_bus_id"], out["device"] = gpus.pci_bus_id(gpu), f"nvidia{gpu}"
    return out


def _still(alertname: str, run: int, node: str, kind: str) -> Callable[[World], bool]:
    """Whether the condition behind ``alertname`` (raised during the job's ``run``, about ``node``) still holds
    when it is due: the rules would not fire once it stopped (or the job was restarted, killing the ranks that
    would have counted an error)."""

    def same_run(w: World) -> bool:
        return w.job.run == run and w.job.state != "PENDING"

    checks: dict[str, Callable[[World], bool]] = {
        "TrainingJobError": same_run,
        # TrainingHang also fires on a run that exited (see the detection table): the same run, not restarted.
        "TrainingHang": same_run,
        "TrainingLossNaN": lambda w: same_run(w) and w.job.nan,
        "TrainingMetricsAbsent": lambda w: w.job.state != "RUNNING",
        "TrainingStraggler": lambda w: w.nodes[node].speed < 1 and node in w.job.allocation,
        "TrainingThroughputDrop": lambda w: w.speed() < 1 and w.job.state == "RUNNING",
        "GpuThermalThrottle": lambda w: w.nodes[node].speed < 1,
        "SlurmNodeDown": lambda w: w.nodes[node].down_until > w.now and not w.nodes[node].drained,
        "DcgmExporterDown": lambda w: w.nodes[node].down_until > w.now,
    }
    if kind.startswith("warn:"):
        return lambda w: bool(w.nodes[node].warned)
    return checks.get(alertname, lambda w: True)
