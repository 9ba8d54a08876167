"""Command lines for the simulator's processes, so tests, the demo and the Makefile start them one way.

Start each argv with :data:`REPO_ROOT` as the working directory (``python -m sim...`` imports from there).
One exporter per node gives one scrape target per node, as on a real cluster (a node's exporter can then be
down alone); one exporter may also serve several nodes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import requests

from sim.procs import Daemon, free_port, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
# Slurm's Prolog/Epilog writing dcgm-exporter's HPC job mapping (the simulated exporter reads the same files).
HPC_JOB_MAPPING = REPO_ROOT / "deploy" / "slurm" / "hpc-job-mapping.sh"


@dataclass(frozen=True)
class ExporterSpec:
    port: int
    nodes: tuple[str, ...]
    state_dir: Path
    gpus: int = 8
    kubernetes: bool = False
    xid_window_ms: int = 300_000

    @property
    def target(self) -> str:
        """The Prometheus scrape target (``host:port``)."""
        return f"127.0.0.1:{self.port}"

    def argv(self, python: str = sys.executable) -> list[str]:
        argv = [python, "-m", "sim.dcgm_exporter", "--port", str(self.port), "--nodes", ",".join(self.nodes)]
        argv += ["--gpus", str(self.gpus), "--state-dir", str(self.state_dir)]
        argv += ["--xid-window-ms", str(self.xid_window_ms)]
        return [*argv, "--kubernetes"] if self.kubernetes else argv


@dataclass(frozen=True)
class TrainerSpec:
    """A ``sim.trainer`` command line. ``node_ports`` (node → port), when given, replaces ``port``: the trainer
    serves on the port of the node it runs on; ``node_hosts`` (node → address): on the address of that node.
    ``rank``/``world_size`` place it in a multi-node job."""

    name: str
    port: int
    state_dir: Path
    checkpoint_dir: Path
    hostname: str
    slurm_job_id: str = ""
    namespace: str = ""
    pod: str = ""
    step_seconds: float = 0.2
    checkpoint_every: int = 25
    linger: float = 3.0
    rank: int = 0
    world_size: int = 1
    node_ports: tuple[tuple[str, int], ...] = ()
    node_hosts: tuple[tuple[str, str], ...] = ()
    exit_on_gpu_fault: bool = False

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self, python: str = sys.executable) -> list[str]:
        ports = ",".join(f"{node}={port}" for node, port in self.node_ports)
        port = {"--node-ports": ports} if self.node_ports else {"--port": str(self.port)}
        if self.node_hosts:
            port["--node-hosts"] = ",".join(f"{node}={host}" for node, host in self.node_hosts)
        options = {
            "--name": self.name,
            **port,
            "--state-dir": str(self.state_dir),
            "--checkpoint-dir": str(self.checkpoint_dir),
            "--hostname": self.hostname,
            "--slurm-job-id": self.slurm_job_id,
            "--namespace": self.namespace,
            "--pod": self.pod,
            "--step-seconds": str(self.step_seconds),
            "--checkpoint-every": str(self.checkpoint_every),
            "--linger": str(self.linger),
            "--rank": str(self.rank),
            "--world-size": str(self.world_size),
        }
        flags = ["--exit-on-gpu-fault"] if self.exit_on_gpu_fault else []
        return [python, "-m", "sim.trainer", *(item for pair in options.items() for item in pair), *flags]


# --- running it -----------------------------------------------------------------------------------------------

START_TIMEOUT = 20.0


def scrape(target: str) -> str:
    """The ``/metrics`` text of ``host:port``."""
    response = requests.get(f"http://{target}/metrics", timeout=5)
    response.raise_for_status()
    return response.text


@dataclass
class SimProcess:
    """A started simulator process and the spec it was started from."""

    daemon: Daemon
    spec: ExporterSpec | TrainerSpec

    @property
    def target(self) -> str:
        return self.spec.target

    def log(self) -> str:
        return self.daemon.log_path.read_text(errors="replace")


class SimCluster:
    """Processes of one simulated cluster sharing ``state_dir``; :meth:`close` stops them all."""

    def __init__(self, base_dir: Path, gpus: int = 8, kubernetes: bool = False, xid_window_ms: int = 300_000):
        self.base_dir = base_dir
        self.state_dir = base_dir / "state"
        self.log_dir = base_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.gpus = gpus
        self.kubernetes = kubernetes
        self.xid_window_ms = xid_window_ms
        self.processes: list[SimProcess] = []
        self.exporters: dict[str, SimProcess] = {}

    def _start(self, name: str, spec: ExporterSpec | TrainerSpec, ready: str) -> SimProcess:
        process = SimProcess(Daemon(name, spec.argv(), self.log_dir, cwd=REPO_ROOT), spec)
        self.processes.append(process)
        try:
            wait_until(
                lambda: process.daemon.alive() and ready in scrape(spec.target),
                START_TIMEOUT,
                f"{name} metrics",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{process.daemon.log_tail()}") from None
        return process

    def start_exporter(self, node: str) -> SimProcess:
        """Start (or start again) the exporter of ``node`` on a fresh port."""
        spec = ExporterSpec(
            free_port(), (node,), self.state_dir, self.gpus, self.kubernetes, self.xid_window_ms
        )
        self.exporters[node] = self._start(f"exporter-{node}", spec, ready="# TYPE")
        return self.exporters[node]

    def start_trainer(self, name: str, node: str, slurm_job_id: str = "", **options: Any) -> SimProcess:
        """Start ``sim.trainer`` on ``node``; options are :class:`TrainerSpec` fields (step_seconds, ...)."""
        spec = TrainerSpec(
            name=name,
            port=free_port(),
            state_dir=self.state_dir,
            checkpoint_dir=self.base_dir / "checkpoints" / name,
            hostname=node,
            slurm_job_id=slurm_job_id,
        )
        return self.restart(replace(spec, **options))

    def restart(self, spec: TrainerSpec) -> SimProcess:
        """Start a trainer from ``spec`` (again: same identity and checkpoints, a new process and log). With a
        Slurm job id, its node's GPUs are first mapped to the job as Slurm's prolog maps them: by running
        deploy/slurm/hpc-job-mapping.sh; the mapping stays for the life of the cluster."""
        if spec.slurm_job_id:
            self.map_job(spec.slurm_job_id, spec.hostname, "prolog")
        runs = sum(1 for p in self.processes if isinstance(p.spec, TrainerSpec) and p.spec.name == spec.name)
        return self._start(f"{spec.name}-{runs}", spec, ready="training_step_total")

    @property
    def targets(self) -> list[str]:
        """Scrape targets of the exporters (trainers' targets are on their :class:`SimProcess`)."""
        return [process.target for process in self.exporters.values()]

    def map_job(self, job: str, node: str, mode: str) -> None:
        """Run the shipped prolog (``mode`` prolog) or epilog for ``job`` on ``node`` against this cluster's
        mapping directory, with the environment slurmd would give it."""
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "SLURM_JOB_ID": job,
            "SLURMD_NODENAME": node,
            "HPC_JOB_MAPPING_DIR": str(self.state_dir / "hpc-jobs" / "%n"),
            "NODE_GPUS": f"0-{self.gpus - 1}",
        }
        subprocess.run([str(HPC_JOB_MAPPING), mode], env=env, check=True, capture_output=True, timeout=30)

    def close(self) -> None:
        for process in reversed(self.processes):
            process.daemon.stop()


def launch_sim_cluster(
    base_dir: Path, nodes: Sequence[str] = ("node1", "node2"), **options: Any
) -> SimCluster:
    """Start one exporter per node under ``base_dir`` (options: gpus, kubernetes, xid_window_ms).

    The caller must ``close()`` the cluster; if a start fails, what was started is stopped.
    """
    cluster = SimCluster(base_dir, **options)
    try:
        for node in nodes:
            cluster.start_exporter(node)
    except BaseException:
        cluster.close()
        raise
    return cluster
