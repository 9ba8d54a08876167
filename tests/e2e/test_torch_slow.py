"""Before it crashes (issue 25) on real ``torch.distributed`` jobs on the real stack (see test_torch_faults.py for the
launch), each on three nodes (the straggler rule needs three timed ranks):

- ``straggler``: the rank on node2 gets 2% of a CPU (a cgroup quota, :func:`sim.faults.limit_rank`: ``cpu.max`` on
  v2, ``cpu.cfs_quota_us`` on v1; batches of 4096 samples, so a step needs more CPU than that): its own work per
  step (the progress library's ``training_rank_step_seconds``) stays far above the job's median rank, so
  ``TrainingStraggler`` names node2.
  → ``straggler-slurm``: the job is asked to checkpoint (``scancel --batch --signal=USR1``, trapped by the batch
  script, the request file), Nightshift waits for the new checkpoint marker, requeues the job without node2, and
  node2 is NOT drained (a straggler is not a fault): still in service, no repair.
- ``swap``: correctable ECC errors rise on node2's GPU 0 (the simulated exporter's ``ecc_sbe`` fault):
  ``GpuEccCorrectableRising``, an early warning. → ``planned-swap-slurm``: checkpoint on request, requeue off
  node2, node2 to the repair lifecycle (drain, validate with dcgmi, return: the steps the stack's permissions
  grant). The work lost is measured as steps redone: the newest step the job reached on node2 minus the step it
  resumed from (printed, with the step it would have redone from the checkpoint before the warning).

Each asserts its own job's invariants: one decided job incident, the culprit, one requeue excluding node2 (in the
ledger and in Slurm's ExcNodeList), the resume from a checkpoint saved after the request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from sim import cgroups, faults, torch_job
from sim.stack import REPAIR_SETTLED, Stack
from tests.e2e import torch_scenarios as scenarios
from tests.e2e.torch_scenarios import CULPRIT, Scenario
from tests.fixtures.procs import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

NODES = ["node1", "node2", "node3"]
CPU_FRACTION = 0.02  # of one CPU (cpu.max 2 ms per 100 ms), for the straggler's rank
# Its batch: a step of ~5 ms of CPU here (a forward pass ~1.6 ms, timed), more than the rank's quota per 200 ms step,
# so the quota throttles the rank inside the work it times. With 1024 samples a step needs ~1.6 ms and a 5% quota
# (10 ms per step) never bit: the job ran at full speed with the rank in its cgroup (measured, first run).
STRAGGLER_BATCH = ["--batch-size", "4096"]
# Scheduled checkpoints every 50 steps (~10 s here), not the default 10: the checkpoint before the fault is well
# behind it. The job trains on while Nightshift polls for the new checkpoint (every 15 s, the action's default), so
# the one it resumes from may be a scheduled one newer than the one that answered the request.
CHECKPOINT_EVERY = 50


def answering_checkpoint(log: str) -> int | None:
    """The step of the first checkpoint rank 0 saved after the batch shell heard Nightshift's request (its trap's
    line): the one that answered it. A scheduled save that lands right after the request answers it too (the
    progress library's request is pending until a checkpoint newer than it is saved), so not only the saves logged
    as "checkpoint requested". None when the request never came or nothing was saved after it."""
    parts = log.split("checkpoint requested (SIGUSR1)", 1)
    saved = re.findall(r"\[rank0\]: saved checkpoint \S+ \(step (\d+),", parts[1]) if len(parts) == 2 else []
    return int(saved[0]) if saved else None


def last_step_on(stack: Stack, job: str, node: str) -> int:
    """The newest step Prometheus saw the job reach on ``node`` (the work done there before the requeue)."""
    found = stack.prometheus.query(
        f'max_over_time(training_step_total{{slurm_job_id="{job}",Hostname="{node}"}}[15m])'
    )
    return int(float(found[0]["value"][1])) if found else -1


@dataclass
class Straggled:
    scenario: Scenario
    culprit_state: str  # Slurm's state of node2 once the job ran again without it
    excluded: list[str]  # the job's ExcNodeList in Slurm then


@pytest.fixture(scope="module")
def straggler(stack: Stack) -> Straggled:
    """The straggler scenario, with node2's state and the job's exclusions read from Slurm before the job ends (the
    scenario's end releases a node Nightshift took out, which would hide a drain)."""
    name = "torch-straggler"
    groups: list[Path] = []
    seen: list[tuple[str, list[str]]] = []

    def slow_down(scenario: Scenario) -> None:
        groups.extend(faults.limit_rank(stack.sim.state_dir, name, CULPRIT, cpu_fraction=CPU_FRACTION))

    def read_slurm(scenario: Scenario) -> None:
        seen.append((stack.slurm.node_state(CULPRIT), stack.slurm.job_excluded_nodes(scenario.job)))

    try:
        scenario = scenarios.run(
            stack, name, slow_down, recovers=True, avoid=(CULPRIT,), nodes=NODES, checkpoint_every=CHECKPOINT_EVERY,
            extra=STRAGGLER_BATCH, before_cancel=read_slurm,
        )  # fmt: skip
    finally:
        for group in groups:
            cgroups.remove(group)
    return Straggled(scenario, *seen[0])


@dataclass
class Swap:
    scenario: Scenario
    last_on_node2: int  # the newest step the job reached on node2
    repair: dict[str, Any]  # node2's repair, once settled


@pytest.fixture(scope="module")
def swap(stack: Stack) -> Swap:
    """The planned swap, the newest step the job reached on node2 and node2's repair once it settled."""
    name = "torch-swap"
    last: list[int] = []
    repaired: list[dict[str, Any]] = []

    def warn(scenario: Scenario) -> None:
        faults.inject_gpu_fault(stack.sim.state_dir, CULPRIT, 0, "ecc_sbe")

    def settled() -> dict[str, Any] | None:
        current = stack.nightshift.get(f"/api/v1/nodes/{CULPRIT}")["current"]
        return current if current["state"] in REPAIR_SETTLED else None

    def measured(scenario: Scenario) -> None:
        last.append(last_step_on(stack, scenario.job, CULPRIT))
        repaired.append(wait_until(settled, 180, f"{CULPRIT}'s repair to settle"))  # type: ignore[arg-type]

    try:
        scenario = scenarios.run(
            stack, name, warn, recovers=True, avoid=(CULPRIT,), nodes=NODES, checkpoint_every=CHECKPOINT_EVERY,
            before_cancel=measured,
        )  # fmt: skip
    finally:
        faults.clear(stack.sim.state_dir, node=CULPRIT)
    return Swap(scenario, last[0], repaired[0])


def assert_checkpointed_then_requeued_off_the_culprit(
    scenario: Scenario, playbook: str, requeue_step: str
) -> None:
    """One deciding job incident of ``playbook``, recovered, node2 its confirmed culprit; its steps: the checkpoint
    asked of the batch shell (the job's announced ``B:USR1``), waited for, then one requeue excluding node2."""
    incident = scenario.incident
    assert (incident["playbook"], incident["outcome"]) == (playbook, "recovered"), incident.get("reason")
    assert [c["node"] for c in incident["culprits"] if c["confirmed"]] == [CULPRIT]
    steps = [s for d in scenario.incidents for s in d["steps"] if s["phase"] == "steps"]
    assert [(s["name"], s["status"]) for s in steps] == [
        ("ask-for-a-checkpoint", "ok"),
        ("wait-for-the-checkpoint", "ok"),
        (requeue_step, "ok"),
    ]
    assert f"--batch --signal=USR1 {scenario.job}" in steps[0]["command"]
    (requeue,) = scenario.requeues()
    assert f"ExcNodeList={CULPRIT}" in requeue["command"]
    assert scenario.stack.slurm.job_restarts(scenario.job) == 1


def test_a_straggler_is_excluded_at_a_checkpoint_without_a_drain(straggler: Straggled) -> None:
    scenario = straggler.scenario
    assert_checkpointed_then_requeued_off_the_culprit(
        scenario, "straggler-slurm", "requeue-without-the-straggler"
    )
    # In Slurm: the job kept off node2, node2 not drained and never handed to a repair (a straggler is not a fault).
    assert CULPRIT in straggler.excluded
    assert "drain" not in straggler.culprit_state, straggler.culprit_state
    with pytest.raises(requests.HTTPError):
        scenario.stack.nightshift.get(f"/api/v1/nodes/{CULPRIT}")


def test_the_straggler_s_job_resumes_from_the_checkpoint_written_on_request(straggler: Straggled) -> None:
    scenario = straggler.scenario
    answered = answering_checkpoint(scenario.log)
    assert answered is not None, "no checkpoint saved after the request"
    assert torch_job.resumes(scenario.log)[-1].step >= answered
    scenarios.assert_resumed_from_checkpoint(scenario)


def test_a_warning_node_is_swapped_out_at_a_checkpoint_and_repaired(swap: Swap) -> None:
    scenario = swap.scenario
    incident = scenario.incident
    assert_checkpointed_then_requeued_off_the_culprit(scenario, "planned-swap-slurm", "requeue-off-the-node")
    repair = swap.repair
    assert (repair["playbook"], repair["incident_id"]) == ("planned-swap-slurm", incident["id"])
    # Drained, validated (dcgmi passes: correctable errors fail no test), back in service.
    steps = [(s["step"], s["status"]) for s in repair["steps"]]
    assert (repair["state"], steps) == (
        "returned",
        [("take_out", "ok"), ("validate", "ok"), ("return", "ok")],
    ), (
        repair.get("held_reason"),
        repair.get("validation"),
    )


def test_the_swapped_job_redoes_only_the_steps_after_the_checkpoint_on_request(
    swap: Swap, record_property: Any
) -> None:
    scenario, last_on_node2 = swap.scenario, swap.last_on_node2
    answered = answering_checkpoint(scenario.log)
    assert answered is not None, "no checkpoint saved after the request"
    resumed = torch_job.resumes(scenario.log)[-1].step
    # The checkpoint that answered the request (or a newer one), not the one from before the warning.
    assert resumed >= answered > scenario.checkpoint, (resumed, answered, scenario.checkpoint)
    redone = last_on_node2 - resumed  # the work lost: steps done on node2 past the checkpoint resumed from
    assert redone >= 0, (last_on_node2, resumed)
    record_property("steps_redone", redone)
    measured = {"checkpoint_before_warning": scenario.checkpoint, "checkpoint_answering_request": answered,
                "resumed_from": resumed, "last_step_on_node2": last_on_node2, "steps_redone": redone,
                "steps_redone_without_the_request": last_on_node2 - scenario.checkpoint}  # fmt: skip
    print(json.dumps(measured))
    scenarios.assert_resumed_from_checkpoint(scenario)


def test_figures(straggler: Straggled, swap: Swap, record_property: Any) -> None:
    figures = scenarios.figures([straggler.scenario, swap.scenario])
    for name, value in figures.items():
        record_property(name, value)
    print(json.dumps(figures, indent=2, default=str))
    assert all(f["decided"] <= 1 for f in figures.values()), figures
