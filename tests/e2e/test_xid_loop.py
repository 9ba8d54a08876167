"""The whole loop for a GPU that falls off the bus, on the real stack.

A training job runs on node1 as a Slurm batch job; Xid 79 on node1 GPU 3 goes simulated exporter → Prometheus
(fast rules) → Alertmanager (the shipped config) → ``nightshift serve`` → the job's incident
(gpu-xid-node-fault-slurm) names node1 its culprit → requeue excluding node1 over SSH → the job runs on another node
from its checkpoint → verified by PromQL → recovered, with a closed Grafana region and self-metrics that the
remediation dashboard's panels show; node1, the culprit, is drained by its repair (and held: dcgmi still sees Xid 79).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from sim import faults
from sim.cluster import REPO_ROOT
from sim.stack import Stack
from tests.fixtures.procs import wait_until

pytestmark = pytest.mark.e2e

PLAYBOOK = "gpu-xid-node-fault-slurm"
DASHBOARDS = sorted((REPO_ROOT / "grafana" / "dashboards").glob("*.json"))


@dataclass(frozen=True)
class Remediated:
    job: str
    detail: dict[str, Any]  # the incident with its alerts, steps and ledger, once closed


@pytest.fixture(scope="module")
def remediated(stack: Stack) -> Remediated:
    job = stack.submit_trainer("llama-7b", "node1")
    stack.wait_training(job, "node1")
    faults.inject_xid(stack.sim.state_dir, "node1", 3, 79)
    incident = stack.wait_incident(PLAYBOOK)
    return Remediated(job, stack.wait_closed(incident["id"]))


def test_incident_recovers_after_drain_and_requeue(stack: Stack, remediated: Remediated) -> None:
    incident = remediated.detail["incident"]
    assert (incident["kind"], incident["outcome"], incident["node"], incident["job"]) == (
        "job",
        "recovered",
        "node1",
        remediated.job,
    ), incident["reason"]
    steps = [
        (s["name"], s["action"], s["status"]) for s in remediated.detail["steps"] if s["phase"] == "steps"
    ]
    assert steps == [("requeue-off-culprits", "slurm.requeue_job", "ok")]
    assert "ExcNodeList=node1" in remediated.detail["steps"][-1]["command"]
    # The incident holds the culprit's Xid 79 and only this job's alerts: under load more alerts of the same
    # episode may join it (how many is incidental), never another job's.
    alerts = remediated.detail["alerts"]
    assert {a["labels"].get("slurm_job_id") for a in alerts} == {remediated.job}
    assert any(a["labels"].get("xid") == "79" for a in alerts), [a["labels"] for a in alerts]
    assert any(row["kind"] == "verify_sample" for row in remediated.detail["ledger"])


def test_node1_is_drained_by_its_repair_and_the_job_runs_elsewhere(
    stack: Stack, remediated: Remediated
) -> None:
    assert "drain" in stack.slurm.node_state("node1").split("+")
    assert stack.slurm.node_reason("node1").startswith("nightshift: culprit of job")
    assert stack.slurm.squeue_state(remediated.job) == "RUNNING"
    assert stack.slurm.job_nodes(remediated.job) in ("node2", "node3", "node4")
    assert stack.slurm.job_restarts(remediated.job) == 1
    # The incident closes on the job's steps in Prometheus; its output file may show the resume line a moment later.
    (resumed,) = wait_until(lambda: stack.resumes(remediated.job), 60, f"job {remediated.job}'s resume line")
    assert resumed > 0  # from a checkpoint, not from scratch


def test_grafana_region_spans_the_incident(stack: Stack, remediated: Remediated) -> None:
    job = remediated.job
    (region,) = stack.grafana.annotations("nightshift", f"job:{job}")
    assert sorted(region["tags"]) == sorted(
        ["nightshift", f"playbook:{PLAYBOOK}", "node:node1", f"job:{job}", "outcome:recovered"]
    )
    assert region["time"] < region["timeEnd"]
    assert f"incident #{remediated.detail['incident']['id']}" in region["text"]


def test_self_metrics_count_the_recovery(stack: Stack, remediated: Remediated) -> None:
    lines = stack.nightshift.metrics().splitlines()
    assert 'nightshift_incidents_total{outcome="recovered"} 1.0' in lines
    assert f'nightshift_incidents_opened_total{{playbook="{PLAYBOOK}"}} 1.0' in lines


def nightshift_panel_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every dashboard target on Nightshift's self-metrics."""
    return [
        (panel["title"], target["expr"])
        for path in DASHBOARDS
        for panel in json.loads(path.read_text())["panels"]
        for target in panel["targets"]
        if "nightshift_" in target["expr"]
    ]


def test_dashboards_have_panels_on_self_metrics() -> None:
    assert len(nightshift_panel_queries()) >= 3


@pytest.mark.parametrize(("panel", "expr"), nightshift_panel_queries(), ids=lambda v: str(v)[:40])
def test_self_metric_panel_returns_data(stack: Stack, remediated: Remediated, panel: str, expr: str) -> None:
    """Prometheus scrapes Nightshift's /metrics: every self-metric panel has this run's series (they exist only
    once an incident opened, steps ran and the incident closed)."""
    query = expr.replace("$__range", "1h")
    assert "$" not in query, f"{panel}: uninterpolated variable in {expr}"
    assert wait_until(lambda: stack.prometheus.query(query), 30, f"data for {panel}: {query}")
