"""Signals follow a requeued job on the real stack, with no configuration change: Prometheus finds the job's
progress endpoint through Nightshift's ``/api/v1/sd/training`` (no static trainer target exists) and scrapes the new
node's address after the requeue; the GPUs of the new node carry the job (Slurm's prolog wrote the HPC job
mapping), those of the old node no longer do (its epilog removed it)."""

from __future__ import annotations

import pytest

from sim.stack import NODE_ADDRESSES, Stack
from tests.fixtures.procs import wait_until

pytestmark = pytest.mark.e2e


def test_a_requeued_job_is_scraped_and_mapped_on_its_new_node(advisory_stack: Stack) -> None:
    stack = advisory_stack
    job = stack.submit_trainer("llama-7b", "node1")
    stack.wait_training(job, "node1")
    (before,) = stack.prometheus.query(f'training_step_total{{slurm_job_id="{job}"}}')
    port = before["metric"]["instance"].rsplit(":", 1)[1]
    assert before["metric"]["job"] == "training"  # the http_sd scrape job: nothing else scrapes trainers
    assert before["metric"]["instance"] == f"{NODE_ADDRESSES['node1']}:{port}"

    stack.slurm.command("scontrol", "requeue", job)
    stack.slurm.command("scontrol", "update", f"JobId={job}", "ExcNodeList=node1", "ReqNodeList=")
    (node,) = stack.wait_running(job, avoid=["node1"])

    moved = f'training_step_total{{slurm_job_id="{job}",Hostname="{node}",job="training"}}'
    (after,) = wait_until(lambda: stack.prometheus.query(moved), 60, f"job {job}'s steps on {node}")
    assert after["metric"]["instance"] == f"{NODE_ADDRESSES[node]}:{port}"
    wait_until(
        lambda: stack.prometheus.query(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{node}",hpc_job="{job}"}}'),
        30,
        f"{node}'s GPUs mapped to job {job}",
    )
    wait_until(
        lambda: not stack.prometheus.query(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="node1",hpc_job="{job}"}}'),
        30,
        f"node1's GPUs no longer mapped to job {job}",
    )
