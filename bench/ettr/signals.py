"""The metric series a fault leaves behind, as Prometheus would scrape them (pure: no I/O).

One scenario is one fault striking a small job (a node at fault, ``culprit``, and three peers, one GPU each) that
has trained for ``age`` seconds: the series of dcgm-exporter (per-GPU values from :func:`sim.dcgm_exporter.
gpu_values`, the simulator's exporter, so a thermal fault looks the same here and in the demo), of the training
job's progress library (the contract of rules/README.md: steps, samples, errors by class, per-rank step time,
checkpoint time, loss), of node_exporter (InfiniBand port counters) and of the Slurm exporter (``slurm_node_info``),
scraped every :data:`SCRAPE` seconds, through the fault and ``observe`` seconds after it, with nothing done about
it. :mod:`bench.ettr.detection` evaluates the shipped rules over them.

What each kind does to the series (the physics of :mod:`bench.ettr.world`, in metrics):

* a GPU fault (Xid 79/48/95/119): the Xid on the culprit's GPU (the sticky ``DCGM_FI_DEV_XID_ERRORS`` and
  the windowed ``DCGM_EXP_XID_ERRORS_COUNT``; Xid 48 also one double-bit ECC error); the culprit's rank counts
  an ``nccl`` error (ProcessGroupNCCL reports the CUDA failure) and exits; the peers stop stepping, stuck in the
  collective, until the watchdog (``watchdog`` seconds) counts their ``nccl`` error and they exit;
* a software bug: the culprit's rank exits with an exception of no error class; the peers as above;
* an NCCL watchdog timeout: every rank stuck, then every rank's ``nccl`` error at the watchdog;
* a network flap or a dead NIC: every rank's ``nccl`` error after :data:`IB_RETRY_SECONDS`, then exit;
* a host down: the culprit's exporters vanish (``up`` 0), Slurm marks it DOWN and not responding after
  :data:`SLURMD_TIMEOUT`; the peers wait for the watchdog;
* a hang: no rank steps; the GPUs idle;
* silent data corruption: the loss is NaN on every rank (the moment it shows, not the corruption's start);
* a straggler: the culprit's own work per step grows by 1/speed and the job's step rate falls to ``speed``;
  a thermal one also sets the GPU's HW_SLOWDOWN/HW_THERMAL clock reasons (the simulator's thermal fault);
* a dependency outage: every rank counts a ``storage_io`` error and exits;
* a warning: the signal's counter on the culprit's GPU (or port) rises at :data:`WARNING_RATES` per second.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from nightshift_progress import ERROR_CLASSES

from bench.ettr.causes import KINDS
from sim import gpus
from sim.dcgm_exporter import NodeLoad, gpu_values
from sim.faults import GpuFaults

SCRAPE = 30  # seconds between scrapes and between rule evaluations (assumed Prometheus settings)
JOB_ID, TRAIN_JOB = "4242", "llama3"
CULPRIT, PEERS = "node-culprit", ("node-peer0", "node-peer1", "node-peer2")
NODES = (CULPRIT, *PEERS)
STEP_SECONDS = 10.0  # one training step; a rank's own work is 90% of it, the rest waits in the all-reduce
SAMPLES_PER_STEP = 1024
IB_RETRY_SECONDS = 60  # NCCL's IB error after the transport's retries, then the abort (assumed)
SLURMD_TIMEOUT = 300  # slurm.conf SlurmdTimeout's default: a silent node is NOT_RESPONDING/DOWN after it
LINGER = SCRAPE  # a rank that counted an error serves one more scrape, then exits (sim/trainer.py --linger)
LEAD_IN = 600  # the node and GPU series exist this long before the job starts
# Warning signals (issue 25): the counter that rises, and how fast (per second; assumed: above the rules'
# thresholds, which are the point of the warning).
WARNING_RATES = {
    "ecc_correctable": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0.2),
    "pcie_replay": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0),
    "infiniband_errors": ("node_infiniband_symbol_error_total", 1.0),
}
STALE = "stale"  # a staleness marker: the series stopped being scraped

Value = float | str | None  # a sample, STALE, or None for no sample


@dataclass(frozen=True)
class Scenario:
    """``kind`` (a :data:`bench.ettr.causes.KINDS` name, or ``warn:<signal>``) striking a job that has trained
    for ``age`` seconds; the peers' watchdog takes them down ``watchdog`` seconds after they get stuck."""

    kind: str
    age: float
    watchdog: float = 600.0
    observe: float = 3000.0
    checkpoint_interval: float = 1800.0
    straggler_speed: float = 0.6

    @property
    def start(self) -> float:
        """When the job starts (scenario seconds)."""
        return LEAD_IN

    @property
    def fault(self) -> float:
        """When the fault strikes, aligned to a scrape."""
        return LEAD_IN + math.ceil(self.age / SCRAPE) * SCRAPE

    @property
    def end(self) -> float:
        return self.fault + self.observe

    def times(self) -> range:
        return range(0, int(self.end) + 1, SCRAPE)


@dataclass
class _Rank:
    """One node's training process over time."""

    stepping_until: float = math.inf  # stuck (in a collective, or hung) from then on
    error: tuple[float, str] | None = None  # (when, class) of the error it counts before exiting
    exits: float = math.inf  # gone (its metrics endpoint too) from then on
    own_work: float = 0.9 * STEP_SECONDS


@dataclass
class _Story:
    """The scenario's events, per node: what the series generator reads."""

    ranks: dict[str, _Rank] = field(default_factory=lambda: {n: _Rank() for n in NODES})
    job_speed_from: float = math.inf
    host_down: float = math.inf
    gpu_thermal: float = math.inf
    xid: tuple[float, int] | None = None
    ecc_dbe: float = math.inf
    nan_from: float = math.inf
    hung_from: float = math.inf
    warning: tuple[float, str] | None = None


def _story(s: Scenario) -> _Story:
    story, f = _Story(), s.fault
    kind = s.kind
    if kind.startswith("warn:"):
        story.warning = (f, kind.removeprefix("warn:"))
        return story
    effect = KINDS[kind].effect
    culprit, peers = story.ranks[CULPRIT], [story.ranks[p] for p in PEERS]
    if effect == "stall_then_crash":
        xid = KINDS[kind].xid
        if xid:
            story.xid = (f, xid)
            if xid == 48:
                story.ecc_dbe = f
            culprit.stepping_until, culprit.error, culprit.exits = f, (f, "nccl"), f + LINGER
        elif kind == "software_bug":
            culprit.stepping_until, culprit.exits = f, f
        else:  # nccl_watchdog: the culprit is one rank like the others
            peers.append(culprit)
        for rank in peers:
            rank.stepping_until, rank.error, rank.exits = f, (f + s.watchdog, "nccl"), f + s.watchdog + LINGER
    elif effect == "crash":
        for rank in story.ranks.values():
            when = f + IB_RETRY_SECONDS
            rank.stepping_until, rank.error, rank.exits = when, (when, "nccl"), when + LINGER
    elif effect == "node_down":
        story.host_down = f
        culprit.stepping_until = culprit.exits = f
        for rank in peers:
            rank.stepping_until, rank.error, rank.exits = f, (f + s.watchdog, "nccl"), f + s.watchdog + LINGER
    elif effect == "outage":
        for rank in story.ranks.values():
            rank.stepping_until, rank.error, rank.exits = f, (f, "storage_io"), f + LINGER
    elif effect == "hang":
        story.hung_from = f
        for rank in story.ranks.values():
            rank.stepping_until = f
    elif effect == "nan":
        story.nan_from = f
    elif effect == "slow":
        story.job_speed_from = f
        if kind == "thermal_straggler":
            story.gpu_thermal = f
    else:
        raise ValueError(f"no series for {kind!r} ({effect})")
    return story


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def series(s: Scenario) -> dict[str, list[Value]]:
    """Every series of the scenario: selector → one value per scrape (:meth:`Scenario.times`)."""
    story = _story(s)
    out: dict[str, list[Value]] = {}
    for node in NODES:
        out.update(_gpu_series(s, story, node))
        out.update(_training_series(s, story, node))
        out.update(_node_series(s, story, node))
    return out


def _present(times: range, values: Iterator[Value], gone: float) -> list[Value]:
    """``values`` per scrape until ``gone``, then a staleness marker and no samples."""
    out: list[Value] = []
    for t, v in zip(times, values, strict=False):
        out.append(v if t < gone else (STALE if out and out[-1] not in (None, STALE) else None))
    return out


def _gpu_series(s: Scenario, story: _Story, node: str) -> dict[str, list[Value]]:
    rng = random.Random(f"{s.kind}/{node}")
    culprit = node == CULPRIT
    base = {
        "gpu": "0",
        "UUID": gpus.gpu_uuid(node, 0),
        "pci_bus_id": gpus.pci_bus_id(0),
        "device": "nvidia0",
        "modelName": gpus.MODEL,
        "Hostname": node,
        "DCGM_FI_DRIVER_VERSION": gpus.DRIVER_VERSION,
        "hpc_job": JOB_ID,
        "instance": f"{node}:9400",
        "job": "dcgm-exporter",
    }
    times = s.times()
    gone = story.host_down if culprit else math.inf
    columns: dict[str, list[Value]] = {}
    warning = story.warning if culprit else None
    xid = story.xid if culprit else None
    for t in times:
        rank = story.ranks[node]
        if t < s.start or t >= rank.exits:
            state = "idle"
        elif t >= min(rank.stepping_until, story.hung_from):
            state = "hung"
        else:
            state = "busy"
        speed = s.straggler_speed if t >= story.job_speed_from else 1.0
        faults = GpuFaults(
            ecc_dbe=int(culprit and t >= story.ecc_dbe), thermal=culprit and t >= story.gpu_thermal
        )
        last_xid = xid[1] if xid and t >= xid[0] else 0
        values: dict[str, float] = dict(gpu_values(NodeLoad(state, speed), faults, last_xid, t, rng))
        for signal, (metric, rate) in WARNING_RATES.items():
            if metric.startswith("DCGM_"):
                rising = warning is not None and warning[1] == signal and t >= warning[0]
                values[metric] = int(rate * (t - warning[0])) if rising and warning else 0
        values["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 0
        values["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"] = 0
        for name, value in values.items():
            labels = dict(base)
            if name == "DCGM_FI_DEV_XID_ERRORS":
                # The sticky gauge's err_code label changes with the Xid: a new series, the old one ends.
                for code in {0, *((xid[1],) if xid else ())}:
                    key = _selector(name, {**labels, "err_code": str(code), "err_msg": gpus.xid_text(code)})
                    columns.setdefault(key, []).append(float(code) if code == last_xid else None)
                continue
            columns.setdefault(_selector(name, labels), []).append(float(value))
        # dcgm-exporter's windowed Xid count (5 min): an xid-labelled series while the window holds the event,
        # otherwise one 0-valued series without the label.
        window = {**base, "window_size_in_ms": "300000"}
        in_window = xid is not None and xid[0] <= t < xid[0] + 300
        columns.setdefault(_selector("DCGM_EXP_XID_ERRORS_COUNT", window), []).append(
            None if in_window else 0.0
        )
        if xid:
            key = _selector("DCGM_EXP_XID_ERRORS_COUNT", {**window, "xid": str(xid[1])})
            columns.setdefault(key, []).append(1.0 if in_window else None)
    out = {k: _present(times, iter(_staled(v)), gone) for k, v in columns.items()}
    out[_selector("up", {"instance": f"{node}:9400", "job": "dcgm-exporter"})] = [
        0.0 if t >= gone else 1.0 for t in times
    ]
    return out


def _staled(values: list[Value]) -> list[Value]:
    """A series that stops being exported (None after samples) gets a staleness marker first."""
    out: list[Value] = []
    for v in values:
        out.append(STALE if v is None and out and out[-1] not in (None, STALE) else v)
    return out


def _training_series(s: Scenario, story: _Story, node: str) -> dict[str, list[Value]]:
    rank_index = NODES.index(node)
    rank = story.ranks[node]
    labels = {
        "train_job": TRAIN_JOB,
        "slurm_job_id": JOB_ID,
        "Hostname": node,
        "instance": f"{node}:9464",
        "job": "train",
    }
    times = s.times()
    steps: list[float] = []
    own: list[float] = []
    done = own_total = 0.0
    last = float(s.start)
    for t in times:
        if t > s.start:
            stepping_until = min(rank.stepping_until, story.hung_from, rank.exits)
            running = max(0.0, min(t, stepping_until) - max(last, s.start))
            speed = s.straggler_speed if t > story.job_speed_from else 1.0
            new = running * speed / STEP_SECONDS
            done += new
            slow_self = node == CULPRIT and t > story.job_speed_from
            own_total += new * (rank.own_work / s.straggler_speed if slow_self else rank.own_work)
            last = t
        steps.append(done)
        own.append(own_total)
    columns: dict[str, list[Value]] = {}

    def job_series(name: str, values: list[float], extra: dict[str, str] | None = None) -> None:
        columns[_selector(name, {**labels, **(extra or {})})] = [
            v if s.start <= t else None for t, v in zip(times, values, strict=True)
        ]

    job_series("training_step_total", [math.floor(v) for v in steps])
    job_series("training_samples_total", [math.floor(v) * SAMPLES_PER_STEP for v in steps])
    rank_labels = {"rank": str(rank_index)}
    job_series("training_rank_step_seconds_count", [math.floor(v) for v in steps], rank_labels)
    job_series("training_rank_step_seconds_sum", own, rank_labels)
    for error_class in ERROR_CLASSES:
        counted = [
            1.0 if rank.error and rank.error[1] == error_class and t >= rank.error[0] else 0.0 for t in times
        ]
        job_series("training_errors_total", counted, {"error_class": error_class})
    interval = s.checkpoint_interval
    job_series(
        "training_last_checkpoint_timestamp_seconds",
        [s.start + math.floor(max(t - s.start, 0) / interval) * interval for t in times],
    )
    job_series("training_checkpoint_in_progress", [0.0 for _ in times])
    job_series(
        "training_loss",
        [math.nan if t >= story.nan_from else 2.0 - 0.1 * (t - s.start) / 3600 for t in times],
    )
    return {k: _present(times, iter(v), rank.exits) for k, v in columns.items()}


def _node_series(s: Scenario, story: _Story, node: str) -> dict[str, list[Value]]:
    times = s.times()
    culprit = node == CULPRIT
    gone = story.host_down if culprit else math.inf
    instance = f"{node}:9100"
    out: dict[str, list[Value]] = {}
    out[_selector("node_uname_info", {"instance": instance, "job": "node", "nodename": node})] = _present(
        times, iter([1.0 for _ in times]), gone
    )
    warning = story.warning if culprit else None
    metric, rate = WARNING_RATES["infiniband_errors"]
    port = {"instance": instance, "job": "node", "device": "mlx5_0", "port": "1"}
    rising = warning is not None and warning[1] == "infiniband_errors"
    out[_selector(metric, port)] = _present(
        times,
        iter(
            [
                float(int(rate * (t - warning[0]))) if rising and warning and t >= warning[0] else 0.0
                for t in times
            ]
        ),
        gone,
    )
    out[_selector("node_infiniband_link_error_recovery_total", port)] = _present(
        times, iter([0.0 for _ in times]), gone
    )
    out[_selector("up", {"instance": instance, "job": "node"})] = [0.0 if t >= gone else 1.0 for t in times]
    # The Slurm exporter: ALLOCATED while the job holds it; DOWN and not responding after SlurmdTimeout.
    down_at = story.host_down + SLURMD_TIMEOUT if culprit else math.inf
    node_labels = {"node_name": node, "state_is_drain": "false", "state_is_maintenance": "false"}
    up_key = _selector(
        "slurm_node_info",
        {**node_labels, "state_base": "ALLOCATED", "state_is_not_responding": "", "reason": ""},
    )
    down_key = _selector(
        "slurm_node_info",
        {**node_labels, "state_base": "DOWN", "state_is_not_responding": "true", "reason": "Not responding"},
    )
    out[up_key] = _staled([1.0 if t < down_at else None for t in times])
    if culprit and story.host_down < math.inf:
        out[down_key] = [1.0 if t >= down_at else None for t in times]
    return out
