"""Command lines for the simulator's processes, so tests, the demo and the Makefile start them one way.

Start each argv with :data:`REPO_ROOT` as the working directory (``python -m sim...`` imports from there).
One exporter per node gives one scrape target per node, as on a real cluster (a node's exporter can then be
down alone); one exporter may also serve several nodes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


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

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self, python: str = sys.executable) -> list[str]:
        options = {
            "--name": self.name,
            "--port": str(self.port),
            "--state-dir": str(self.state_dir),
            "--checkpoint-dir": str(self.checkpoint_dir),
            "--hostname": self.hostname,
            "--slurm-job-id": self.slurm_job_id,
            "--namespace": self.namespace,
            "--pod": self.pod,
            "--step-seconds": str(self.step_seconds),
            "--checkpoint-every": str(self.checkpoint_every),
            "--linger": str(self.linger),
        }
        return [python, "-m", "sim.trainer", *(item for pair in options.items() for item in pair)]
