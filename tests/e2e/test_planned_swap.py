"""A planned swap on the real stack: correctable ECC errors rise on node1's GPU 0 under a running job (simulated
exporter → Prometheus fast rules: GpuEccCorrectableRising, an early warning) → Alertmanager → Nightshift's
planned-swap-slurm: the job is asked to checkpoint (``scancel --signal=USR1``: it announced the signal in its comment),
Nightshift waits for the new checkpoint marker, requeues the job off node1, the job resumes on another node from
that checkpoint, and node1 goes to the repair lifecycle (advisory here: its reboot step is not granted)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from sim import faults
from sim.stack import Stack

pytestmark = pytest.mark.e2e

PLAYBOOK = "planned-swap-slurm"


@dataclass(frozen=True)
class Swapped:
    job: str
    detail: dict[str, Any]
    last_step_on_node1: int


@pytest.fixture(scope="module")
def swapped(stack: Stack) -> Swapped:
    job = stack.submit_trainer("swap-me", "node1")
    stack.wait_training(job, "node1")
    faults.inject_gpu_fault(stack.sim.state_dir, "node1", 0, "ecc_sbe")
    incident = stack.wait_incident(PLAYBOOK, timeout=60)
    detail = stack.wait_closed(incident["id"], timeout=180)
    last = stack.prometheus.query(
        f'max_over_time(training_step_total{{slurm_job_id="{job}",Hostname="node1"}}[10m])'
    )
    return Swapped(job, detail, int(float(last[0]["value"][1])) if last else -1)


def test_the_job_checkpoints_on_request_then_moves_off_the_warning_node(
    stack: Stack, swapped: Swapped
) -> None:
    incident = swapped.detail["incident"]
    assert (incident["kind"], incident["outcome"], incident["job"]) == ("job", "recovered", swapped.job), (
        incident["reason"]
    )
    assert [c["node"] for c in incident["culprits"] if c["confirmed"]] == ["node1"]
    steps = {s["name"]: s for s in swapped.detail["steps"] if s["phase"] == "steps"}
    assert [
        steps[n]["status"]
        for n in ("ask-for-a-checkpoint", "wait-for-the-checkpoint", "requeue-off-the-node")
    ] == [
        "ok",
        "ok",
        "ok",
    ]
    assert f"--signal=USR1 {swapped.job}" in steps["ask-for-a-checkpoint"]["command"]
    assert "ExcNodeList=node1" in steps["requeue-off-the-node"]["command"]
    (node,) = stack.wait_running(swapped.job, avoid=["node1"])
    assert node != "node1"


def test_it_resumes_from_the_checkpoint_written_on_request(stack: Stack, swapped: Swapped) -> None:
    log = stack.job_log(swapped.job)
    requested = [int(s) for s in re.findall(r"checkpoint requested: saving step (\d+)", log)]
    assert requested, "the trainer never heard the checkpoint request"
    resumed = stack.resumes(swapped.job)
    assert resumed and resumed[-1] >= requested[0]  # not from an older scheduled checkpoint
    redone = swapped.last_step_on_node1 - resumed[-1]
    print(f"planned swap: checkpoint on request at step {requested[0]}, resumed from {resumed[-1]}, "
          f"last step on node1 {swapped.last_step_on_node1}: {max(redone, 0)} steps redone")  # fmt: skip


def test_the_warning_node_is_handed_to_the_repair_lifecycle(stack: Stack, swapped: Swapped) -> None:
    repairs = stack.nightshift.get("/api/v1/nodes/node1")
    assert repairs["repairs"] and repairs["repairs"][0]["playbook"] == PLAYBOOK
