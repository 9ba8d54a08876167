"""More real faults in real ``torch.distributed`` jobs on the real stack (see test_torch_faults.py for the launch):

- ``nan``: every rank's inputs become NaN (divergence): every rank finds NaN in its own loss (Megatron-LM's
  words), the steps are skipped, the trainer stops checkpointing. → numerical divergence, no node to blame: one
  requeue from the last finite checkpoint, excluding nothing; the loss is finite again.
- ``sdc``: the rank on node2 alone computes NaN, step after step, while the others' stay finite (silent data
  corruption on its GPU, as operators report it). → suspect hardware (gpu_hardware, culprit node2): one requeue off
  node2 from the last finite checkpoint, node2 to the repair lifecycle (validated); the loss is finite again. A
  divergence that comes back off node2 is the model's: the loss-nan budget (one a day) then hands it to a person.
- ``oom``: the rank on node2 runs in a memory-capped cgroup (v1 ``memory.limit_in_bytes`` here: v2's memory
  controller is not delegated on this machine) and allocates past it: the kernel's OOM killer ends it (exit -9).
  → requeued off node2, resumed from its checkpoint.
- ``elastic``: torchrun's own restart (``--max-restarts 1``) after a rank is SIGKILLed: every worker restarts from
  the DCP checkpoint inside the same Slurm job. → Nightshift leaves a job that recovered by itself alone: no
  requeue.
- ``time_limit``: Slurm stops the job at its time limit (``sbatch --time=2``). → nothing.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest

from sim import cgroups, faults, statedir, torch_job
from sim.stack import Stack
from tests.e2e import torch_scenarios as scenarios
from tests.e2e.torch_scenarios import CULPRIT, NODES, Scenario
from tests.fixtures.procs import wait_until

# A scenario (a module-scoped fixture) runs inside the first test that asks for it: two torch job starts, the
# fault, the incident and the resume take minutes on two loaded cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

OOM_HEADROOM = 256 * 1024 * 1024  # bytes above the worker's resident size


def _rank_on(stack: Stack, name: str, node: str) -> int:
    """The global rank of job ``name``'s worker on ``node`` (the c10d rendezvous assigns them)."""
    statuses = statedir.read_trainers(stack.sim.state_dir)
    (rank,) = [int(s["rank"]) for s in statuses if s.get("name") == name and s.get("hostname") == node]
    return rank


@pytest.fixture(scope="module")
def sdc(stack: Stack) -> Scenario:
    def corrupt_on_node2(scenario: Scenario) -> None:
        rank = _rank_on(stack, scenario.name, CULPRIT)
        faults.inject_rank_fault(stack.sim.state_dir, scenario.name, rank, "nan")

    return scenarios.run(stack, "torch-sdc", corrupt_on_node2, recovers=True, avoid=(CULPRIT,))


@pytest.fixture(scope="module")
def nan(stack: Stack) -> Scenario:
    def diverge(scenario: Scenario) -> None:
        for rank in range(len(NODES)):
            faults.inject_rank_fault(stack.sim.state_dir, scenario.name, rank, "nan")

    return scenarios.run(stack, "torch-nan", diverge, recovers=True)


@pytest.fixture(scope="module")
def oom(stack: Stack) -> Scenario:
    groups = []

    def out_of_memory(scenario: Scenario) -> None:
        groups.extend(
            faults.limit_rank(stack.sim.state_dir, scenario.name, CULPRIT, memory_bytes=OOM_HEADROOM)
        )
        rank = _rank_on(stack, scenario.name, CULPRIT)
        faults.inject_rank_fault(stack.sim.state_dir, scenario.name, rank, "oom")

    try:
        return scenarios.run(stack, "torch-oom", out_of_memory, recovers=True, avoid=(CULPRIT,))
    finally:
        for group in groups:
            cgroups.remove(group)


@pytest.fixture(scope="module")
def elastic(stack: Stack) -> Scenario:
    """A rank SIGKILLed under ``--max-restarts 1``: torchrun restarts the workers; wait for the restarted ones to
    train past the step they resumed from, then long enough for any incident to have opened and closed."""
    name = "torch-elastic"
    job, checkpoint = scenarios.start(stack, name, max_restarts=1)
    scenario = Scenario(stack, name, job, checkpoint, time.time())
    faults.signal_rank(stack.sim.state_dir, name, signal.SIGKILL, node=CULPRIT)
    try:
        wait_until(lambda: torch_job.resumes(stack.job_log(job)), scenarios.START_TIMEOUT, f"{job} restarted")
        resumed = torch_job.resumes(stack.job_log(job))[-1].step
        past = f'training_step_total{{slurm_job_id="{job}"}} > {resumed + 20}'
        wait_until(lambda: len(stack.prometheus.query(past)) == len(NODES), 120, "training past the restart")
        scenario.running_again_s = time.time() - scenario.fault_at
        # The surviving rank counted its gloo error (TrainingJobError): whatever Nightshift opened must close.
        wait_until(
            lambda: all(i["outcome"] for i in stack.nightshift.incidents(job=job)), 180, "incidents closed"
        )
        scenario.incidents = [stack.nightshift.incident(i["id"]) for i in stack.nightshift.incidents(job=job)]
        scenario.log = stack.job_log(job)
    finally:
        stack.slurm.command("scancel", job, check=False)
        scenarios.keep(stack, name, job)
    for node in NODES:
        stack.return_node(node)
    return scenario


@pytest.fixture(scope="module")
def time_limit(stack: Stack) -> Scenario:
    """``sbatch --time=2``: Slurm ends the job at its limit (SIGTERM, ``DUE TO TIME LIMIT``), after checkpoints."""
    return scenarios.ended_on_purpose(stack, "torch-time-limit", lambda job: None, sbatch_args=("--time=2",))


def test_a_time_limit_stop_is_left_alone(time_limit: Scenario) -> None:
    assert "DUE TO TIME LIMIT" in time_limit.log
    scenarios.assert_nothing_done(time_limit)


def assert_finite_again(scenario: Scenario) -> None:
    """Resumed from a finite checkpoint no older than the one at the fault, and finite since."""
    resume = torch_job.resumes(scenario.log)[-1]
    assert resume.step >= scenario.checkpoint and resume.loss == resume.loss  # finite: NaN != NaN
    after = [
        loss
        for step, loss in torch_job.losses(scenario.log.split("resuming from step")[-1])
        if step > resume.step
    ]
    assert after and all(loss == loss for loss in after)


def test_nan_on_every_rank_is_requeued_once_from_a_finite_checkpoint(nan: Scenario) -> None:
    incident, diagnosis = nan.incident, scenarios.diagnosis(nan)
    assert incident["outcome"] == "recovered", (incident.get("reason"), diagnosis)
    assert diagnosis.get("category") == "numerical_divergence" and diagnosis.get("culprit") is None, diagnosis
    (requeue,) = nan.requeues()
    assert "ExcNodeList" not in requeue["command"]  # a diverging model names no node
    assert_finite_again(nan)


def test_nan_on_one_rank_again_and_again_is_suspect_hardware_requeued_off_its_node(sdc: Scenario) -> None:
    incident, diagnosis = sdc.incident, scenarios.diagnosis(sdc)
    assert incident["outcome"] == "recovered", (incident.get("reason"), diagnosis)
    assert diagnosis.get("category") == "gpu_hardware", diagnosis
    assert "silent data corruption" in diagnosis.get("summary", ""), diagnosis
    assert (diagnosis.get("culprit") or {}).get("node") == CULPRIT, diagnosis
    assert f"node: {CULPRIT}" in sdc.log and "found NaN in local forward loss calculation" in sdc.log
    scenarios.assert_recovered_off(sdc, CULPRIT)
    assert_finite_again(sdc)
    repairs = sdc.stack.nightshift.get(f"/api/v1/nodes/{CULPRIT}")["repairs"]
    assert repairs and repairs[0]["incident_id"] == incident["id"]  # validated before it takes jobs again


def test_an_oom_kill_in_a_memory_capped_cgroup_is_requeued_off_the_node(oom: Scenario) -> None:
    scenarios.assert_recovered_off(oom, CULPRIT)
    assert "exitcode  : -9" in oom.log and f"host      : {CULPRIT}" in oom.log


def test_an_oom_kill_resumes_from_the_checkpoint(oom: Scenario) -> None:
    scenarios.assert_resumed_from_checkpoint(oom)


def torchrun_gave_up(scenario: Scenario) -> bool:
    """Whether torchrun printed its failure summary in the job's first run (its restarts spent: the Slurm job
    failed), rather than bringing the workers back itself. Seen here under load: the restarted worker of one node
    read its peer's address of the round before and gloo's connectFullMesh was refused."""
    first_run = scenario.log.split(", restart 1,", 1)[0]
    return "Root Cause (first observed failure)" in first_run


def test_torchrun_s_own_restart_is_left_alone_and_a_failed_one_requeued(elastic: Scenario) -> None:
    """Nightshift acts exactly when torchrun could not bring the job back: the fault's own incident never acts on
    top of torchrun's restart (it closes self_recovered once the job trains again after the fault, or resolved when
    its alert resolved first), and acts once when torchrun gave up.

    Under load, torchrun's restart (each worker importing torch on two shared cores) can take longer than the
    simulator's time scale allows, and then Nightshift acts once, as designed: either TrainingHang fires (its fast
    rules call 10 s without a step a hang; production: 15 min) and the hang playbook requeues the job (seen: the
    restarted workers served their step counter, unchanged, 25 s after the fault), or the fault's incident waited
    out its playbook's ``self_recovery`` window with the job not training and requeued it (seen in a full run
    beside two CPU-bound processes: "did not train again within 180 s of the fault"). Never before that window."""
    if torchrun_gave_up(elastic):
        assert elastic.incident["outcome"] == "recovered" and len(elastic.requeues()) == 1
        assert elastic.stack.slurm.job_restarts(elastic.job) == 1
        # The rank was killed on node2; each agent's summary names its own rank's later failure (gloo, on the
        # restart): never the healthy node1 (a local rank 0 read as the job's rank 0 once blamed it).
        (requeue,) = elastic.requeues()
        assert "ExcNodeList=node1" not in requeue["command"], requeue["command"]
        assert all(c["node"] == CULPRIT for c in elastic.incident["culprits"] or ()), elastic.incident[
            "culprits"
        ]
        return
    acted = [i["incident"] for i in elastic.incidents if i["incident"]["outcome"] not in scenarios.UNDECIDED]
    outcomes = {
        (i["incident"]["playbook"], i["incident"]["outcome"], i["incident"]["reason"])
        for i in elastic.incidents
    }
    waited_out = {
        d["incident"]["id"]
        for d in elastic.incidents
        if any(r["kind"] == "self_recovery" and "did not train again" in r["message"] for r in d["ledger"])
    }
    assert all(i["playbook"] == "training-hang-slurm" or i["id"] in waited_out for i in acted), outcomes
    assert len(acted) <= 1 and len(elastic.requeues()) == len(acted), outcomes
    assert elastic.stack.slurm.job_restarts(elastic.job) == len(acted)
    assert (
        torch_job.resumes(elastic.log)[-1].step >= elastic.checkpoint
    )  # torchrun's restart (or the requeued run) resumed from DCP


def test_figures(
    nan: Scenario,
    sdc: Scenario,
    oom: Scenario,
    elastic: Scenario,
    time_limit: Scenario,
    record_property: Any,
) -> None:
    figures = scenarios.figures([nan, sdc, oom, elastic, time_limit])
    for name, value in figures.items():
        record_property(name, value)
    print(json.dumps(figures, indent=2, default=str))
    assert all(f["decided"] <= 1 for f in figures.values()), figures
