"""deploy/slurm/hpc-job-mapping.sh as the real slurmd runs it (Prolog=/Epilog= in the fixture's slurm.conf,
PrologFlags=Alloc): every node of a job gets one file per GPU holding the job id, which the simulated
dcgm-exporter turns into ``hpc_job`` labels exactly as dcgm-exporter does; the epilog removes them; a mapping that
cannot be written never fails the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import statedir
from sim.dcgm_exporter import Exporter
from tests.fixtures.procs import wait_until
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration


def _jobs_on(state: Path, node: str, gpu: int) -> list[str]:
    path = statedir.hpc_job_dir(state, node) / str(gpu)
    return path.read_text().split() if path.exists() else []


def test_prolog_maps_every_gpu_of_every_node_and_epilog_unmaps(
    clean_slurm: SlurmCluster, attached: Path
) -> None:
    job = clean_slurm.sbatch("sleep 120", "--nodes=2", "--nodelist=node2,node3")
    wait_until(lambda: all(_jobs_on(attached, n, 7) == [job] for n in ("node2", "node3")), 30, "the mapping")

    assert all(_jobs_on(attached, node, gpu) == [job] for node in ("node2", "node3") for gpu in range(8))
    assert not statedir.hpc_job_dir(attached, "node1").exists()
    text = Exporter(attached, ["node2", "node1"], 8).render().decode()
    temps = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert sum(f'hpc_job="{job}"' in line for line in temps) == 8  # node2's GPUs only
    assert sum('Hostname="node1"' in line and "hpc_job" not in line for line in temps) == 8

    clean_slurm.command("scancel", job)
    wait_until(
        lambda: not any(_jobs_on(attached, "node2", g) for g in range(8)), 30, "the epilog's unmapping"
    )


def test_a_mapping_that_cannot_be_written_never_fails_the_job(
    clean_slurm: SlurmCluster, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    log = tmp_path / "mapping.log"
    conf = clean_slurm.base / "slurm" / "hpc-job-mapping.conf"
    conf.write_text(f"HPC_JOB_MAPPING_DIR={blocker}/%n\nNODE_GPUS=0-7\nLOG_FILE={log}\n")
    try:
        job = clean_slurm.sbatch("echo ran", "--nodelist=node1")
        wait_until(lambda: clean_slurm.squeue_state(job) in ("", "COMPLETED"), 30, f"job {job} done")
        assert (clean_slurm.jobs_dir / f"{job}.out").read_text() == "ran\n"
        assert "drain" not in clean_slurm.node_state("node1")  # a failing prolog would have drained it
        assert f"job {job} on node1: cannot create {blocker}/node1; nothing mapped" in log.read_text()
    finally:
        clean_slurm.attach_sim(None)
