"""What interrupts a training job, how often, and where each rate comes from (pure: no I/O).

The unexpected interruptions are the counts of table 5 of "The Llama 3 Herd of Models" (Meta, 2024, arXiv
2407.21783, section 3.3.4): 419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100s,
with 47 planned ones beside them (466 in all). The table's counts are used as published; its percentage column is
not: it prints 30.1% for the 148 faulty-GPU interruptions, which is 148/419 = 35.3% (the other rows agree with
their counts, and the text's "GPU issues 58.7%" is the sum of the printed percentages, so it inherits the typo; the
counts give 268/419 = 64.0%). Every rate here is per GPU-day, so a job of N GPUs sees N times it: interruptions,
hangs, stragglers and warnings all scale with the job's size.

Processes the table does not count (an interruption is a restart: a straggler that never caused one, or a warning,
is not in it) come from other public sources where one exists, and are stated assumptions otherwise;
:data:`SOURCES` says which for every parameter, and the benchmark sweeps the assumed ones.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

LLAMA3 = '"The Llama 3 Herd of Models" (Meta, 2024), table 5'
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_UNEXPECTED = 419
LLAMA3_PLANNED = 47
LLAMA3_ETTR = 0.90  # "higher than 90% effective training time" (section 3.3.4)
LLAMA3_PRINTED_FAULTY_GPU_SHARE = 0.301  # the typo: the row's count gives 148/419 = 0.353


@dataclass(frozen=True)
class Cause:
    """One row of the Llama 3 table and the simulated fault it becomes (``kind``, see :data:`KINDS`)."""

    component: str
    category: str
    count: int
    kind: str


# The rows in the paper's order, with its counts.
TABLE5: tuple[Cause, ...] = (
    Cause("Faulty GPU", "GPU", 148, "gpu_fell_off_bus"),
    Cause("GPU HBM3 Memory", "GPU", 72, "gpu_hbm3"),
    Cause("Software Bug", "Dependency", 54, "software_bug"),
    Cause("Network Switch/Cable", "Network", 35, "network_flap"),
    Cause("Host Maintenance", "Unplanned Maintenance", 32, "host_maintenance"),
    Cause("GPU SRAM Memory", "GPU", 19, "gpu_sram"),
    Cause("GPU System Processor", "GPU", 17, "gpu_gsp"),
    Cause("NIC", "Host", 7, "nic"),
    Cause("NCCL Watchdog Timeouts", "Unknown", 7, "nccl_watchdog"),
    Cause("Silent Data Corruption", "GPU", 6, "silent_data_corruption"),
    Cause("GPU Thermal Interface + Sensor", "GPU", 6, "thermal_straggler"),
    Cause("SSD", "Host", 3, "host_hardware"),
    Cause("Power Supply", "Host", 3, "host_hardware"),
    Cause("Server Chassis", "Host", 2, "host_hardware"),
    Cause("IO Expansion Board", "Host", 2, "host_hardware"),
    Cause("Dependency", "Dependency", 2, "dependency_outage"),
    Cause("CPU", "Host", 2, "host_hardware"),
    Cause("System Memory", "Host", 2, "host_hardware"),
)


@dataclass(frozen=True)
class Kind:
    """A simulated fault: what it does to the job and its node. ``node_bound``: it stays on the node until the
    node is repaired (a restart that lands there fails again); ``xid``: the Xid the driver logs (0: none);
    ``warning``: the early-warning signal that can precede it (issue 25: "" for none)."""

    name: str
    effect: str  # crash | stall_then_crash | node_down | hang | slow | nan | outage | planned | warn
    node_bound: bool = False
    xid: int = 0
    warning: str = ""


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        # Xid 79 (fell off the bus): the GPU is gone; a reboot may bring it back (reboot_fixes).
        Kind("gpu_fell_off_bus", "stall_then_crash", node_bound=True, xid=79, warning="pcie_replay"),
        # Xid 48: a double-bit ECC error in HBM3; DCGM counts it (GpuEccDoubleBitError too).
        Kind("gpu_hbm3", "stall_then_crash", node_bound=True, xid=48, warning="ecc_correctable"),
        Kind("gpu_sram", "stall_then_crash", node_bound=True, xid=95, warning="ecc_correctable"),
        Kind("gpu_gsp", "stall_then_crash", node_bound=True, xid=119, warning="pcie_replay"),
        # A rank raises an exception of the training code (no error class of the progress library's); the others
        # wait in their collective until the watchdog takes them down. A restart gets past it (assumed: the
        # paper's software bugs were fixed by later releases, not by the restart; the run goes on).
        Kind("software_bug", "stall_then_crash"),
        # A link flaps: NCCL fails at once on the ranks of the link (IB error), and the job exits; transient.
        Kind("network_flap", "crash"),
        # The node's NIC dies: the same error, but the node is unusable until repaired.
        Kind("nic", "crash", node_bound=True, warning="infiniband_errors"),
        # No cause found: every rank waits for the watchdog, then exits with its timeout.
        Kind("nccl_watchdog", "stall_then_crash"),
        # The node goes away (DOWN in Slurm) for maintenance nobody planned with the job, or a host part fails.
        Kind("host_maintenance", "node_down"),
        Kind("host_hardware", "node_down", node_bound=True),
        # A GPU computes wrong values: the loss turns NaN some time later; checkpoints since the corruption began
        # hold it; the GPU keeps doing it (node-bound).
        Kind("silent_data_corruption", "nan", node_bound=True),
        # A GPU throttles (its thermal interface or sensor fails): the node slows every rank (fail-slow).
        Kind("thermal_straggler", "slow", node_bound=True),
        # The shared file system or object store the job reads fails: every rank gets an I/O error.
        Kind("dependency_outage", "outage"),
        # Not in the table (see SOURCES): a silent hang, a transient fail-slow, and planned maintenance.
        Kind("silent_hang", "hang"),
        Kind("transient_straggler", "slow"),
        Kind("planned_maintenance", "planned"),
    )
}


@dataclass(frozen=True)
class Rates:
    """Arrivals per GPU-day (a job of N GPUs sees N times each) and the assumed shapes of what the table lacks."""

    # Table 5 (and the planned ones), per GPU-day.
    table5_scale: float = 1.0  # 1 = the paper's rates; the benchmark's sweep of the fault rate
    planned_per_gpu_day: float = LLAMA3_PLANNED / (LLAMA3_DAYS * LLAMA3_GPUS)
    # Silent hangs (the watchdog does not fire: a rank stuck outside a collective, a data loader): assumed as
    # frequent as the NCCL watchdog timeouts the table counts.
    silent_hang_per_gpu_day: float = 7 / (LLAMA3_DAYS * LLAMA3_GPUS)
    # Transient fail-slow of one node (contention, a GPU briefly throttled): assumed 1 a day per 4,096 GPUs,
    # lasting 10 min on average (exponential), at 0.6 of the job's speed while it lasts.
    transient_straggler_per_gpu_day: float = 1 / 4096
    transient_straggler_minutes: float = 10.0
    straggler_speed: float = 0.6
    # Issue 25's warnings: the share of node-bound faults with a warning kind whose warning comes first, and
    # how long before the crash the signal starts.
    warned_share: float = 0.3
    warning_lead_hours: float = 2.0
    # Silent data corruption: the loss turns NaN this long after the corruption begins (uniform 0..2x).
    sdc_manifest_minutes: float = 30.0
    # A dependency outage lasts this long.
    dependency_outage_minutes: float = 30.0
    # A host removed by unplanned maintenance comes back after this long.
    host_maintenance_hours: float = 4.0

    def per_gpu_day(self) -> dict[str, float]:
        """Arrival rate of each kind, per GPU-day."""
        rates: dict[str, float] = {}
        for cause in TABLE5:
            rates[cause.kind] = rates.get(cause.kind, 0.0) + self.table5_scale * cause.count / (
                LLAMA3_DAYS * LLAMA3_GPUS
            )
        rates["silent_hang"] = self.silent_hang_per_gpu_day
        rates["transient_straggler"] = self.transient_straggler_per_gpu_day
        rates["planned_maintenance"] = self.planned_per_gpu_day
        return rates

    def interruptions_per_gpu_day(self) -> float:
        """Table 5's unexpected interruptions plus the planned ones (the Llama 3 job's 466 in 54 days)."""
        return self.table5_scale * LLAMA3_UNEXPECTED / (LLAMA3_DAYS * LLAMA3_GPUS) + self.planned_per_gpu_day


# Where each figure comes from ("sourced"), or that it is ours ("assumed", swept in the benchmark), or fitted.
SOURCES: dict[str, str] = {
    "unexpected interruptions": f"{LLAMA3}: 419 in 54 days on 16,384 H100s, per row as counted (the 30.1% printed "
    "for faulty GPUs is a typo of 148/419 = 35.3%)",
    "planned interruptions": f"{LLAMA3} text: 47 planned (firmware upgrades, configuration or dataset updates); "
    "scaled with GPUs (assumed)",
    "silent hangs": "assumed: as many as the table's NCCL watchdog timeouts (7 per 54 days on 16,384 GPUs); "
    "ByteRobust (ByteDance, arXiv 2509.16293) names job hangs among its implicit failures without a rate",
    "transient stragglers": "assumed rate (1 a day per 4,096 GPUs); duration 10 min mean for compute fail-slows "
    "(Greyhound/Falcon, Alibaba, USENIX ATC 2025 / arXiv 2410.12588: fail-slows last from tens of seconds to "
    "nearly ten hours); speed 0.6 (assumed, the throttled clocks of sim/dcgm_exporter.py: 1185 of 1980 MHz)",
    "persistent stragglers": f"{LLAMA3}: GPU Thermal Interface + Sensor, 6 interruptions",
    "warnings before a crash": "assumed: 30% of the node-bound GPU and NIC faults give a warning "
    "(correctable ECC, PCIe replays, InfiniBand errors) starting 2 h before the crash; no public source gives the "
    "share (Cui et al., arXiv 2503.11901, trace error propagation on Delta without one)",
    "silent data corruption": f"{LLAMA3}: 6; the loss turns NaN 0-60 min after it begins (assumed)",
    "dependency outage": f"{LLAMA3}: Dependency, 2; 30 min long (assumed)",
    "host maintenance": f"{LLAMA3}: Host Maintenance (unplanned), 32; the node is back after 4 h (assumed)",
    "calibration target": f"{LLAMA3} text: higher than 90% effective training time on 16,384 GPUs; ByteRobust "
    "reports 97% on 9,600 GPUs over three months",
}


@dataclass
class Fault:
    """One fault of a run: ``at`` seconds after the start, of ``kind``; ``node`` is drawn from the job's
    allocation when it strikes; ``warned``: its warning signal starts ``lead`` seconds before ``at``; ``length``:
    how long a transient one lasts (outages, transient stragglers, SDC's delay before the NaN)."""

    at: float
    kind: str
    gpu: int = 0
    warned: bool = False
    lead: float = 0.0
    length: float = 0.0
    pick: float = 0.0  # which node of the allocation it strikes (a share of it: the same for every policy)
    node: str = ""

    def copy(self) -> Fault:
        return replace(self)


@dataclass(frozen=True)
class Draw:
    """The random choices of one run, shared by every policy (the same faults, at the same times)."""

    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def copies(self) -> list[Fault]:
        return [f.copy() for f in self.faults]


def draw_faults(rates: Rates, gpus: int, days: float, seed: int, gpus_per_node: int = 8) -> Draw:
    """Poisson arrivals of every kind over ``days`` for a job of ``gpus`` GPUs (nodes are drawn later, from the
    allocation of the moment). Each kind draws from its own stream of ``seed``, so changing one kind's rate (a
    sweep) leaves the others' faults where they were."""
    horizon = days * 86400
    faults: list[Fault] = []
    for kind, per_gpu_day in sorted(rates.per_gpu_day().items()):
        rng = random.Random(f"{seed}/{kind}")
        rate = per_gpu_day * gpus / 86400
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= horizon:
                break
            faults.append(_fault(kind, t, rates, rng, gpus_per_node))
    return Draw(tuple(sorted(faults, key=lambda f: f.at)))


def _fault(kind: str, at: float, rates: Rates, rng: random.Random, gpus_per_node: int) -> Fault:
    fault = Fault(at, kind, gpu=rng.randrange(gpus_per_node), pick=rng.random())
    if KINDS[kind].warning and rng.random() < rates.warned_share:
        fault.warned, fault.lead = True, rates.warning_lead_hours * 3600
    if kind == "transient_straggler":
        fault.length = rng.expovariate(1 / (rates.transient_straggler_minutes * 60))
    elif kind == "dependency_outage":
        fault.length = rates.dependency_outage_minutes * 60
    elif kind == "host_maintenance":
        fault.length = rates.host_maintenance_hours * 3600
    elif kind == "silent_data_corruption":
        fault.length = rng.uniform(0, 2 * rates.sdc_manifest_minutes * 60)
    return fault


def young_daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval that minimises the expected lost time, sqrt(2 C MTBF) (Young 1974; Daly 2006)."""
    return math.sqrt(2 * checkpoint_seconds * mtbf_seconds)


def table_shares(rows: Iterable[Cause] = TABLE5) -> dict[str, float]:
    """Each row's share of the unexpected interruptions, from its count (not the printed percentage)."""
    rows = list(rows)
    total = sum(c.count for c in rows)
    return {c.component: c.count / total for c in rows}
