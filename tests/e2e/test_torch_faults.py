"""Real faults in real ``torch.distributed`` jobs, on the real stack (Slurm, Prometheus, Alertmanager, Nightshift).

Each scenario submits a two-node DDP job (gloo, CPU) as clusters launch one: ``sbatch`` → ``srun`` one task per
node → ``torchrun --rdzv-backend c10d`` → :mod:`sim.torch_trainer`, which checkpoints with
``torch.distributed.checkpoint`` and reports through the progress library. Once a checkpoint exists, a real fault
hits a real process, and Nightshift must make of it one job incident with the right diagnosis and action:

- ``sigkill``: the rank on node2 is SIGKILLed (as the OOM killer or a lost node ends it). The rank on node1 fails
  with gloo's ``Connection reset by peer``; torchrun's summary names rank 1 on node2, exit code -9. → the job
  requeued once off node2, running again from its newest checkpoint.
- ``hang``: the rank on node2 is SIGSTOPped (a silent hang). node1's rank waits in the all-reduce, the step
  counter stops. → stacks and Flight Recorders collected (py-spy cannot suspend rank 1, its debug socket does not
  answer), rank 1 on node2 named, the job requeued off node2, running again from its checkpoint.
- ``hang_in_save``: the same stop, inside a checkpoint save (DCP's collectives): node1's rank waits in the save,
  its checkpoint gauge at 1 for good, which suppresses TrainingHang only up to the rules' bound. → the same.
- ``exception``: rank 1 raises a Python error in its training step. → an application bug: no restart, a person.
- ``xid``: Xid 79 on node2 and the rank there dies with it (SIGKILL). → requeued off node2, node2 drained.
- ``scancel``: the owner cancels the job (SIGTERM, tracebacks in every rank). → nothing: no action.
- ``rendezvous``: node1, whose torchrun agent hosts the c10d rendezvous store, is lost: its worker and its agent are
  SIGKILLed at once (:func:`sim.faults.lose_node`). node2's rank fails on the lost peer and store (gloo and TCPStore
  errors), srun reports node1's task ``Killed``. → requeued off node1, running again from its checkpoint (node2's
  agent hosts the store of the new run).
- ``warnings``: a healthy run that warns (PyTorch's own: ``torch.cuda.amp.GradScaler`` deprecated and disabled
  without CUDA, DDP's ``find_unused_parameters`` that found none) and completes at its last step. → nothing: no
  action, no requeue, no person.

The scenarios share one stack and run one after the other (a job is cancelled once its scenario is recorded);
each asserts invariants of its own job only (its incidents, its requeues, its resume), never counts of alerts or
timings.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from sim import faults
from sim.stack import Stack
from tests.e2e import torch_scenarios as scenarios
from tests.e2e.torch_scenarios import CULPRIT, Scenario

STORE_HOST = "node1"  # the job's first node: its torchrun agent hosts the c10d rendezvous store
# The warning job's steps: past its start, a checkpoint and the fast rules' window, then it ends by itself.
WARNING_JOB_STEPS = 200

# A scenario (a module-scoped fixture) runs inside the first test that asks for it: two torch job starts, the
# fault, the incident and the resume take minutes on two loaded cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


# --- the scenarios ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sigkill(stack: Stack) -> Scenario:
    def kill(scenario: Scenario) -> None:
        faults.signal_rank(stack.sim.state_dir, scenario.name, signal.SIGKILL, node=CULPRIT)

    return scenarios.run(stack, "torch-sigkill", kill, recovers=True, avoid=(CULPRIT,))


@pytest.fixture(scope="module")
def hang(stack: Stack) -> Scenario:
    def stop(scenario: Scenario) -> None:
        faults.stop_rank(stack.sim.state_dir, scenario.name, CULPRIT, saving=False)

    # gloo's timeout as long as PyTorch's default (30 min): the hang, not the peer's timeout, is what Nightshift sees.
    return scenarios.run(stack, "torch-hang", stop, recovers=True, collective_timeout=1800)


@pytest.fixture(scope="module")
def hang_in_save(stack: Stack) -> Scenario:
    def stop_in_save(scenario: Scenario) -> None:
        faults.stop_rank(stack.sim.state_dir, scenario.name, CULPRIT, saving=True)

    return scenarios.run(stack, "torch-hang-save", stop_in_save, recovers=True, collective_timeout=1800)


@pytest.fixture(scope="module")
def exception(stack: Stack) -> Scenario:
    def raise_in_rank1(scenario: Scenario) -> None:
        faults.inject_rank_fault(stack.sim.state_dir, scenario.name, 1, "exception")

    return scenarios.run(stack, "torch-exception", raise_in_rank1, recovers=False)


def test_sigkill_is_one_incident_requeued_off_the_node(sigkill: Scenario) -> None:
    scenarios.assert_recovered_off(sigkill, CULPRIT)
    assert "exitcode  : -9" in sigkill.log and "host      : node2" in sigkill.log  # torchrun's own summary


def test_sigkill_resumes_from_the_checkpoint(sigkill: Scenario) -> None:
    scenarios.assert_resumed_from_checkpoint(sigkill)


def test_hang_names_the_stopped_rank_and_requeues_off_its_node(hang: Scenario) -> None:
    """py-spy cannot suspend a stopped process and says so, while rank 0 waits in DDP's backward: rank 1, on node2,
    is the culprit. The ranks' Flight Recorders are read too (rank 1's debug socket answers nothing); whether rank
    0's shows the stuck all-reduce depends on when rank 1 stopped (torch 2.13, gloo: a rank blocked in DDP's
    backward can show every entry retired), so the verdict may rest on py-spy alone."""
    diagnosis = scenarios.diagnosis(hang)
    assert diagnosis.get("category") == "hang", diagnosis
    culprit = diagnosis.get("culprit") or {}
    assert (culprit.get("rank"), culprit.get("node")) == (1, CULPRIT), diagnosis
    stacks = [
        s
        for d in hang.incidents
        for s in d["steps"]
        if s["phase"] == "collect" and s["action"] == "slurm.job_stacks"
    ]
    assert [s["status"] for s in stacks] == ["ok"]
    scenarios.assert_recovered_off(hang, CULPRIT)


def test_hang_resumes_from_the_checkpoint(hang: Scenario) -> None:
    scenarios.assert_resumed_from_checkpoint(hang)


def test_hang_inside_a_checkpoint_save_is_a_hang_requeued_off_its_node(hang_in_save: Scenario) -> None:
    """Rank 1 stops inside DCP's save: rank 0 waits in the save's collective with its checkpoint gauge at 1 for
    good. A save is no excuse past the rules' bound (30s in the fast rules): the same hang, the same culprit, and a
    resume from the newest complete checkpoint (the interrupted one has no ``.metadata``)."""
    diagnosis = scenarios.diagnosis(hang_in_save)
    assert diagnosis.get("category") == "hang", diagnosis
    culprit = diagnosis.get("culprit") or {}
    assert (culprit.get("rank"), culprit.get("node")) == (1, CULPRIT), diagnosis
    scenarios.assert_recovered_off(hang_in_save, CULPRIT)
    scenarios.assert_resumed_from_checkpoint(hang_in_save)


def test_exception_goes_to_a_person_without_a_restart(exception: Scenario) -> None:
    incident, diagnosis = exception.incident, scenarios.diagnosis(exception)
    assert incident["outcome"] == "needs_human", (incident.get("reason"), diagnosis)
    assert diagnosis.get("category") == "application_error", diagnosis
    assert (diagnosis.get("culprit") or {}).get("rank") == 1, diagnosis
    assert exception.requeues() == []
    assert exception.stack.slurm.job_restarts(exception.job) == 0
    assert "ValueError: Expected input batch_size" in exception.log
    assert "needs_human" in [page.get("outcome") for page in scenarios.pages(exception)]  # a person paged


@pytest.fixture(scope="module")
def cancelled(stack: Stack) -> Scenario:
    """The owner's ``scancel``: SIGTERM to every rank; the job's metrics vanish (TrainingMetricsAbsent fires)."""
    return scenarios.ended_on_purpose(stack, "torch-scancel", lambda job: stack.slurm.command("scancel", job))


@pytest.fixture(scope="module")
def xid(stack: Stack) -> Scenario:
    """Xid 79 on node2 while the rank there dies of it; node2's validation fails (it is held)."""
    stack.inject_validation(CULPRIT, "fail")

    def xid_and_death(scenario: Scenario) -> None:
        stack.inject_xid(CULPRIT, 79, 3)
        faults.signal_rank(stack.sim.state_dir, scenario.name, signal.SIGKILL, node=CULPRIT)

    try:
        return scenarios.run(stack, "torch-xid", xid_and_death, recovers=True, avoid=(CULPRIT,))
    finally:  # the GPU fixed (the Xid and the failing validation cleared): the next scenario's job runs on node2
        faults.clear(stack.sim.state_dir, node=CULPRIT)


@pytest.fixture(scope="module")
def rendezvous(stack: Stack) -> Scenario:
    def lose_the_store_host(scenario: Scenario) -> None:
        faults.lose_node(stack.sim.state_dir, scenario.name, STORE_HOST)

    return scenarios.run(stack, "torch-rendezvous", lose_the_store_host, recovers=True, avoid=(STORE_HOST,))


@pytest.fixture(scope="module")
def warned(stack: Stack) -> Scenario:
    """A healthy job that warns (``--warn``) and ends by itself at its last step: its metrics vanish."""
    return scenarios.ended_on_purpose(
        stack, "torch-warnings", lambda job: None, max_steps=WARNING_JOB_STEPS, extra=("--warn",)
    )


def test_scancel_does_nothing(cancelled: Scenario) -> None:
    assert (
        "got signal: 15" in cancelled.log
    )  # torchrun's SignalException traceback: the SIGTERM scancel sends
    scenarios.assert_nothing_done(cancelled)


def test_xid_with_the_rank_s_death_is_one_incident_off_the_node(xid: Scenario) -> None:
    scenarios.assert_recovered_off(xid, CULPRIT)
    alerts = {a["labels"]["alertname"] for d in xid.incidents for a in d["alerts"]}
    assert "GpuXidError" in alerts  # the exporter's Xid joined the job's incident
    repairs = xid.stack.nightshift.get(f"/api/v1/nodes/{CULPRIT}")["repairs"]
    assert any("GpuXidError" in (r.get("reason") or "") for r in repairs), repairs  # taken out for its Xid


def test_xid_resumes_from_the_checkpoint(xid: Scenario) -> None:
    scenarios.assert_resumed_from_checkpoint(xid)


def test_the_rendezvous_host_lost_is_requeued_off_it(rendezvous: Scenario) -> None:
    """Nothing on node2 names node1 but srun's word on node1's task; the peers' errors are the victims'."""
    diagnosis = scenarios.diagnosis(rendezvous)
    assert diagnosis.get("category") == "nccl_network", diagnosis
    assert (diagnosis.get("culprit") or {}).get("node") == STORE_HOST, diagnosis
    assert f"srun: error: {STORE_HOST}: task 0: Killed" in rendezvous.log
    scenarios.assert_recovered_off(rendezvous, STORE_HOST)
    repairs = rendezvous.stack.nightshift.get(f"/api/v1/nodes/{STORE_HOST}")["repairs"]
    assert repairs and repairs[0]["incident_id"] == rendezvous.incident["id"]  # to the repair lifecycle


def test_the_rendezvous_host_lost_resumes_from_the_checkpoint(rendezvous: Scenario) -> None:
    scenarios.assert_resumed_from_checkpoint(rendezvous)


def test_a_healthy_run_with_warnings_is_left_alone(warned: Scenario) -> None:
    assert "`torch.cuda.amp.GradScaler(args...)` is deprecated" in warned.log  # FutureWarning
    assert "CUDA is not available.  Disabling." in warned.log  # UserWarning
    assert "find_unused_parameters=True was specified in DDP constructor" in warned.log  # DDP's reducer
    assert f"training finished at step {WARNING_JOB_STEPS}" in warned.log
    scenarios.assert_nothing_done(warned)
    outcomes = [d["incident"]["outcome"] for d in warned.incidents]
    assert all(outcome in scenarios.UNDECIDED for outcome in outcomes), outcomes  # none for a person
    assert scenarios.pages(warned) == []
    assert warned.stack.slurm.squeue_state(warned.job) == "COMPLETED"


def test_figures(
    sigkill: Scenario,
    hang: Scenario,
    exception: Scenario,
    cancelled: Scenario,
    xid: Scenario,
    rendezvous: Scenario,
    warned: Scenario,
    record_property: Any,
) -> None:
    """The figures of the issue per fault class, in the report (``-rA``, the JUnit XML, ARTIFACTS/figures.json)."""
    figures = scenarios.figures([sigkill, hang, exception, cancelled, xid, rendezvous, warned])
    for name, value in figures.items():
        record_property(name, value)
    print(json.dumps(figures, indent=2, default=str))
    assert all(f["decided"] <= 1 for f in figures.values()), figures
