"""Real checkpoint-storage faults in real ``torch.distributed`` jobs on the real stack (see test_torch_faults.py for the
launch):

- ``corrupt``: the owner requeues the job (held) and, while it is down, its newest DCP checkpoint loses half of a shard
  (a save cut short). The restarted ranks fail in ``dcp.load`` with PyTorch's own ``PytorchStreamReader failed
  reading zip archive``. → the torn checkpoint rolled back (moved aside) and the job requeued, resuming from the
  checkpoint before it.
- ``enospc``: the job's checkpoints live on a file system of their own (a real tmpfs) that another tenant's data
  fills: the next DCP save fails with ``OSError: [Errno 28] No space left on device`` on the ranks, leaving a torn
  ``step-N`` without its ``.metadata``. The space comes back (the other tenant's data removed, as a scratch purge
  does). → one requeue (storage-transient: a shared file system names no culprit node), resuming from the last
  complete checkpoint. A file system that stays full fails the job again at its next save: the playbook's budget
  (3 a day, 15 min apart) then hands it to a person.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from app.domain.checkpoint_layouts import QUARANTINE_DIR
from sim import faults, statedir, torch_job
from sim.stack import Stack
from sim.torch_trainer import newest_checkpoint
from tests.e2e import torch_scenarios as scenarios
from tests.e2e.torch_scenarios import Scenario
from tests.fixtures.procs import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# The checkpoint file system: room for tens of this model's DCP checkpoints (~70 KB each), filled to this much free.
SMALL_FS_BYTES = 8 * 1024 * 1024
LEFT_FREE_BYTES = 4 * 1024


def _any_worker_pid(stack: Stack, name: str) -> int:
    """The pid of a live worker of job ``name``, 0 when none lives."""
    pids = [
        int(s.get("pid", 0)) for s in statedir.read_trainers(stack.sim.state_dir) if s.get("name") == name
    ]
    return next((pid for pid in pids if statedir.pid_alive(pid)), 0)


@pytest.fixture(scope="module")
def corrupt(stack: Stack) -> Scenario:
    def requeue_and_tear(scenario: Scenario) -> None:
        # Two checkpoints first: the rollback needs one before the torn one.
        root = stack.checkpoint_dir(scenario.name)
        wait_until(lambda: len(list(root.glob("step-*/.metadata"))) >= 2, 60, "two checkpoints")
        # Held while it is down, so that it cannot start again before the tear; released after it.
        stack.slurm.command("scontrol", "requeuehold", scenario.job)
        wait_until(lambda: stack.slurm.squeue_state(scenario.job) == "PENDING", 60, f"{scenario.job} held")
        wait_until(lambda: not _any_worker_pid(stack, scenario.name), 60, "workers gone")
        newest = newest_checkpoint(root)
        assert newest is not None
        scenario.checkpoint = newest[0]  # the torn one
        faults.truncate_checkpoint(newest[1])
        stack.slurm.command("scontrol", "release", scenario.job)

    return scenarios.run(stack, "torch-corrupt", requeue_and_tear, recovers=True)


@pytest.fixture(scope="module")
def enospc(stack: Stack) -> Scenario:
    name = "torch-enospc"
    root = faults.small_filesystem(stack.checkpoint_dir(name), SMALL_FS_BYTES)

    def fill_until_a_save_fails(scenario: Scenario) -> None:
        faults.fill_filesystem(root, LEFT_FREE_BYTES)
        wait_until(lambda: scenarios.job_incidents(stack, scenario.job), 120, "an incident of the full disk")
        (root / faults.BALLAST).unlink()  # the other tenant's data goes (a scratch purge)

    try:
        return scenarios.run(stack, name, fill_until_a_save_fails, recovers=True)
    finally:
        faults.release_filesystem(root)


def test_a_torn_checkpoint_is_rolled_back_and_the_one_before_resumed(corrupt: Scenario) -> None:
    incident, diagnosis = corrupt.incident, scenarios.diagnosis(corrupt)
    assert incident["outcome"] == "recovered", (incident.get("reason"), diagnosis)
    assert diagnosis.get("category") == "checkpoint_corrupt", diagnosis
    ran = [
        s["action"]
        for d in corrupt.incidents
        for s in d["steps"]
        if s["phase"] == "steps" and s["status"] == "ok"
    ]
    assert ran == ["checkpoint.rollback", "slurm.requeue_job"]
    assert (
        "PytorchStreamReader failed reading zip archive" in corrupt.log
    )  # DCP's own error on the torn shard
    resume = torch_job.resumes(corrupt.log)[-1]
    assert 0 < resume.step < corrupt.checkpoint  # the checkpoint before the torn one
    root = corrupt.stack.checkpoint_dir(corrupt.name)
    assert list((root / QUARANTINE_DIR).glob(f"step-{corrupt.checkpoint}.*"))  # moved aside, never deleted


def test_a_full_checkpoint_file_system_is_one_requeue_from_the_last_complete_checkpoint(
    enospc: Scenario,
) -> None:
    incident, diagnosis = enospc.incident, scenarios.diagnosis(enospc)
    assert (incident["outcome"], incident["job"]) == ("recovered", enospc.job), (
        incident.get("reason"),
        diagnosis,
    )
    assert diagnosis.get("category") == "storage_io", diagnosis
    assert "No space left on device" in enospc.log
    assert incident["culprits"] == [] or not any(
        c["confirmed"] for c in incident["culprits"]
    )  # shared storage
    (requeue,) = enospc.requeues()
    assert "ExcNodeList" not in requeue["command"]
    assert enospc.stack.slurm.job_restarts(enospc.job) == 1
    failed_at = [int(step) for step in re.findall(r"\[rank\d\]: rank \d failed at step (\d+)", enospc.log)]
    assert failed_at and torch_job.resumes(enospc.log)[-1].step < min(failed_at)  # the torn save never loaded
    scenarios.assert_resumed_from_checkpoint(enospc)


def test_figures(corrupt: Scenario, enospc: Scenario, record_property: Any) -> None:
    figures = scenarios.figures([corrupt, enospc])
    for name, value in figures.items():
        record_property(name, value)
    print(json.dumps(figures, indent=2, default=str))
    assert all(f["decided"] <= 1 for f in figures.values()), figures


def test_the_file_system_is_released(enospc: Scenario) -> None:
    assert not Path(enospc.stack.checkpoint_dir(enospc.name)).is_mount()
