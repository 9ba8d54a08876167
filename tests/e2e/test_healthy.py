"""A healthy two-node job on the real stack raises nothing: no alert pending or firing, nothing at the webhook, no
incident, no action, no node repair.

The fast rules (rules/sim/) judge windows of 10 s to 70 s; a job watched for 90 s covers every one of them,
including TrainingThroughputDrop's 70 s baseline, several times over.
"""

from __future__ import annotations

import pytest

from sim.stack import Stack
from tests.fixtures.procs import wait_until

pytestmark = pytest.mark.e2e

WATCHED = 90  # seconds of the job's life that Prometheus must have evaluated every rule over
NODES = ["node1", "node2"]  # one rank on each (srun), as in the Xid episode (test_job_episode.py)


@pytest.fixture(scope="module")
def watched_job(stack: Stack) -> str:
    """A job that has trained on node1 and node2 for ``WATCHED`` seconds of scraped samples."""
    job = stack.submit_trainer("healthy", NODES)
    stack.wait_training(job, NODES)
    wait_until(
        lambda: (
            len(stack.prometheus.query(f'training_step_total{{slurm_job_id="{job}"}} offset {WATCHED}s')) == 2
        ),
        WATCHED + 30,
        f"{WATCHED} s of job {job} on both nodes",
    )
    return job


def test_no_alert_was_pending_or_firing(stack: Stack, watched_job: str) -> None:
    # ALERTS has a sample for every evaluation where an alert was pending or firing.
    assert stack.prometheus.query(f"ALERTS[{WATCHED + 15}s]") == []
    assert stack.alertmanager.alerts() == []


def test_rules_were_evaluated_over_the_job(stack: Stack, watched_job: str) -> None:
    """Guards the test above: the rule groups ran and the job's metrics were there to judge."""
    assert stack.prometheus.query(
        'prometheus_rule_group_last_evaluation_timestamp_seconds{rule_group=~".*training"}'
    )
    series = stack.prometheus.query(
        f'count_over_time(training_step_total{{slurm_job_id="{watched_job}"}}[{WATCHED}s]) > 60'
    )
    assert sorted(s["metric"]["Hostname"] for s in series) == NODES  # every rank judged
    assert stack.slurm.squeue_state(watched_job) == "RUNNING"
    assert stack.slurm.job_node_list(watched_job) == NODES


def test_nothing_reached_nightshift(stack: Stack, watched_job: str) -> None:
    assert stack.nightshift.incidents() == []  # no incident, so no step ran
    assert stack.nightshift.get("/api/v1/nodes")["nodes"] == []  # no node taken out or repaired
    assert stack.slurm.job_restarts(watched_job) == 0
    received = [
        line
        for line in stack.nightshift.metrics().splitlines()
        if line.startswith("nightshift_alerts_received_total")
    ]
    assert received and all(line.endswith(" 0.0") for line in received), received  # series exist at zero
