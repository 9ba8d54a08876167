"""The whole loop for a silent hang, on the real stack.

The training job stops stepping but stays alive (no log line, GPUs idle): TrainingHang (fast rules: 10 s without
a step) → Alertmanager → ``nightshift serve`` → incident (training-hang-slurm) → collect the job log, requeue over
SSH → the job runs again from its checkpoint → verified by PromQL → recovered, with a closed Grafana region.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from sim import faults
from sim.stack import Stack
from tests.fixtures.procs import wait_until

pytestmark = pytest.mark.e2e

PLAYBOOK = "training-hang-slurm"


@dataclass(frozen=True)
class Remediated:
    job: str
    hung_at: int  # the step the job had reached when it was told to hang
    detail: dict[str, Any]


@pytest.fixture(scope="module")
def remediated(stack: Stack) -> Remediated:
    job = stack.submit_trainer("gpt-hang", "node1")
    stack.wait_training(job, "node1")
    stack.wait_window(job, "node1")
    faults.inject_job_fault(stack.sim.state_dir, "gpt-hang", "hang")
    incident = stack.wait_incident(PLAYBOOK, timeout=45)
    hung = stack.prometheus.query(f'training_step_total{{slurm_job_id="{job}"}}')
    return Remediated(job, int(float(hung[0]["value"][1])), stack.wait_closed(incident["id"]))


def test_hang_is_requeued_and_recovers(stack: Stack, remediated: Remediated) -> None:
    incident = remediated.detail["incident"]
    assert (incident["outcome"], incident["job"]) == ("recovered", remediated.job), incident["reason"]
    # The job's episode: TrainingHang, and whatever else the stalled job raised meanwhile, all about this job.
    alerts = remediated.detail["alerts"]
    assert "TrainingHang" in {a["labels"]["alertname"] for a in alerts}
    assert {a["labels"]["slurm_job_id"] for a in alerts} == {remediated.job}
    collected = [(s["action"], s["status"]) for s in remediated.detail["steps"] if s["phase"] == "collect"]
    assert collected == [("slurm.job_log", "ok"), ("slurm.job_stacks", "ok")]
    steps = [
        (s["name"], s["action"], s["status"]) for s in remediated.detail["steps"] if s["phase"] == "steps"
    ]
    assert steps == [("requeue", "slurm.requeue_job", "ok")]
    guards = [row["message"] for row in remediated.detail["ledger"] if row["kind"] == "guard"]
    assert any(message.startswith("recheck: pass") for message in guards), guards


def test_the_job_runs_again_from_its_checkpoint(stack: Stack, remediated: Remediated) -> None:
    job = remediated.job
    assert stack.slurm.squeue_state(job) == "RUNNING"
    assert stack.slurm.job_restarts(job) == 1
    (resumed,) = stack.resumes(job)
    assert 0 < resumed <= remediated.hung_at
    past_the_hang = f'training_step_total{{slurm_job_id="{job}"}} > {remediated.hung_at}'
    assert wait_until(lambda: stack.prometheus.query(past_the_hang), 30, "steps past the one it hung at")


def test_grafana_region_closes_with_the_outcome(stack: Stack, remediated: Remediated) -> None:
    (region,) = stack.grafana.annotations("nightshift", f"job:{remediated.job}")
    assert f"playbook:{PLAYBOOK}" in region["tags"] and "outcome:recovered" in region["tags"]
    assert region["time"] < region["timeEnd"]
