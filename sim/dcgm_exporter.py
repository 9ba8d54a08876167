"""A dcgm-exporter look-alike.

``python -m sim.dcgm_exporter --port P --nodes node1,node2 --gpus 8 --state-dir D`` exposes, for every node
and GPU, the metrics of dcgm-exporter 3.3+/4.x with its exact names, types, help texts and labels (``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``;
``err_code``/``err_msg`` on the sticky Xid gauge; ``window_size_in_ms``/``xid`` on the Xid count; ``hpc_job``
from the HPC job mapping; ``pod``/``namespace``/``container`` with ``--kubernetes``).

Every scrape reads the state directory (:mod:`sim.statedir`): the faults (:mod:`sim.faults`), the HPC job
mapping ``D/hpc-jobs/<node>/<gpu>`` (dcgm-exporter's format, written by deploy/slurm/hpc-job-mapping.sh) and the
trainers' status, which drives utilisation (busy while a job steps on the node, idle when it hangs). Nothing is
kept in memory, so a restarted exporter reports the same faults.
"""

from __future__ import annotations

import argparse
import math
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim import faults, gpus, statedir
from sim.exposition import serve

# A worker whose status has not been refreshed for this long is not stepping (sim.torch_trainer beats every step).
HEARTBEAT_STALE_SECONDS = 3.0
# (name, type, help) in dcgm-exporter's order; help texts from its default-counters.csv.
METRICS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
    ),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)",
    ),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
)
XID_COUNT = (
    "DCGM_EXP_XID_ERRORS_COUNT",
    "gauge",
    "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
)
GPU_IDLE, HW_SLOWDOWN, HW_THERMAL = 0x1, 0x8, 0x40


@dataclass(frozen=True)
class NodeLoad:
    """What runs on a node: ``state`` is idle, busy or hung; ``speed`` 1/slowdown; K8s pod of the job."""

    state: str = "idle"
    speed: float = 1.0
    namespace: str = ""
    pod: str = ""


def node_loads(state_dir: Path, fault_state: faults.FaultState) -> dict[str, NodeLoad]:
    """Load per node, from the status of live trainers (a trainer killed with SIGKILL counts as gone)."""
    loads = {}
    for status in statedir.read_trainers(state_dir):
        live = statedir.pid_alive(int(status.get("pid", 0)))
        if not live or status.get("phase") not in ("running", "hung"):
            continue
        slowdown = float(fault_state.job(status["name"]).get("slowdown", 1.0))
        # A real torch worker beats every step: one that stopped beating (stopped, or stuck in a collective) has
        # idle GPUs, as a rank waiting on a dead peer has once the collective gives up.
        stalled = time.time() - float(status.get("heartbeat", math.inf)) > HEARTBEAT_STALE_SECONDS
        loads[status["hostname"]] = NodeLoad(
            state="busy" if status["phase"] == "running" and not stalled else "hung",
            speed=1.0 / max(slowdown, 1.0),
            namespace=status.get("namespace", ""),
            pod=status.get("pod", ""),
        )
    return loads


def gpu_values(
    load: NodeLoad, gpu_faults: faults.GpuFaults, last_xid: int, now: float, rng: random.Random
) -> dict[str, float]:
    """One reading of one GPU: metric name → value (pure apart from the noise drawn from ``rng``)."""
    activity = {"busy": 0.93 * load.speed, "hung": 0.005, "idle": 0.0}[load.state]
    if load.state == "busy":
        activity = min(max(activity + rng.gauss(0, 0.015), 0.0), 1.0)
    in_use = load.state != "idle"
    fb_used = 71234 + rng.randint(-64, 64) if in_use else 0
    reasons = GPU_IDLE if not in_use else 0
    temp = 33 + 36 * activity + (8 if in_use else 0) + rng.gauss(0, 0.6)
    sm_clock = 1980 if in_use else 345
    if gpu_faults.thermal:
        reasons |= HW_SLOWDOWN | HW_THERMAL
        temp, sm_clock = 91 + rng.gauss(0, 0.5), 1185
    nvlink_errors = gpu_faults.nvlink_rate * max(now - gpu_faults.nvlink_since, 0.0)
    sbe_errors = gpu_faults.ecc_sbe_rate * max(now - gpu_faults.ecc_sbe_since, 0.0)
    return {
        "DCGM_FI_DEV_SM_CLOCK": sm_clock,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_GPU_TEMP": round(temp),
        "DCGM_FI_DEV_POWER_USAGE": 72 + 560 * activity + (40 if in_use else 0) + rng.gauss(0, 4),
        "DCGM_FI_DEV_GPU_UTIL": round(100 * activity) if load.state == "busy" else 0,
        "DCGM_FI_DEV_XID_ERRORS": last_xid,
        "DCGM_FI_DEV_FB_FREE": gpus.FB_TOTAL_MIB - 516 - fb_used,
        "DCGM_FI_DEV_FB_USED": fb_used,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": int(sbe_errors),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": gpu_faults.ecc_dbe,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": int(gpu_faults.row_remap_failure),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": int(gpu_faults.row_remap_failure),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": int(nvlink_errors),
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": int(nvlink_errors / 5),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": reasons,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": activity,
    }


def _label_text(labels: Sequence[tuple[str, str]]) -> str:
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in labels)
    return ",".join(f'{name}="{value}"' for (name, _), value in zip(labels, escaped, strict=True))


def _format_value(value: float) -> str:
    # dcgm-exporter prints integer fields with %d and double fields with %f.
    return str(value) if isinstance(value, int) else f"{value:f}"


class Exporter:
    """Renders the exposition text for ``gpu_count`` GPUs on each of ``nodes`` from the state directory."""

    def __init__(
        self,
        state_dir: Path,
        nodes: Sequence[str],
        gpu_count: int,
        kubernetes: bool = False,
        xid_window_ms: int = 300_000,
        rng: random.Random | None = None,
    ):
        self.state_dir = state_dir
        self.nodes = list(nodes)
        self.gpu_count = gpu_count
        self.kubernetes = kubernetes
        self.xid_window_ms = xid_window_ms
        self.rng = rng or random.Random()

    def _base_labels(self, node: str, gpu: int, load: NodeLoad) -> list[tuple[str, str]]:
        labels = [
            ("gpu", str(gpu)),
            ("UUID", gpus.gpu_uuid(node, gpu)),
            ("pci_bus_id", gpus.pci_bus_id(gpu)),
            ("device", f"nvidia{gpu}"),
            ("modelName", gpus.MODEL),
            ("Hostname", node),
            ("DCGM_FI_DRIVER_VERSION", gpus.DRIVER_VERSION),
        ]
        if self.kubernetes and load.pod:
            labels += [("pod", load.pod), ("namespace", load.namespace), ("container", "trainer")]
        return labels

    def _job_labels(self, node: str, gpu: int, base: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
        """``base`` once per job in the GPU's mapping file (``hpc_job`` added), or once as is without one."""
        try:
            jobs = (statedir.hpc_job_dir(self.state_dir, node) / str(gpu)).read_text().split()
        except FileNotFoundError:
            jobs = []
        return [[*base, ("hpc_job", job)] for job in jobs] or [base]

    def samples(self, now: float | None = None) -> dict[str, list[str]]:
        """Sample lines per metric name for one scrape."""
        now = time.time() if now is None else now
        fault_state = faults.load(self.state_dir)
        loads = node_loads(self.state_dir, fault_state)
        lines: dict[str, list[str]] = {name: [] for name, _, _ in (*METRICS, XID_COUNT)}
        for node in self.nodes:
            load = loads.get(node, NodeLoad())
            for gpu in range(self.gpu_count):
                gpu_faults = fault_state.gpu(node, gpu)
                if gpu_faults.vanished:
                    continue
                events = fault_state.xid_events(node, gpu)
                last_xid = events[-1].xid if events else 0
                # Like dcgm-exporter: one series per job mapped to the GPU (hpc_job), or one without the label.
                for base in self._job_labels(node, gpu, self._base_labels(node, gpu, load)):
                    for name, value in gpu_values(load, gpu_faults, last_xid, now, self.rng).items():
                        labels = base
                        if name == "DCGM_FI_DEV_XID_ERRORS":
                            labels = [
                                *base,
                                ("err_code", str(last_xid)),
                                ("err_msg", gpus.xid_text(last_xid)),
                            ]
                        lines[name].append(f"{name}{{{_label_text(labels)}}} {_format_value(value)}")
                    lines[XID_COUNT[0]] += self._xid_count_lines(base, events, now)
        return lines

    def _xid_count_lines(
        self, base: list[tuple[str, str]], events: list[faults.XidEvent], now: float
    ) -> list[str]:
        window = self.xid_window_ms / 1000
        counts: dict[int, int] = {}
        for event in events:
            if now - event.at <= window:
                counts[event.xid] = counts.get(event.xid, 0) + 1
        labels = [*base, ("window_size_in_ms", str(self.xid_window_ms))]
        if not counts:  # like dcgm-exporter: one 0-valued series without an xid label
            return [f"{XID_COUNT[0]}{{{_label_text(labels)}}} 0"]
        return [
            f"{XID_COUNT[0]}{{{_label_text([*labels, ('xid', str(xid))])}}} {count}"
            for xid, count in sorted(counts.items())
        ]

    def render(self) -> bytes:
        """The whole exposition text (format 0.0.4)."""
        lines = self.samples()
        out: list[str] = []
        for name, kind, help_text in (*METRICS, XID_COUNT):
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines[name]]
        return ("\n".join(out) + "\n").encode()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.dcgm_exporter", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--nodes", required=True, help="comma-separated node names (Hostname label)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--kubernetes", action="store_true", help="add pod/namespace/container of the job")
    parser.add_argument("--xid-window-ms", type=int, default=300_000, help="DCGM_EXP_XID_ERRORS_COUNT window")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    nodes = [n for n in args.nodes.split(",") if n]
    exporter = Exporter(args.state_dir, nodes, args.gpus, args.kubernetes, args.xid_window_ms)
    serve(exporter.render, args.host, args.port)
    print(f"sim dcgm-exporter: {len(nodes)} node(s) x {args.gpus} GPU(s) on :{args.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
