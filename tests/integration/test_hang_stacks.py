"""A silent hang explained on the real Slurm stack: one rank of a two-node job hangs in a different place
from the others, ``slurm.job_stacks`` dumps every rank's Python stack with py-spy over SSH + srun, and the
diagnosis names the hung rank and its node."""

from __future__ import annotations

import shlex
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.actions.base import ActionContext
from app.actions.stacks import JobStacks
from app.clients import Clients
from app.domain.diagnosis import diagnose
from app.domain.outcome import Failed, Ok
from tests.fixtures.procs import wait_until
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).parents[2]
PY_SPY = Path(sys.executable).parent / "py-spy"  # a dev dependency, installed into the venv
WORLD = 4
STUCK_RANK = 3


@pytest.fixture
def ctx(slurm_cluster: SlurmCluster) -> Iterator[ActionContext]:
    clients = Clients(slurm_cluster.settings)
    yield ActionContext(settings=slurm_cluster.settings, clients=clients)
    clients.close()


@pytest.fixture
def hung_job(clean_slurm: SlurmCluster) -> Iterator[tuple[str, Path]]:
    """A 4-rank job on two nodes whose rank 3 hangs in load_batch at step 3; (job id, shared directory) once
    every rank has reached its hanging place."""
    shared = clean_slurm.jobs_dir / f"collective-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "sim.collective", "--dir", str(shared)]
    command += ["--stuck-rank", str(STUCK_RANK), "--stuck-after", "3", "--step-seconds", "0.05"]
    wrap = f"cd {shlex.quote(str(REPO_ROOT))} && exec srun {shlex.join(command)}"
    job = clean_slurm.sbatch(wrap, "--nodes=2", f"--ntasks={WORLD}", "--ntasks-per-node=2", "--job-name=hang")

    def stuck() -> bool:
        steps = [shared / f"rank{rank}.step" for rank in range(WORLD)]
        if not all(path.exists() for path in steps):
            return False
        values = [int(path.read_text() or -1) for path in steps]
        return values == [3, 3, 3, 2]  # the others wait in all_reduce at step 3; rank 3 never got there

    wait_until(stuck, 30, f"job {job}'s ranks to hang (state {clean_slurm.squeue_state(job)})")
    yield job, shared
    clean_slurm.command("scancel", job, check=False)


def test_the_stacks_name_the_hung_rank_and_its_node(
    hung_job: tuple[str, Path], ctx: ActionContext, clean_slurm: SlurmCluster
) -> None:
    job, shared = hung_job
    outcome = JobStacks().run({"job": job, "py_spy": str(PY_SPY)}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["processes"] == WORLD, outcome.output
    assert outcome.command.startswith(f"srun --jobid={job} --overlap --nodelist=")
    nodes = {(shared / f"rank{rank}.node").read_text() for rank in range(WORLD)}
    assert set(outcome.data["nodes"]) == nodes and len(nodes) == 2
    hung_node = (shared / f"rank{STUCK_RANK}.node").read_text()
    alert_node = (shared / "rank0.node").read_text()
    assert hung_node != alert_node  # rank 0 and rank 3 run on different nodes (two per node)

    labels = {"alertname": "TrainingHang", "Hostname": alert_node, "slurm_job_id": job}
    result = diagnose(labels, outcome.data["log"])
    assert result.category == "hang", result.summary
    assert result.culprit is not None
    assert (result.culprit.node, result.culprit.rank) == (hung_node, STUCK_RANK)
    assert f"rank {STUCK_RANK} on {hung_node} is stuck in load_batch (sim/collective.py)" in result.summary
    assert f"The alert came from {alert_node}; the log points at {hung_node}." in result.summary
    assert result.as_dict()["culprit"]["node"] == hung_node and result.actionable


def test_without_py_spy_on_the_nodes_the_action_says_so(
    hung_job: tuple[str, Path], ctx: ActionContext
) -> None:
    job, _ = hung_job
    outcome = JobStacks().run({"job": job, "py_spy": "/nonexistent/py-spy"}, ctx)
    assert isinstance(outcome, Failed), outcome
    assert f"job {job}: no Python stack or Flight Recorder could be dumped" in outcome.reason
    assert "/nonexistent/py-spy" in outcome.reason


def test_a_job_that_is_not_running_has_no_stacks(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    job = clean_slurm.sbatch("true", "--hold")
    wait_until(lambda: clean_slurm.squeue_state(job) == "PENDING", 10, f"job {job} pending")
    outcome = JobStacks().run({"job": job}, ctx)
    assert isinstance(outcome, Failed) and "is PENDING" in outcome.reason
