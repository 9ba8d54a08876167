"""Without a permissions file Nightshift only advises: the Xid 79 loop on the real stack ends ``advisory``, every
changing step is recorded as "would run", and Slurm is left exactly as it was."""

from __future__ import annotations

from typing import Any

import pytest

from sim import faults
from sim.stack import REPAIR_SETTLED, Stack
from tests.fixtures.procs import wait_until

pytestmark = pytest.mark.e2e

PLAYBOOK = "gpu-xid-node-fault-slurm"


def test_xid_79_gives_an_advisory_plan_and_touches_nothing(advisory_stack: Stack) -> None:
    stack = advisory_stack
    job = stack.submit_trainer("llama-7b", "node1")
    stack.wait_training(job, "node1")
    faults.inject_xid(stack.sim.state_dir, "node1", 3, 79)
    detail = stack.wait_closed(stack.wait_incident(PLAYBOOK)["id"])

    assert detail["incident"]["outcome"] == "advisory", detail["incident"]["reason"]
    steps = [(s["phase"], s["action"], s["status"]) for s in detail["steps"]]
    assert steps == [
        ("collect", "slurm.job_log", "ok"),  # read-only: needs no grant
        ("steps", "slurm.requeue_job", "would_run"),  # the job off node1, its culprit
    ]
    # node1's repair recorded its plan (drain, validation, return) without doing any of it. The repair runs apart
    # from the incident, so it may record its plan after the incident closed (seen under load).
    wait_until(lambda: _settled_repair(stack, "node1"), 60, "node1's repair to record its plan")
    node = stack.nightshift.get("/api/v1/nodes/node1")["current"]
    assert node["state"] == "advisory" and node["taken_out_by_us"] is False
    guards = [row["message"] for row in detail["ledger"] if row["kind"] == "guard"]
    assert any(message.startswith("permission: stop") for message in guards), guards

    assert stack.slurm.node_state("node1").split("+") == ["mixed"] or "drain" not in stack.slurm.node_state(
        "node1"
    )
    assert stack.slurm.node_reason("node1") == "none"
    assert (stack.slurm.squeue_state(job), stack.slurm.job_nodes(job)) == ("RUNNING", "node1")
    assert stack.slurm.job_restarts(job) == 0
    (region,) = stack.grafana.annotations("nightshift", f"job:{job}")
    assert "outcome:advisory" in region["tags"]


def _settled_repair(stack: Stack, node: str) -> dict[str, Any] | None:
    current = stack.nightshift.get(f"/api/v1/nodes/{node}")["current"]
    return current if current["state"] in REPAIR_SETTLED else None
