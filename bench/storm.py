"""Alert storms from one shared cause, through the real engine's inbox: what Nightshift does, and how fast.

Each scenario builds a simulated fleet (nodes behind leaf switches, jobs of 8 ranks a node) and breaks one thing
all its jobs depend on. The alerts the shipped rules raise (``TrainingJobError`` per rank with its error class,
``DcgmExporterDown`` per silent exporter; labels as rules/README.md states them) are grouped the way
alerts/alertmanager.yml groups them (by alertname, Hostname, slurm_job_id, ...) into Alertmanager webhook bodies,
accepted by :meth:`Engine.accept` (the webhook's commit) and ingested by the worker (``ingest_next``, its
batches), over the shipped ``playbooks/`` with every Slurm action granted, as ``bench/ettr/nightshift.py`` does. The
scheduler is simulated at Nightshift's command seam (the ``scontrol``/``squeue``/``tail`` argv the Slurm client
sends, answered by :class:`FleetSlurm`); the job logs are those of sim/logtext.py (NCCL's lost peer naming the
peer's InfiniBand address, PyTorch's watchdog, the OSError of a dead file system). A requeued job restarts on
its allocation minus its exclusions after a minute and, while the cause lasts, fails again the same way.

Scenarios (``--scenarios``; every one by default):

* ``leaf-1job``: a leaf switch (64 nodes) dies under 64 of one 128-node job's nodes; the 512 ranks on the
  other 64 nodes log the lost peers behind it.
* ``leaf-8jobs``: the same leaf under 8 jobs of 8 nodes (4 behind it, 4 not); 512 ranks log it.
* ``leaf-exporters``: ``leaf-8jobs`` plus the 64 exporters behind the leaf going silent (576 alerts).
* ``storage-1000``, ``storage-2000``, ``storage-10000``: a shared file system fails under 1,000 / 2,000 / 10,000
  nodes (125 / 250 / 1,250 jobs of 8 nodes); every rank's reads fail (8,000 / 16,000 / 80,000 alerts).

Trials (``--trials``; what a skeptical SRE tries next, each checked against :func:`invariants`; not in ``make
bench``: together they take minutes, and their verdicts, not their speed, are the point):

* ``rack-power``: a rack of 16 nodes (inside a leaf of 64; the rack a topology/block block) loses power: 16
  silent exporters, 16 nodes down, 4 jobs inside it requeued by Slurm itself, a job straddling its edge losing 4 of
  its 8 nodes.
* ``driver-rollout``: a bad driver: within 3 minutes a GPU fails (Xid 79 or 119) on one node of each of 36 jobs,
  each job on a leaf of its own; nothing is shared.
* ``storage-xid``: ``storage-1000``, and 5 minutes in, an Xid 79 under a job that does not use that storage.
* ``storage-flapping``: ``storage-1000`` whose storage comes back and fails again three times (down 0-8, 13-19,
  24-29, 33-36 minutes), over an hour.
* ``storage-repeats``: an hour's storage outage under 125 jobs whose loaders keep retrying: one alert a node in one
  1,000-alert group (group_by alertname, error_class) re-sent every 5 minutes, and an Xid 79 at 45 minutes under a
  job that does not use that storage.

The shared cause lasts ``--outage-minutes`` (20) of simulated time, then clears; the run goes on for
``--horizon-minutes`` (45). A job's ``TrainingJobError`` alerts resolve five minutes after its last error (the
rule is ``increase(training_errors_total[5m]) > 0``: a dead job stops erring whether or not the cause is over); the
silent exporters' alerts resolve when the leaf is back. A notification answered 503 (the inbox's backlog bound) is
sent again once the Retry-After the webhook answered with has passed (Alertmanager retries a 5xx on its own
backoff; sending every refused notification again on every round made the harness, not Nightshift, quadratic).
Simulated time is an injected clock that advances with the CPU time the process spends (not the wall time: on a
shared machine, waiting for a core is not Nightshift's work) and jumps ahead when nothing is due, so latencies
include Nightshift's own work and waits.

Per scenario: alerts/s ingested (alerts over the CPU seconds of the webhook's accept plus the worker's
ingestion), alert → first action latency (the first alert accepted to the first scheduler change or message
sent), incidents opened, fleet incidents, job logs read (``tail`` over SSH), pages (what app/domain/paging.py
sends PagerDuty, counted by dedup key as PagerDuty counts open alerts), requeues (and the restarts onto nodes the
cause still reaches while it lasts: into the outage), healthy nodes excluded (nodes put on a job's exclusion
list whose hardware is fine and whose leaf works), nodes drained, and the peak RSS of the process that ran it
(one child process a scenario). The floor, in the same run: the same bodies parsed (``json.loads``) and their
alerts inserted into SQLite (WAL, a commit a body).

    python -m bench.storm [--scenarios leaf-1job,storage-1000] [--out bench/results/storm.json] [--no-readme]
    python -m bench.storm --trials [--scenarios storage-xid]  # exit status 1 when an invariant fails
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import re
import resource
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
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
from app.domain.errors import InboxFull
from app.domain.hostlist import expand_hostlist
from app.domain.paging import Page
from app.domain.permissions import Grant, Permissions
from app.domain.playbooks import load_playbooks
from app.engine import Engine
from app.store.records import inbox_backlog
from bench import record
from bench.runner import AnsweringRunner
from sim import logtext

REPO = Path(__file__).resolve().parents[1]
README = REPO / "bench" / "README.md"
START = datetime(2026, 1, 5, 2, 0, tzinfo=UTC)  # a Monday, 02:00: nobody is awake
RANKS_PER_NODE = 8
LEAF_NODES = 64
IDLE_TICK = 5.0  # simulated seconds skipped when the engine has nothing due
DELIVERY_AT = 40.0  # the first notification: the rule's evaluation plus Alertmanager's group_wait
RESTART_SECONDS = 60.0  # a requeued job's wait in the queue before it runs again
REFAIL_SECONDS = 90.0  # a restarted job meets the cause again after this long
# TrainingJobError is `increase(training_errors_total[5m]) > 0` (rules/): a dead job's alert resolves five minutes
# after its last error, whether or not the cause is over.
ERRORS_RESOLVE_SECONDS = 300.0
# The alerts a shared cause raises (resolved when it clears); an Xid is the node's own fault.
CAUSE_ALERTS = ("TrainingJobError", "DcgmExporterDown", "SlurmNodeDown")
# Alerts that resolve ERRORS_RESOLVE_SECONDS after they began (an error counter, an Xid's windowed count).
SELF_RESOLVING = ("TrainingJobError", "GpuXidError")
# alerts/alertmanager.yml's group_by: one notification per node and job.
GROUP_BY = ("alertname", "Hostname", "slurm_job_id", "train_job", "namespace", "pod")
BEGIN, END = "<!-- storm:begin -->", "<!-- storm:end -->"
# The earlier generations tabled beside a run: before ingestion in batches (cd73f21), before fleet incidents (529f0c8).
BEFORE = (record.RESULTS / "storm-before-batches.json", record.RESULTS / "storm-before.json")
TRIALS_BEGIN, TRIALS_END = "<!-- storm-trials:begin -->", "<!-- storm-trials:end -->"


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def ib_address(i: int) -> str:
    """The InfiniBand address NCCL prints for node ``i``: 10.<i // 65536>.<i // 256 % 256>.<i % 256>."""
    return f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"


@dataclass
class SimJob:
    job_id: str
    allocation: list[str]
    state: str = "RUNNING"
    restarts: int = 0
    exc: set[str] = field(default_factory=set)
    log: str = ""
    runs_at: float = -1.0  # PENDING until then
    fails_at: float = -1.0  # meets the shared cause again at this time
    shares_cause: bool = True  # uses what the cause breaks (False: a job on other storage, other switches)


@dataclass
class Fleet:
    """Nodes, leaves and jobs; ``dead_leaf``'s nodes cannot talk to the rest while the cause lasts (until
    ``outage_until``, and again in each spell of ``returns``: a cause that flaps)."""

    size: int
    jobs: dict[str, SimJob]
    dead_leaf: set[str]
    cause: str  # "leaf" or "storage"
    outage_until: float
    now: float = 0.0
    drained: dict[str, str] = field(default_factory=dict)  # node -> the drain reason set
    requeues: int = 0
    requeues_into_outage: int = 0
    healthy_excluded: set[str] = field(default_factory=set)
    first_change_at: float | None = None
    logs_read: int = 0
    returns: tuple[tuple[float, float], ...] = ()  # the cause back from..until (simulated seconds)
    faulty: set[str] = field(default_factory=set)  # nodes with a fault of their own (an Xid)
    errors_persist: bool = False  # the jobs keep logging the cause's errors (retrying reads) while it lasts
    ranks_alerting: int = RANKS_PER_NODE  # the ranks of a node whose errors are alerts
    repeat_seconds: float = 0.0  # Alertmanager re-sends every firing group this often (0: past the horizon)
    group_by: tuple[str, ...] = GROUP_BY
    rack_nodes: int = 0  # racks of this many nodes inside the leaves (topology/block blocks), 0: none
    acted: dict[str, float] = field(default_factory=dict)  # job -> when Nightshift first changed it

    @property
    def cause_live(self) -> bool:
        return self.now < self.outage_until or any(a <= self.now < b for a, b in self.returns)

    def healthy(self, name: str) -> bool:
        """Its hardware is fine and its leaf works (while the leaf is down, its nodes are not healthy)."""
        return name not in self.faulty and not (name in self.dead_leaf and self.cause_live)

    def reaches(self, job: SimJob) -> bool:
        """Whether the cause, while it lasts, breaks ``job``."""
        return job.shares_cause and (
            self.cause == "storage" or bool(self.dead_leaf.intersection(job.allocation))
        )

    def raised_by_cause(self, labels: dict[str, str]) -> bool:
        """Whether the alert is the shared cause's (it resolves when the cause clears)."""
        job = self.jobs.get(labels.get("slurm_job_id", ""))
        return labels["alertname"] in CAUSE_ALERTS and (job is None or job.shares_cause)

    def changed(self, job: str | None = None) -> None:
        if self.first_change_at is None:
            self.first_change_at = self.now
        if job is not None:
            self.acted.setdefault(job, self.now)


class FleetSlurm(AnsweringRunner):
    """The Slurm host at Nightshift's CommandRunner seam, for many jobs."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet

    def _answer(self, argv: tuple[str, ...]) -> tuple[str, int]:
        fleet = self.fleet
        match argv:
            case ("scontrol", "show", "job", "-o", job_id):
                job = fleet.jobs.get(job_id)
                if job is None:
                    return f"slurm_load_jobs error: Invalid job id specified ({job_id})", 1
                nodes = ",".join(job.allocation) if job.state in ("RUNNING", "FAILED") else ""
                return (
                    f"JobId={job_id} JobName=train-{job_id} UserId=train(1000) JobState={job.state} "
                    f"Reason=None Requeue=1 Restarts={job.restarts} NodeList={nodes or '(null)'} "
                    f"ReqNodeList=(null) ExcNodeList={','.join(sorted(job.exc)) or '(null)'} "
                    f"StdErr=/shared/logs/{job_id}.out StdOut=/shared/logs/{job_id}.out\n",
                    0,
                )
            case ("squeue", "--noheader", "--states=RUNNING", nodelist, "--format=%i"):
                node = nodelist.removeprefix("--nodelist=")
                running = [
                    j.job_id for j in fleet.jobs.values() if j.state == "RUNNING" and node in j.allocation
                ]
                return "".join(f"{j}\n" for j in running), 0
            case ("squeue", *_):
                return "1000 1000\n", 0
            case ("scontrol", "requeue", job_id):
                job = fleet.jobs[job_id]
                if job.state == "PENDING":
                    return f"scontrol: error: Job {job_id} is pending execution", 1
                fleet.changed(job_id)
                fleet.requeues += 1
                job.state, job.restarts, job.runs_at = (
                    "PENDING",
                    job.restarts + 1,
                    fleet.now + RESTART_SECONDS,
                )
                return "", 0
            case ("scontrol", "update", jobid, exc, *_) if jobid.startswith("JobId="):
                job = fleet.jobs[jobid.removeprefix("JobId=")]
                excluded = (
                    set(expand_hostlist(exc.removeprefix("ExcNodeList="))) if exc != "ExcNodeList=" else set()
                )
                fleet.changed(job.job_id)
                fleet.healthy_excluded |= {n for n in excluded - job.exc if fleet.healthy(n)}
                job.exc = excluded
                return "", 0
            case ("scontrol", "show", "hostnames", hostlist):
                return "".join(f"{n}\n" for n in expand_hostlist(hostlist)), 0
            case (
                "sinfo",
                "--noheader",
                "--Node",
                "--format=%N %o",
            ):  # the nodes Slurm knows: the topology's check
                return "".join(f"{node_name(i)} {ib_address(i)}\n" for i in range(fleet.size)), 0
            case ("setpriv", *rest) if "tail" in rest:
                return self._log(rest[-1])
            case ("tail", *rest):
                return self._log(rest[-1])
            case ("scontrol", "show", "node", "-o", name):
                drained = name in fleet.drained
                reason = f" Reason={fleet.drained[name]} [nightshift@2026-01-05T02:00:00]" if drained else ""
                state = "IDLE+DRAIN" if drained else "IDLE"
                return f"NodeName={name} Arch=x86_64 State={state} Partitions=gpu{reason}\n", 0
            case ("scontrol", "show", "partition", "-o", part):
                return f"PartitionName={part} Nodes=gpu[00000-{fleet.size - 1:05d}] State=UP\n", 0
            case ("scontrol", "update", node_arg, "State=DRAIN", reason):
                fleet.changed()
                fleet.drained[node_arg.removeprefix("NodeName=")] = reason.removeprefix("Reason=")
                return "", 0
            case ("scontrol", "update", node_arg, "State=RESUME"):
                fleet.changed()
                fleet.drained.pop(node_arg.removeprefix("NodeName="), None)
                return "", 0
            case ("scontrol", "reboot", "ASAP", "nextstate=DOWN", reason, name):
                fleet.changed()
                fleet.drained[name] = reason.removeprefix("reason=")
                return "", 0
        return f"unexpected command {argv}", 1

    def _log(self, path: str) -> tuple[str, int]:
        self.fleet.logs_read += 1
        match = re.search(r"/(\d+)\.out$", path)
        job = self.fleet.jobs.get(match.group(1)) if match else None
        return (job.log + "\n", 0) if job else (f"tail: cannot open '{path}'", 1)


class NoNodeShell:
    """A node's shell for validation that never proves the node healthy (its probe reads ``absent``): a node
    Nightshift repairs here is held for a person after its reboot (a page, bounded by the blast radius)."""

    def run(self, argv: Any, timeout: float | None = None) -> CommandResult:
        return CommandResult(tuple(argv), " ".join(argv), 0, "absent\n", "", 0.01)

    def close(self) -> None:
        pass


class FleetPrometheus:
    """Re-checks: an alert fires while its cause lasts; a job progresses when it runs and the cause is gone."""

    name = "prometheus"

    def __init__(self, fleet: Fleet, firing: dict[str, dict[str, str]]):
        self.fleet, self.firing = fleet, firing

    def query(self, expr: str, at: datetime | None = None) -> list[Sample]:
        job_id = re.search(r'slurm_job_id="(\d+)"', expr)
        if "training_step_total" in expr or "training_samples_total" in expr:
            job = self.fleet.jobs.get(job_id.group(1)) if job_id else None
            progressing = job is not None and job.state == "RUNNING" and job.fails_at < 0
            if "changes(" in expr and "== 0" in expr:
                return []
            return [Sample({"slurm_job_id": job.job_id}, 1.0, 0.0)] if progressing and job else []
        host = re.search(r'Hostname="([^"]+)"', expr)
        for labels in self.firing.values():
            same_host = host is None or labels.get("Hostname") == host.group(1)
            if same_host and (job_id is None or labels.get("slurm_job_id") == job_id.group(1)):
                return [Sample(dict(labels), 1.0, 0.0)]
        return []

    def ready(self) -> bool:
        return True


class Messages:
    """The notification webhook: every message Nightshift sends, and when."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.bodies: list[dict[str, Any]] = []
        self.first_at: float | None = None

    def post_json(self, url: str, body: dict[str, Any], headers: Any = None) -> int:
        if self.first_at is None:
            self.first_at = self.fleet.now
        self.bodies.append(body)
        return 200


class Pager:
    """PagerDuty's Events API at Nightshift's client seam: the pages that app/domain/paging.py decides a person
    needs (an incident needing a person, a held node, the blast radius, a fleet incident, the storm guard). A
    repeated ``dedup_key`` updates the open page instead of opening another, as PagerDuty does."""

    def __init__(self) -> None:
        self.triggers: dict[str, int] = {}

    def trigger(self, page: Page) -> str:
        self.triggers[page.dedup_key] = self.triggers.get(page.dedup_key, 0) + 1
        return page.dedup_key

    def close(self) -> None:
        pass


class SimClock:
    """Simulated time that advances with the CPU time the process spends and jumps when nothing is due. CPU time,
    not wall time: on a shared machine, time spent waiting for a core is not Nightshift's work."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self.origin = time.process_time()
        self.skipped = 0.0

    def tick(self) -> None:
        self.fleet.now = time.process_time() - self.origin + self.skipped

    def now(self) -> datetime:
        self.tick()
        return START + timedelta(seconds=self.fleet.now)

    def sleep(self, seconds: float) -> None:
        self.skipped += seconds
        self.tick()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(seconds)  # this clock runs at the wall clock's pace between skips


# --- scenarios ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    nodes: int
    build: Callable[[argparse.Namespace], tuple[Fleet, list[dict[str, Any]]]]
    horizon_minutes: float | None = (
        None  # the run's length when the scenario needs its own (not --horizon-minutes)
    )


def stamp(at: float) -> str:
    return (START + timedelta(seconds=at)).isoformat().replace("+00:00", "Z")


def rank_alert(job: SimJob, node: str, rank: int, error_class: str) -> dict[str, Any]:
    labels = {
        "alertname": "TrainingJobError",
        "severity": "critical",
        "slurm_job_id": job.job_id,
        "train_job": f"train-{job.job_id}",
        "Hostname": node,
        "instance": f"{node}:9400{rank % RANKS_PER_NODE}",
        "rank": str(rank),
        "error_class": error_class,
        "job": "training",
    }
    return {"labels": labels, "at": 0.0}


def exporter_alert(node: str) -> dict[str, Any]:
    labels = {
        "alertname": "DcgmExporterDown",
        "severity": "warning",
        "Hostname": node,
        "instance": f"{node}:9400",
        "job": "dcgm-exporter",
    }
    return {"labels": labels, "at": 30.0}


def node_down_alert(node: str) -> dict[str, Any]:
    """SlurmNodeDown (rules/node.yml): DOWN or NOT_RESPONDING for 5 minutes."""
    labels = {"alertname": "SlurmNodeDown", "severity": "critical", "node_name": node, "Hostname": node}
    return {"labels": labels, "at": 0.0, "arrives": 300.0}


def job_alerts(
    job: SimJob, nodes: Sequence[str], error_class: str, ranks: int = RANKS_PER_NODE
) -> list[dict[str, Any]]:
    """The error alerts of the first ``ranks`` ranks on each of ``nodes``."""
    index = {n: i for i, n in enumerate(job.allocation)}
    return [
        rank_alert(job, node, index[node] * RANKS_PER_NODE + r, error_class)
        for node in nodes
        for r in range(ranks)
    ]


def leaf_log(job: SimJob, loggers: Sequence[int], peers: Sequence[int], now: float) -> str:
    """The tail of the job's output: ranks on the nodes ``loggers`` each lose a peer on ``peers`` (in turn)."""
    parts = []
    for k, logger in enumerate(loggers):
        ctx = logtext.Context(
            hostname=node_name(logger), pid=4242 + k, job=f"train-{job.job_id}", step=1200, rank=8 * k
        )
        text = logtext.peer_lost(ctx, now, "x")
        parts.append(text.replace(logtext.ib_address("x"), ib_address(peers[k % len(peers)])))
    return "\n".join(parts)


def storage_log(job: SimJob) -> str:
    ctx = logtext.Context(hostname=job.allocation[0], pid=4242, job=f"train-{job.job_id}", step=1200)
    return logtext.storage_io(ctx)


# rules/gpu_xid.yml's class of each Xid the scenarios raise (the GPU fell off the bus; a GSP timeout).
XID_CLASSES = {"79": "reboot", "119": "reset_gpu"}


def xid_alert(job: SimJob, node: str, xid: str) -> dict[str, Any]:
    """GpuXidError as rules/gpu_xid.yml raises it on ``node`` under ``job``."""
    labels = {
        "alertname": "GpuXidError",
        "severity": "critical",
        "Hostname": node,
        "instance": f"{node}:9400",
        "gpu": "3",
        "xid": xid,
        "xid_class": XID_CLASSES[xid],
        "slurm_job_id": job.job_id,
        "job": "dcgm-exporter",
    }
    return {"labels": labels, "at": 0.0}


def xid_fault(fleet: Fleet, job: SimJob, node: str, xid: str, arrives: float) -> list[dict[str, Any]]:
    """A GPU of ``node`` fails under ``job`` (its own fault): the Xid and the errors of the job's ranks on its other
    nodes (those on ``node`` are inhibited by the Xid: alerts/alertmanager.yml), ``arrives`` seconds into the
    storm; the job's log shows the CUDA error behind NCCL's watchdog."""
    fleet.faulty.add(node)
    ctx = logtext.Context(hostname=node, pid=4242, job=f"train-{job.job_id}", step=1200, gpu=3)
    job.log, job.state = (
        logtext.gpu_fault(ctx, 0.0, "unspecified launch failure", len(job.allocation) * 8),
        "FAILED",
    )
    others = [n for n in job.allocation if n != node]
    alerts = [xid_alert(job, node, xid), *job_alerts(job, others, "nccl", fleet.ranks_alerting)]
    return [{**a, "arrives": arrives} for a in alerts]


def _fleet(size: int, jobs: list[SimJob], dead_leaf: set[str], cause: str, args: argparse.Namespace) -> Fleet:
    return Fleet(size, {j.job_id: j for j in jobs}, dead_leaf, cause, args.outage_minutes * 60.0)


def leaf_one_job(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
    size = 4 * LEAF_NODES  # leaves 0..3; the job on leaves 0 and 1; leaf 1 dies
    job = SimJob("1000", [node_name(i) for i in range(2 * LEAF_NODES)])
    dead = {node_name(i) for i in range(LEAF_NODES, 2 * LEAF_NODES)}
    fleet = _fleet(size, [job], dead, "leaf", args)
    job.log = leaf_log(
        job, [0, 9, 17, 33], [LEAF_NODES + 3, LEAF_NODES + 12, LEAF_NODES + 40, LEAF_NODES + 51], 0.0
    )
    job.state = "FAILED"
    return fleet, job_alerts(job, job.allocation[:LEAF_NODES], "nccl")


def _eight_jobs(args: argparse.Namespace) -> tuple[Fleet, list[SimJob]]:
    # Leaf 1 (nodes 64..127) dies; job k has 4 nodes behind it and 4 on leaf 0.
    size = 4 * LEAF_NODES
    jobs = []
    for k in range(8):
        behind = [node_name(LEAF_NODES + 4 * k + i) for i in range(4)]
        before = [node_name(4 * k + i) for i in range(4)]
        jobs.append(SimJob(str(2000 + k), before + behind))
    dead = {node_name(i) for i in range(LEAF_NODES, 2 * LEAF_NODES)}
    fleet = _fleet(size, jobs, dead, "leaf", args)
    for k, job in enumerate(jobs):
        job.log = leaf_log(job, [4 * k, 4 * k + 2], [LEAF_NODES + 4 * k + 1, LEAF_NODES + 4 * k + 3], 0.0)
        job.state = "FAILED"
    return fleet, jobs


def leaf_eight_jobs(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
    fleet, jobs = _eight_jobs(args)
    return fleet, [a for job in jobs for a in job_alerts(job, job.allocation, "nccl")]


def leaf_exporters(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
    fleet, jobs = _eight_jobs(args)
    alerts = [a for job in jobs for a in job_alerts(job, job.allocation, "nccl")]
    return fleet, alerts + [exporter_alert(n) for n in sorted(fleet.dead_leaf)]


def storage(nodes: int) -> Callable[[argparse.Namespace], tuple[Fleet, list[dict[str, Any]]]]:
    def build(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
        jobs = [SimJob(str(10_000 + k), [node_name(8 * k + i) for i in range(8)]) for k in range(nodes // 8)]
        fleet = _fleet(nodes + 2 * LEAF_NODES, jobs, set(), "storage", args)
        for job in jobs:
            job.log, job.state = storage_log(job), "FAILED"
        return fleet, [a for job in jobs for a in job_alerts(job, job.allocation, "storage_io")]

    return build


def driver_rollout(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
    """A bad driver rolled out: within three minutes a GPU fails (Xid 79 or 119) on one node of each of 36 jobs,
    each job on a leaf of its own. Nothing is shared; each failed node is its own fault."""
    jobs = [SimJob(str(3000 + k), [node_name(k * LEAF_NODES + i) for i in range(8)]) for k in range(36)]
    fleet = _fleet(len(jobs) * LEAF_NODES, jobs, set(), "driver", args)
    fleet.outage_until = 0.0
    alerts = []
    for k, job in enumerate(jobs):
        alerts += xid_fault(fleet, job, job.allocation[k % 8], "79" if k % 2 else "119", arrives=5.0 * k)
    return fleet, alerts


def rack_power_loss(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
    """A rack of 16 nodes (inside a leaf of 64) loses power: its exporters go silent, Slurm marks its nodes down;
    4 jobs of 3 nodes inside it die unseen (Slurm requeues them itself, NODE_FAIL) and a job of 8 nodes straddling
    its edge loses its 4 ranks' nodes inside: its 4 nodes outside log the lost peers."""
    rack = 16
    dead = {node_name(80 + i) for i in range(rack)}  # rack5, in leaf1
    inside = [SimJob(str(4000 + k), [node_name(80 + 3 * k + i) for i in range(3)]) for k in range(4)]
    straddling = SimJob("4004", [node_name(92 + i) for i in range(8)])
    fleet = _fleet(4 * LEAF_NODES, [*inside, straddling], dead, "power", args)
    fleet.rack_nodes = rack
    for job in inside:  # NODE_FAIL: requeued by Slurm, back once the rack is
        job.state, job.runs_at = "PENDING", fleet.outage_until + RESTART_SECONDS
    straddling.log, straddling.state = leaf_log(straddling, [96, 97, 98, 99], [92, 93, 94, 95], 0.0), "FAILED"
    alerts = job_alerts(straddling, straddling.allocation[4:], "nccl")
    alerts += [exporter_alert(n) for n in sorted(dead)] + [node_down_alert(n) for n in sorted(dead)]
    return fleet, alerts


def unrelated_job(fleet: Fleet, first: int) -> SimJob:
    """A job of 8 nodes from node ``first`` that does not use what the cause breaks (its own storage)."""
    job = SimJob("19999", [node_name(first + i) for i in range(8)], shares_cause=False)
    fleet.jobs[job.job_id] = job
    return job


def storage_and_xid(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
    """storage-1000, and five minutes in, a GPU falls off the bus (Xid 79) under a job that does not use that
    storage."""
    fleet, alerts = storage(1000)(args)
    job = unrelated_job(fleet, 1000)
    return fleet, alerts + xid_fault(fleet, job, job.allocation[5], "79", arrives=300.0)


def storage_flapping(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
    """storage-1000, whose storage comes back and fails again three times: down 0-8, 13-19, 24-29 and 33-36
    minutes (not ``--outage-minutes``)."""
    fleet, alerts = storage(1000)(args)
    fleet.outage_until = 8 * 60.0
    fleet.returns = ((13 * 60.0, 19 * 60.0), (24 * 60.0, 29 * 60.0), (33 * 60.0, 36 * 60.0))
    return fleet, alerts


def storage_repeats(args: argparse.Namespace) -> tuple[Fleet, list[dict[str, Any]]]:
    """A storage outage of an hour under 125 jobs whose data loaders keep retrying their reads: one alert a node,
    grouped by alertname and error_class into one 1,000-alert notification that Alertmanager re-sends every
    5 minutes (a repeat_interval an operator shortened); 45 minutes in, a GPU falls off the bus (Xid 79) under a
    job that does not use that storage."""
    jobs = [SimJob(str(10_000 + k), [node_name(8 * k + i) for i in range(8)]) for k in range(125)]
    fleet = _fleet(1000 + 2 * LEAF_NODES, jobs, set(), "storage", args)
    fleet.outage_until, fleet.errors_persist, fleet.ranks_alerting = 3600.0, True, 1
    fleet.repeat_seconds, fleet.group_by = 300.0, ("alertname", "error_class")
    for job in jobs:
        job.log, job.state = storage_log(job), "FAILED"
    alerts = [a for job in jobs for a in job_alerts(job, job.allocation, "storage_io", 1)]
    job = unrelated_job(fleet, 1000)
    return fleet, alerts + xid_fault(fleet, job, job.allocation[5], "79", arrives=45 * 60.0)


SCENARIOS = [
    Scenario("leaf-1job", "a leaf under 64 of one 128-node job's nodes", 256, leaf_one_job),
    Scenario("leaf-8jobs", "the same leaf under 8 jobs of 8 nodes", 256, leaf_eight_jobs),
    Scenario("leaf-exporters", "the leaf, and its 64 exporters silent", 256, leaf_exporters),
    Scenario("storage-1000", "storage outage under 1,000 nodes (125 jobs)", 1000, storage(1000)),
    Scenario("storage-2000", "storage outage under 2,000 nodes (250 jobs)", 2000, storage(2000)),
    Scenario("storage-10000", "storage outage under 10,000 nodes (1,250 jobs)", 10_000, storage(10_000)),
]
# What a skeptical SRE tries next.
TRIALS = [
    Scenario(
        "rack-power", "a rack of 16 nodes loses power under 5 jobs, one straddling it", 256, rack_power_loss
    ),
    Scenario("driver-rollout", "Xid 79/119 on one node of each of 36 jobs in 3 min", 2304, driver_rollout),
    Scenario("storage-xid", "storage-1000, and an Xid 79 under an unrelated job", 1008, storage_and_xid),
    Scenario(
        "storage-flapping",
        "storage-1000, the storage back and down 3 times",
        1000,
        storage_flapping,
        horizon_minutes=60.0,
    ),
    Scenario(
        "storage-repeats",
        "a 1,000-alert group re-sent every 5 min for an hour, then an Xid 79",
        1008,
        storage_repeats,
        horizon_minutes=65.0,
    ),
]


# --- Alertmanager's side -----------------------------------------------------------------------------------------


def fingerprint(labels: dict[str, str]) -> str:
    return f"{abs(hash(json.dumps(labels, sort_keys=True))):016x}"


def bodies(
    alerts: Sequence[dict[str, Any]],
    status: str,
    starts: dict[str, float],
    now: float,
    group_by: Sequence[str] = GROUP_BY,
) -> list[str]:
    """Webhook bodies, one per Alertmanager group (alerts/alertmanager.yml's group_by unless told otherwise)."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for a in alerts:
        groups.setdefault(tuple(a["labels"].get(k, "") for k in group_by), []).append(a)
    out = []
    for key, members in groups.items():
        items = [
            {
                "status": status,
                "labels": a["labels"],
                "annotations": {"summary": a["labels"]["alertname"]},
                "startsAt": stamp(starts[fingerprint(a["labels"])]),
                "endsAt": stamp(now) if status == "resolved" else "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": fingerprint(a["labels"]),
            }
            for a in members
        ]
        group_labels = {k: v for k, v in zip(group_by, key, strict=True) if v}
        out.append(
            json.dumps(
                {
                    "version": "4",
                    "groupKey": json.dumps(group_labels, sort_keys=True),
                    "truncatedAlerts": 0,
                    "status": status,
                    "receiver": "nightshift",
                    "groupLabels": group_labels,
                    "commonLabels": group_labels,
                    "commonAnnotations": {},
                    "externalURL": "http://alertmanager",
                    "alerts": items,
                }
            )
        )
    return out


# --- one run -----------------------------------------------------------------------------------------------------


def write_topology(fleet: Fleet, workdir: Path) -> Path:
    """topology.conf: leaves of LEAF_NODES nodes under one spine; where the fleet has racks, each rack's nodes as a
    block (the file's way to name a group of nodes smaller than a leaf)."""
    leaves = range((fleet.size + LEAF_NODES - 1) // LEAF_NODES)
    lines = [
        f"SwitchName=leaf{k} Nodes=gpu[{k * LEAF_NODES:05d}-{min(fleet.size, (k + 1) * LEAF_NODES) - 1:05d}]"
        for k in leaves
    ]
    lines.append(f"SwitchName=spine Switches=leaf[0-{len(leaves) - 1}]")
    size = fleet.rack_nodes
    lines += (
        [
            f"BlockName=rack{k} Nodes=gpu[{k * size:05d}-{(k + 1) * size - 1:05d}]"
            for k in range(fleet.size // size)
        ]
        if size
        else []
    )
    path = workdir / "topology.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_addresses(fleet: Fleet, workdir: Path) -> Path:
    """Each node's InfiniBand address, as its peers' NCCL lines print it."""
    path = workdir / "addresses.yaml"
    path.write_text("".join(f"{node_name(i)}: [{ib_address(i)}]\n" for i in range(fleet.size)))
    return path


def build_engine_for(
    fleet: Fleet, firing: dict[str, dict[str, str]], workdir: Path
) -> tuple[Engine, Messages, Pager]:
    messages, pager = Messages(fleet), Pager()
    registry = default_registry()
    settings = Settings(data_dir=str(workdir))
    settings.notify.webhook_url = "http://people.example/hook"
    settings.slurm.host = "slurm-login"
    routing_key = workdir / "pagerduty.key"
    routing_key.write_text("0" * 32 + "\n")
    settings.notify.pagerduty_routing_key_file = str(routing_key)
    settings.fleet.topology_file = str(write_topology(fleet, workdir))
    settings.fleet.addresses_file = str(write_addresses(fleet, workdir))
    clock = SimClock(fleet)
    clients = Clients(
        settings,
        slurm=SlurmClient(FleetSlurm(fleet)),
        prometheus=FleetPrometheus(fleet, firing),
        http=messages,
        pagerduty=pager,
        **{f"node:{node_name(i)}": NoNodeShell() for i in range(fleet.size)},
    )
    grants = [a.name for a in registry if a.name.startswith(("slurm.", "checkpoint.")) and not a.read_only]
    engine = build_engine(
        settings,
        clock=clock,
        clients=clients,
        registry=registry,
        playbooks=load_playbooks([REPO / "playbooks"], registry),
        permissions=Permissions(Grant(action=name) for name in grants),
    )
    return engine, messages, pager


def resolves_at(fleet: Fleet, labels: dict[str, str], began: float) -> float | None:
    """When an alert that began at ``began`` stops firing on its own (None: when its cause clears, or never)."""
    job = fleet.jobs.get(labels.get("slurm_job_id", ""))
    if labels["alertname"] not in SELF_RESOLVING or (
        fleet.errors_persist and job is not None and job.shares_cause
    ):
        return None
    return began + ERRORS_RESOLVE_SECONDS


def run_scenario(scenario: Scenario, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fleet, alerts = scenario.build(args)
    firing: dict[str, dict[str, str]] = {}
    engine, messages, pager = build_engine_for(fleet, firing, workdir)
    clock: SimClock = engine.deps.clock  # type: ignore[assignment]
    starts: dict[str, float] = {}
    horizon = (scenario.horizon_minutes or args.horizon_minutes) * 60.0
    clock.sleep(DELIVERY_AT)
    first_alert_at = fleet.now
    resolves: dict[str, float] = {}  # when each self-resolving alert stops firing
    # Alerts with "arrives" reach Alertmanager that many seconds after the storm's first delivery.
    later = sorted((a for a in alerts if a.get("arrives")), key=lambda a: a["arrives"])
    for a in alerts:
        starts[fingerprint(a["labels"])] = first_alert_at - 30.0 + a["at"] + a.get("arrives", 0.0)
    for a in alerts:
        if not a.get("arrives"):
            firing[fingerprint(a["labels"])] = a["labels"]
            ends = resolves_at(fleet, a["labels"], starts[fingerprint(a["labels"])])
            if ends is not None:
                resolves[fingerprint(a["labels"])] = ends
    next_resolve = min(resolves.values(), default=math.inf)
    pending = bodies([a for a in alerts if not a.get("arrives")], "firing", starts, fleet.now, fleet.group_by)
    refused_bodies: list[tuple[float, str]] = []  # (when it is sent again, body)
    accept_cpu = ingest_cpu = 0.0
    accepted = refused = 0
    delivered_alerts = 0
    was_live = fleet.cause_live
    next_repeat = first_alert_at + fleet.repeat_seconds if fleet.repeat_seconds else math.inf
    peak_backlog = 0
    accepted_since_empty = False
    while fleet.now < horizon:
        clock.tick()
        while later and first_alert_at + later[0]["arrives"] <= fleet.now:
            a = later.pop(0)
            firing[fingerprint(a["labels"])] = a["labels"]
            ends = resolves_at(fleet, a["labels"], starts[fingerprint(a["labels"])])
            if ends is not None:
                resolves[fingerprint(a["labels"])] = ends
                next_resolve = min(next_resolve, ends)
            pending += bodies([a], "firing", starts, fleet.now, fleet.group_by)
        if fleet.now >= next_repeat:  # Alertmanager's repeat_interval: every firing group again, as it was
            next_repeat += fleet.repeat_seconds
            pending += bodies(
                [{"labels": labels} for labels in firing.values()],
                "firing",
                starts,
                fleet.now,
                fleet.group_by,
            )
        pending += [body for at, body in refused_bodies if at <= fleet.now]
        refused_bodies = [(at, body) for at, body in refused_bodies if at > fleet.now]
        if pending:
            begin = time.process_time()
            for body in pending:
                notification = parse_notification(body)
                try:
                    engine.accept(notification, body.encode())
                except InboxFull as full:
                    # Answered 503: sent again once the Retry-After the webhook gave has passed (not at once: a
                    # sender that retried every refused notification on every round made the harness quadratic).
                    refused += 1
                    refused_bodies.append((fleet.now + full.retry_after, body))
                    continue
                accepted += 1
                accepted_since_empty = True
                delivered_alerts += len(notification.alerts)
            accept_cpu += time.process_time() - begin
            pending = []
            with engine.deps.store.read() as conn:
                peak_backlog = max(peak_backlog, inbox_backlog(conn))
        # Scanned only once the earliest is due (a scan every round cost the harness minutes at 80,000 alerts).
        done = [k for k, at in resolves.items() if at <= fleet.now] if fleet.now >= next_resolve else []
        if fleet.cause_live != was_live:
            was_live = fleet.cause_live
            if was_live:
                cause_returns(fleet)
            else:  # the cause is over: every alert it raised resolves
                done += [k for k, labels in firing.items() if fleet.raised_by_cause(labels)]
        if done:
            ended = [{"labels": firing.pop(k)} for k in done if k in firing]
            for k in done:
                resolves.pop(k, None)
            next_resolve = min(resolves.values(), default=math.inf)
            pending += bodies(ended, "resolved", starts, fleet.now, fleet.group_by) if ended else []
            continue
        # The worker looks at the inbox when an accept wakes it (app.wakeup), not on every round of this loop: an
        # inbox found empty is not looked at again until something is accepted (the worker's idle poll, every
        # worker.poll_seconds, is not ingestion).
        ingested = None
        if accepted_since_empty:
            begin = time.process_time()
            ingested = engine.inbox.ingest_next()
            ingest_cpu += time.process_time() - begin
            accepted_since_empty = ingested is not None
        ticked = engine.lifecycle.work_once("storm")
        repaired = engine.repairs.work_once("storm")
        refail = advance_jobs(fleet, firing, starts)
        if refail:
            pending += bodies(refail, "firing", starts, fleet.now, fleet.group_by)
            for a in refail:
                ends = resolves_at(fleet, a["labels"], fleet.now)
                if ends is not None:
                    resolves[fingerprint(a["labels"])] = ends
                    next_resolve = min(next_resolve, ends)
        if ingested is None and ticked is None and repaired is None and not pending:
            clock.sleep(IDLE_TICK)
    incidents = engine.incidents(limit=100_000)
    fleet_incidents = engine.fleet.fleet_incidents(limit=1)
    engine.deps.store.dispose()
    first_action = min((t for t in (fleet.first_change_at, messages.first_at) if t is not None), default=None)
    ingest_total = accept_cpu + ingest_cpu
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "nodes": scenario.nodes,
        "jobs": len(fleet.jobs),
        "alerts": len(alerts),
        "alerts_delivered": delivered_alerts,
        "notifications": accepted,
        "refused_503": refused,
        "peak_inbox_backlog": peak_backlog,
        "accept_cpu_s": round(accept_cpu, 3),
        "ingest_cpu_s": round(ingest_cpu, 3),
        "alerts_per_cpu_s": round(delivered_alerts / ingest_total, 1) if ingest_total else None,
        "first_action_s": round(first_action - first_alert_at, 2) if first_action is not None else None,
        "incidents": len(incidents),
        "fleet_incidents": len(fleet_incidents),
        # Each told once when it opens; a cause that returns reopens its key's record (one record a key).
        "fleet_incidents_told": sum(1 for b in messages.bodies if b.get("nightshift", {}).get("fleet")),
        "logs_read": fleet.logs_read,
        "incidents_by_kind": _count(incidents, "kind"),
        "incidents_by_outcome": _count(incidents, "outcome"),
        "max_incidents_per_job": max(
            _count([i for i in incidents if i["kind"] == "job"], "job").values(), default=0
        ),
        "fleet_keys": [r["key"] for r in fleet_incidents],
        "unrelated": unrelated_fault(fleet, alerts, incidents, fleet_incidents, first_alert_at),
        "pages": len(pager.triggers),
        "pages_by_kind": _count([{"kind": key.split("/")[1]} for key in pager.triggers], "kind"),
        "messages": len(messages.bodies),
        "requeues": fleet.requeues,
        "jobs_running_at_end": sum(1 for j in fleet.jobs.values() if j.state == "RUNNING" and j.fails_at < 0),
        "cause_spells": 1 + len(fleet.returns) if fleet.outage_until > 0 else 0,
        "cause_over_s": max([fleet.outage_until, *(end for _, end in fleet.returns)]),
        "horizon_s": horizon,
        "probes": sum(len(r["probed"]) for r in fleet_incidents),
        "requeues_into_outage": fleet.requeues_into_outage,
        "healthy_nodes_excluded": len(fleet.healthy_excluded),
        "nodes_drained": len(fleet.drained),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "floor_alerts_per_cpu_s": floor(bodies(alerts, "firing", starts, first_alert_at), workdir),
    }


def unrelated_fault(
    fleet: Fleet,
    alerts: Sequence[dict[str, Any]],
    incidents: Sequence[dict[str, Any]],
    fleet_incidents: Sequence[dict[str, Any]],
    first_alert_at: float,
) -> dict[str, Any] | None:
    """What became of the job the cause does not reach (None: no such job): its incidents, whether a fleet
    incident took it in, the seconds from its alert's delivery to Nightshift's first change to it, and whether it
    runs again off its failed node."""
    job = next((j for j in fleet.jobs.values() if not j.shares_cause), None)
    if job is None:
        return None
    arrives = min(a.get("arrives", 0.0) for a in alerts if a["labels"].get("slurm_job_id") == job.job_id)
    own = [i for i in incidents if i["job"] == job.job_id]
    in_fleet = {i["id"] for i in own} & {m for r in fleet_incidents for m in r["incidents"]}
    acted = fleet.acted.get(job.job_id)
    return {
        "incidents": len(own),
        "outcomes": [i["outcome"] for i in own],
        "in_fleet_incident": bool(in_fleet),
        "first_action_s": round(acted - first_alert_at - arrives, 1) if acted is not None else None,
        "runs_off_its_fault": job.state == "RUNNING" and fleet.faulty & set(job.allocation) <= job.exc,
    }


def _count(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row.get(key))] = counts.get(str(row.get(key)), 0) + 1
    return counts


def advance_jobs(
    fleet: Fleet, firing: dict[str, dict[str, str]], starts: dict[str, float]
) -> list[dict[str, Any]]:
    """Requeued jobs start when their wait is over; one that starts while the cause lasts fails again."""
    again: list[dict[str, Any]] = []
    for job in fleet.jobs.values():
        if job.state == "PENDING" and 0 <= job.runs_at <= fleet.now:
            job.state, job.runs_at = "RUNNING", -1.0
            job.allocation = [n for n in job.allocation if n not in job.exc]
            if fleet.cause_live and fleet.reaches(job):
                fleet.requeues_into_outage += 1
                job.fails_at = fleet.now + REFAIL_SECONDS
        elif job.state == "RUNNING" and 0 <= job.fails_at <= fleet.now:
            job.fails_at = -1.0
            if not fleet.cause_live:
                continue
            job.state = "FAILED"
            nodes = [n for n in job.allocation if n not in fleet.dead_leaf] or job.allocation
            error_class = "storage_io" if fleet.cause == "storage" else "nccl"
            for a in job_alerts(job, nodes, error_class, fleet.ranks_alerting):
                key = fingerprint(a["labels"])
                starts[key] = fleet.now
                firing[key] = a["labels"]
                again.append(a)
    return again


def cause_returns(fleet: Fleet) -> None:
    """The cause is back: every running job it reaches meets it again."""
    for job in fleet.jobs.values():
        if job.state == "RUNNING" and fleet.reaches(job) and job.fails_at < 0:
            job.fails_at = fleet.now + REFAIL_SECONDS


def floor(payloads: Sequence[str], workdir: Path) -> float:
    """Alerts per CPU-second to parse the same bodies and insert their alerts into SQLite, a commit a body."""
    db = sqlite3.connect(workdir / "floor.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE alerts (id INTEGER PRIMARY KEY, fingerprint TEXT, starts_at TEXT, status TEXT, labels TEXT)"
    )
    alerts = 0
    begin = time.process_time()
    for body in payloads:
        doc = json.loads(body)
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO alerts (fingerprint, starts_at, status, labels) VALUES (?, ?, ?, ?)",
            [(a["fingerprint"], a["startsAt"], a["status"], json.dumps(a["labels"])) for a in doc["alerts"]],
        )
        db.execute("COMMIT")
        alerts += len(doc["alerts"])
    spent = time.process_time() - begin
    db.close()
    return round(alerts / spent, 1)


def _child(scenario: Scenario, args: argparse.Namespace, conn: Any) -> None:
    with tempfile.TemporaryDirectory(prefix=f"bench-storm-{scenario.name}-") as tmp:
        conn.send(run_scenario(scenario, args, Path(tmp)))
    conn.close()


def run_isolated(scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    """One scenario in a child process of its own, so that its peak RSS is its own."""
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(scenario, args, child))
    process.start()
    child.close()
    result = parent.recv()
    process.join()
    return result


# --- what must hold ---------------------------------------------------------------------------------------------

SETTLED = 600.0  # simulated seconds after the cause is over by which every job should run again


def invariants(r: dict[str, Any]) -> dict[str, bool]:
    """What a trial must show, from its figures: one incident per job and spell of the cause, one fleet incident
    per spell at most (at least one where there is a cause), pages bounded (one per fleet incident, one for the
    storm guard, one for the blast radius, one per node taken out and held: at most the blast radius), no restart
    into the cause but the probes, no healthy node excluded, the unrelated fault recovered outside any fleet
    incident, and every job running again once the cause has been over for ``SETTLED`` seconds."""
    spells = r["cause_spells"]
    unrelated = r["unrelated"]
    settled = r["horizon_s"] - r["cause_over_s"] >= SETTLED
    return {
        "incidents/job <= spells": r["max_incidents_per_job"] <= max(1, spells),
        "fleet incidents per cause": (r["fleet_incidents_told"] >= 1 if spells else True)
        and r["fleet_incidents_told"] <= spells,
        "pages bounded": r["pages"] <= r["fleet_incidents_told"] + 2 + r["nodes_drained"],
        "no restart into the cause but probes": r["requeues_into_outage"] <= r["probes"],
        "no healthy node excluded": r["healthy_nodes_excluded"] == 0,
        "unrelated fault recovered": unrelated is None
        or (unrelated["runs_off_its_fault"] and not unrelated["in_fleet_incident"]),
        "every job runs again": not settled or r["jobs_running_at_end"] == r["jobs"],
    }


def trials_markdown(rows: Sequence[dict[str, Any]], label: str) -> str:
    lines = [
        f"Trials ({label}): `python -m bench.storm --trials`. Invariants as `invariants()` states them; a failed "
        "one is named.",
        "",
        "| trial | alerts | alerts/CPU-s | incidents (max per job) | fleet incidents told | pages (by kind) "
        "| requeues (into the cause; probes) | jobs running at the end | unrelated fault: first action s, "
        "recovered | failed invariants |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        unrelated = r["unrelated"]
        fault = (
            f"{unrelated['first_action_s']}, {'yes' if unrelated['runs_off_its_fault'] else 'no'}"
            if unrelated
            else "-"
        )
        failed = [name for name, ok in invariants(r).items() if not ok]
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["pages_by_kind"].items()))
        lines.append(
            f"| {r['scenario']}: {r['description']} | {r['alerts_delivered']:,} | {r['alerts_per_cpu_s']:,.0f} "
            f"| {r['incidents']} ({r['max_incidents_per_job']}) | {r['fleet_incidents_told']} "
            f"| {r['pages']} ({kinds or 'none'}) | {r['requeues']} ({r['requeues_into_outage']}; {r['probes']}) "
            f"| {r['jobs_running_at_end']} of {r['jobs']} | {fault} | {', '.join(failed) or 'none'} |"
        )
    return "\n".join(lines)


# --- the table ---------------------------------------------------------------------------------------------------


def markdown(rows: Sequence[dict[str, Any]], label: str) -> str:
    lines = [
        f"Storms through the inbox ({label}): `python -m bench.storm`. Alerts/s is alerts over the CPU seconds of "
        "the webhook's accept and the worker's ingestion; the floor parses the same bodies and inserts them into "
        "SQLite in the same run.",
        "",
        "| scenario | alerts | alerts/CPU-s | floor alerts/CPU-s | floor / Nightshift | first action s | incidents "
        "| fleet incidents | logs read | pages | requeues (restarts into the cause) | healthy nodes excluded "
        "| nodes drained | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["floor_alerts_per_cpu_s"] / r["alerts_per_cpu_s"] if r["alerts_per_cpu_s"] else float("nan")
        first = f"{r['first_action_s']:.1f}" if r["first_action_s"] is not None else "none"
        lines.append(
            f"| {r['scenario']}: {r['description']} | {r['alerts_delivered']:,} | {r['alerts_per_cpu_s']:,.0f} "
            f"| {r['floor_alerts_per_cpu_s']:,.0f} | {ratio:.1f}x | {first} | {r['incidents']} "
            f"| {r.get('fleet_incidents', '-')} | {r.get('logs_read', '-')} | {r['pages']} "
            f"| {r['requeues']} ({r['requeues_into_outage']}) | {r['healthy_nodes_excluded']} "
            f"| {r['nodes_drained']} | {r['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def with_before(table: str, before: Sequence[Path]) -> str:
    """``table``, and the tables of the earlier runs saved at ``before`` (the code before a change), if any."""
    tables = [table]
    for path in before:
        if path.exists():
            saved = record.read(path)
            tables.append(markdown(saved["results"]["rows"], saved["params"]["label"]))
    return "\n\n".join(tables)


def write_readme(table: str, begin: str = BEGIN, end: str = END, title: str = "Storms") -> None:
    text = README.read_text()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        README.write_text(f"{head}{begin}\n{table}\n{end}{tail}")
    else:
        README.write_text(
            text.rstrip("\n") + f"\n\n### {title} (`python -m bench.storm`)\n\n{begin}\n{table}\n{end}\n"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", help="names, comma-separated (default: every one of the list run)")
    parser.add_argument(
        "--trials",
        action="store_true",
        help="run the trials (what a skeptical SRE tries next) and check their invariants, not the scenarios",
    )
    parser.add_argument("--outage-minutes", type=float, default=20.0)
    parser.add_argument("--horizon-minutes", type=float, default=45.0)
    parser.add_argument("--label", default="the code as it is now")
    parser.add_argument(
        "--out", type=Path, help="default: bench/results/storm.json (trials: storm-trials.json)"
    )
    parser.add_argument(
        "--no-readme", action="store_true", help="do not rewrite the table in bench/README.md"
    )
    parser.add_argument(
        "--before",
        type=Path,
        action="append",
        help="an earlier run's results, tabled beside this one's in bench/README.md (repeatable; default: "
        + ", ".join(str(p.relative_to(REPO)) for p in BEFORE)
        + ")",
    )
    args = parser.parse_args(argv)
    pool = TRIALS if args.trials else SCENARIOS
    wanted = args.scenarios.split(",") if args.scenarios else [s.name for s in pool]
    unknown = set(wanted) - {s.name for s in pool}
    if unknown:
        parser.error(f"unknown {'trial' if args.trials else 'scenario'}(s): {', '.join(sorted(unknown))}")
    out = args.out or record.RESULTS / ("storm-trials.json" if args.trials else "storm.json")
    rows = []
    for scenario in (s for s in pool if s.name in wanted):
        rows.append(run_isolated(scenario, args))
        r = rows[-1]
        print(
            f"{r['scenario']}: {r['alerts_delivered']} alerts, {r['alerts_per_cpu_s']} alerts/CPU-s "
            f"(floor {r['floor_alerts_per_cpu_s']}), first action {r['first_action_s']} s, "
            f"{r['incidents']} incidents, {r['pages']} pages, {r['requeues']} requeues, "
            f"{r['healthy_nodes_excluded']} healthy excluded, {r['peak_rss_mib']} MiB",
            flush=True,
        )
    params = {k: v for k, v in vars(args).items() if k not in ("out", "no_readme", "before")}
    print(f"wrote {record.write(out, 'storm-trials' if args.trials else 'storm', params, {'rows': rows})}")
    if args.trials:
        table = trials_markdown(rows, args.label)
        print(table)
        if not args.no_readme:
            write_readme(table, TRIALS_BEGIN, TRIALS_END, "Storm trials")
        failed = {r["scenario"]: [n for n, ok in invariants(r).items() if not ok] for r in rows}
        for name, broken in failed.items():
            if broken:
                print(f"{name}: FAILED {', '.join(broken)}")
        return 1 if any(failed.values()) else 0
    table = markdown(rows, args.label)
    print(table)
    if not args.no_readme:
        write_readme(with_before(table, args.before or BEFORE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
