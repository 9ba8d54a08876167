"""Capture the example payloads in alerts/examples/ from a real Alertmanager run.

    PYTHONPATH=. .venv/bin/python alerts/capture_examples.py [OUTPUT_DIR]    # default alerts/examples; ~1 minute

Starts the simulated cluster (node1, node2) with a training job on node1 (Slurm job id 4242, no Slurm needed),
Prometheus with the fast rules (rules/sim/), and Alertmanager running the shipped alerts/alertmanager.yml pointed
at a recording webhook. Then it injects, in turn, Xid 79 on node1 GPU 3 (→ ``gpu-xid-79.json``), clears it
(→ ``gpu-xid-79-resolved.json``), hangs the job (→ ``training-hang.json``), restarts it and makes it fail with an
NCCL error (→ ``nccl-error.json``). Each file is the JSON body Alertmanager POSTed, indented.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim import faults
from sim.cluster import REPO_ROOT
from sim.stack import FAST_RULES, launch_alertmanager, launch_prometheus, nightshift_config
from sim.webhook_sink import WebhookSink
from tests.fixtures.procs import wait_until
from tests.fixtures.sim import launch_sim_cluster

TOKEN = "capture-examples-token"
JOB_ID = "4242"
TIMEOUT = 60.0


class Recorder(WebhookSink):
    """A webhook receiver that keeps every JSON body Alertmanager POSTs with the expected bearer token."""

    def wait(self, what: str, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first payload received that satisfies ``wanted``."""
        return wait_until(lambda: next(filter(wanted, self.bodies()), None), TIMEOUT, what)  # type: ignore[return-value]


def alerting(status: str, alertname: str, **labels: str) -> Callable[[dict[str, Any]], bool]:
    """A payload of ``status`` holding an alert ``alertname`` (with that status) carrying ``labels``."""

    def wanted(body: dict[str, Any]) -> bool:
        return body["status"] == status and any(
            alert["status"] == status
            and alert["labels"].get("alertname") == alertname
            and labels.items() <= alert["labels"].items()
            for alert in body["alerts"]
        )

    return wanted


def save(directory: Path, name: str, body: dict[str, Any]) -> None:
    (directory / name).write_text(json.dumps(body, indent=2) + "\n")
    print(f"wrote {directory / name}", flush=True)


def capture(out: Path, work: Path) -> None:
    recorder = Recorder(token=TOKEN)
    (work / "token").write_text(TOKEN)
    cluster = launch_sim_cluster(work / "sim", nodes=("node1", "node2"))
    try:
        trainer = cluster.start_trainer("llama-7b", "node1", slurm_job_id=JOB_ID)
        alertmanager = launch_alertmanager(
            work / "alertmanager", nightshift_config(recorder.url(), work / "token")
        )
        try:
            prometheus = launch_prometheus(
                work / "prometheus", [*cluster.targets, trainer.target], FAST_RULES, alertmanager.url
            )
            try:
                mapped = f'DCGM_FI_DEV_GPU_TEMP{{Hostname="node1",hpc_job="{JOB_ID}"}}'
                wait_until(lambda: prometheus.query(mapped), TIMEOUT, "node1's GPUs mapped to the job")

                faults.inject_xid(cluster.state_dir, "node1", 3, 79)
                xid = alerting("firing", "GpuXidError", xid="79", slurm_job_id=JOB_ID)
                save(out, "gpu-xid-79.json", recorder.wait("GpuXidError firing", xid))
                faults.clear(cluster.state_dir, node="node1")
                resolved = alerting("resolved", "GpuXidError", xid="79", slurm_job_id=JOB_ID)
                save(out, "gpu-xid-79-resolved.json", recorder.wait("GpuXidError resolved", resolved))

                faults.inject_job_fault(cluster.state_dir, "llama-7b", "hang")
                hang = alerting("firing", "TrainingHang", slurm_job_id=JOB_ID)
                save(out, "training-hang.json", recorder.wait("TrainingHang firing", hang))

                trainer.daemon.stop()  # the hung job is killed and started again, as the hang playbook does
                cluster.restart(trainer.spec)
                faults.inject_job_fault(cluster.state_dir, "llama-7b", "nccl")
                nccl = alerting("firing", "TrainingJobError", error_class="nccl", slurm_job_id=JOB_ID)
                save(out, "nccl-error.json", recorder.wait("TrainingJobError (nccl) firing", nccl))
            finally:
                prometheus.stop()
        finally:
            alertmanager.stop()
    finally:
        cluster.close()
        recorder.close()


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else REPO_ROOT / "alerts" / "examples"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="capture-examples-") as work:
        capture(out, Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
