"""The simulator on the real Slurm of the tests (four slurmd, sshd): a two-node training job with one rank per node
(srun), its end when one node's GPU fails, its return on other nodes from the ranks' common checkpoint; and the
``dcgmi`` look-alike reached over real SSH, whose verdict follows the faults injected on the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.clients.ssh import SshRunner
from sim import checkpoints, faults, statedir
from sim.cluster import TrainerSpec
from sim.procs import free_port
from sim.stack import NODES, submit_trainer_job
from tests.fixtures.procs import wait_until
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration

JOB = "llama-70b"


def test_the_cluster_has_four_idle_nodes(clean_slurm: SlurmCluster) -> None:
    assert NODES == ("node1", "node2", "node3", "node4")
    listing = clean_slurm.command("sinfo", "--noheader", "--Node", "--format=%N %t").stdout.split("\n")
    assert sorted(line.strip() for line in listing if line.strip()) == [f"{n} idle" for n in NODES]


def rank_status(state: Path, rank: int) -> dict[str, object]:
    return statedir.read_json(statedir.trainer_status_path(state, JOB, rank), {})


def test_a_two_node_job_fails_on_every_rank_and_resumes_on_other_nodes(
    clean_slurm: SlurmCluster, attached: Path, tmp_path: Path
) -> None:
    slurm, state = clean_slurm, attached
    spec = TrainerSpec(
        name=JOB,
        port=0,
        node_ports=tuple((node, free_port()) for node in NODES),
        state_dir=state,
        checkpoint_dir=tmp_path / "checkpoints",
        hostname="",
        step_seconds=0.05,
        checkpoint_every=10,
        linger=1.0,
        exit_on_gpu_fault=True,
    )
    job = submit_trainer_job(slurm, spec, ["node1", "node2"])
    wait_until(lambda: slurm.squeue_state(job) == "RUNNING", 30, f"job {job} RUNNING")
    assert slurm.job_node_list(job) == ["node1", "node2"]
    ranks = [tmp_path / "checkpoints" / f"rank{rank}" for rank in (0, 1)]
    wait_until(lambda: (checkpoints.newest_common(ranks) or 0) >= 20, 30, "two checkpoints on both ranks")
    assert [(rank_status(state, r)["hostname"], rank_status(state, r)["world_size"]) for r in (0, 1)] == [
        ("node1", 2),
        ("node2", 2),
    ]

    faults.inject_xid(state, "node2", 3, 79)
    wait_until(lambda: slurm.squeue_state(job) == "FAILED", 30, f"job {job} FAILED")
    log = (slurm.jobs_dir / f"{job}.out").read_text()
    assert "node2:" in log and "NCCL WARN Cuda failure 'unspecified launch failure'" in log
    assert "[rank0]:" in log and "[Rank 0] Watchdog caught collective operation timeout" in log
    assert "srun: error: node2: task 1: Exited with exit code 1" in log

    # What the requeue action does when node2 is the culprit: requeue, then keep the job off node2.
    common = checkpoints.newest_common(ranks)
    slurm.command("scontrol", "requeue", job)
    slurm.command("scontrol", "update", f"JobId={job}", "ExcNodeList=node2", "ReqNodeList=node1")
    wait_until(lambda: slurm.squeue_state(job) == "RUNNING", 60, f"job {job} RUNNING again")
    nodes = slurm.job_node_list(job)
    assert "node2" not in nodes and len(nodes) == 2
    for rank in (0, 1):
        resumed = f"[rank{rank}]: resuming from step {common} "
        wait_until(lambda line=resumed: line in (slurm.jobs_dir / f"{job}.out").read_text(), 30, resumed)
    assert slurm.job_restarts(job) == 1


def dcgmi(runner: SshRunner, node: str) -> tuple[int, str]:
    result = runner.run(["dcgmi", "diag", "-r", "2", "--host", node], timeout=30)
    return result.exit_code, result.stdout


def test_dcgmi_over_ssh_follows_the_node_s_faults(clean_slurm: SlurmCluster, attached: Path) -> None:
    runner = SshRunner.from_settings(clean_slurm.settings)
    try:
        code, output = dcgmi(runner, "node2")
        assert code == 0 and output.startswith("Successfully ran diagnostic for group.\n"), output

        faults.inject_xid(attached, "node2", 3, 79)
        code, output = dcgmi(runner, "node2")
        assert code == 226 and "| Warning: GPU3             | Detected XID 79 for GPU 3" in output
        assert dcgmi(runner, "node1")[0] == 0  # the fault is node2's

        faults.inject_validation(attached, "node2", "pass")
        assert dcgmi(runner, "node2")[0] == 0
        faults.clear(attached, node="node2")
        faults.inject_validation(attached, "node3", "fail")
        assert dcgmi(runner, "node3")[0] == 226

        clean_slurm.attach_sim(None)  # no simulated cluster: no host engine to reach
        code, output = dcgmi(runner, "node3")
        assert code == 255 and "unable to establish a connection to the specified host: node3" in output
    finally:
        runner.close()
