"""The real training jobs of the simulator under the real Slurm, each requeued once: DDP and FSDP2 with DCP
checkpoints (:mod:`sim.torch_trainer`), the Hugging Face Trainer (:mod:`sim.hf_trainer`, ``checkpoint-N`` and
``resume_from_checkpoint``) and Lightning (:mod:`sim.lightning_trainer`, ``step-N.ckpt`` and ``fit(ckpt_path)``),
so the progress library's framework callbacks run for real.

Every job runs two nodes (sbatch → srun → torchrun c10d, :mod:`sim.torch_job`); the jobs run at the same time to
keep the time down. Each must: name its node in torchrun's environment (a UTS namespace per node), serve the
progress metrics at its first node's address, checkpoint when asked, and after ``scontrol requeue`` resume from
its newest checkpoint with the loss it had (a run from scratch starts tens of times higher).

The checkpoints are asked for, never scheduled (every 100000 steps): the request Nightshift's
``slurm.request_checkpoint`` sends, with the signal the job's comment announces (``scancel --batch
--signal=USR1``), trapped by the batch script, which touches the request file the ranks poll; so each framework's
callback answers a request for real (the HF Trainer's ``control.should_save``, Lightning's ``save_checkpoint``,
the DCP save of :mod:`sim.torch_trainer`), every rank at the same step.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from app.clients.slurm import signal_command
from app.domain.discovery import checkpoint_signal
from sim import torch_job
from sim.cluster import scrape
from sim.procs import free_port
from sim.stack import NODE_ADDRESSES
from tests.fixtures.procs import wait_until
from tests.fixtures.slurm import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]  # the fixture: four torch jobs, each twice

START_TIMEOUT = 300  # several torch jobs starting at once on two shared cores
VARIANTS = {
    "ddp": ("sim.torch_trainer", "ddp", ["node1", "node2"]),
    "fsdp": ("sim.torch_trainer", "fsdp", ["node3", "node4"]),
    "hf": ("sim.hf_trainer", "ddp", ["node1", "node2"]),
    "lightning": ("sim.lightning_trainer", "ddp", ["node3", "node4"]),
}
LOSS_TOLERANCE = 2.0
NEVER = 100_000  # steps between scheduled checkpoints: none in these runs, every checkpoint is asked for


@dataclass(frozen=True)
class Job:
    variant: str
    job: str
    spec: torch_job.TorchJobSpec
    nodes: list[str]
    slurm: SlurmCluster

    def log(self) -> str:
        path = self.slurm.jobs_dir / f"{self.job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def metric(self, name: str) -> float:
        text = scrape(f"{NODE_ADDRESSES[self.first_node]}:{self.spec.port}")
        match = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
        assert match, f"{name} not served:\n{text}"
        return float(match.group(1))

    @property
    def first_node(self) -> str:
        return self.nodes[0]


def _saved_steps(log: str, rank: int = 0) -> list[int]:
    """The steps ``rank`` checkpointed (sim.torch_trainer's and the HF variant's "saved", Lightning's "saving")."""
    found = re.findall(rf"\[rank{rank}\]: sav(?:ed|ing) checkpoint \S*?(?:step-|checkpoint-)(\d+)", log)
    return [int(step) for step in found]


def _ask_for_a_checkpoint(job: Job) -> None:
    """What ``slurm.request_checkpoint`` does: the signal the job's comment announces, with Nightshift's argv."""
    comment = job.slurm.command("squeue", "--noheader", f"--jobs={job.job}", "--format=%k").stdout
    signal = checkpoint_signal(comment.strip())
    assert signal == "B:USR1", comment  # torchrun jobs take requests in the batch shell (sim.torch_job)
    job.slurm.command(*signal_command(job.job, signal))


def _checkpointed_when_asked(job: Job, count: int) -> None:
    """Ask ``job`` for checkpoints until rank 0 has saved ``count`` (one request at a time)."""
    while len(_saved_steps(job.log())) < count:
        saved = len(_saved_steps(job.log()))
        _ask_for_a_checkpoint(job)
        wait_until(
            lambda s=saved: len(_saved_steps(job.log())) > s, 120, f"{job.variant} checkpoint on request"
        )


@pytest.fixture(scope="module")
def requeued(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Job]]:
    """Every variant trained, checkpointed twice, requeued, and resumed."""
    slurm_cluster.reset()
    base = tmp_path_factory.mktemp("torch-variants")
    jobs = {}
    for variant, (module, strategy, nodes) in VARIANTS.items():
        spec = torch_job.TorchJobSpec(
            name=f"torch-{variant}", port=free_port(), rdzv_port=free_port(), state_dir=base / "state",
            checkpoint_dir=base / "checkpoints" / variant, node_hosts=NODE_ADDRESSES, strategy=strategy,
            trainer=module, checkpoint_every=NEVER, step_seconds=0.3,
        )  # fmt: skip
        job = torch_job.submit(slurm_cluster, spec, nodes, base / "jobs" / variant)
        jobs[variant] = Job(variant, job, spec, nodes, slurm_cluster)
    try:
        for job in jobs.values():
            wait_until(lambda j=job: torch_job.losses(j.log()), START_TIMEOUT, f"{job.variant} training")
        for job in jobs.values():
            _checkpointed_when_asked(job, 2)
            job.slurm.command("scontrol", "requeue", job.job)
        for job in jobs.values():
            wait_until(lambda j=job: torch_job.resumes(j.log()), START_TIMEOUT, f"{job.variant} resumed")
            resumed = torch_job.resumes(job.log())[-1].step
            wait_until(
                lambda j=job, r=resumed: any(
                    s > r for s, _ in torch_job.losses(j.log().split("resuming from")[-1])
                ),
                120,
                f"{job.variant} training after its resume",
            )
        yield jobs
    finally:
        slurm_cluster.reset()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_resumes_from_its_checkpoint_with_its_loss(requeued: dict[str, Job], variant: str) -> None:
    job = requeued[variant]
    log = job.log()
    resume = torch_job.resumes(log)[-1]
    assert resume.step in _saved_steps(log.split("resuming from")[0])  # a checkpoint the first run saved
    after = [loss for step, loss in torch_job.losses(log.split("resuming from")[-1]) if step > resume.step]
    assert after and after[0] < LOSS_TOLERANCE * resume.loss + 0.05, (resume, after[:3])
    first_run = torch_job.losses(log.split("resuming from")[0])
    assert first_run[0][1] > after[0]  # lower than the first run's start: the weights were loaded


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_rank_checkpoints_the_same_step_when_asked(requeued: dict[str, Job], variant: str) -> None:
    first_run = requeued[variant].log().split("resuming from")[0]
    asked = _saved_steps(first_run)
    assert len(asked) >= 2 and all(step % NEVER for step in asked)  # on request, not on schedule
    assert _saved_steps(first_run, rank=1) == asked  # the ranks agreed on the step (the save is collective)
    assert torch_job.resumes(requeued[variant].log())[-1].step == asked[-1]  # the newest, asked-for one


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_progress_is_served_with_the_resumed_step(requeued: dict[str, Job], variant: str) -> None:
    job = requeued[variant]
    resume = torch_job.resumes(job.log())[-1]
    assert wait_until(lambda: job.metric("training_step_total") > resume.step, 60, "steps past the resume")
    assert job.metric("training_last_checkpoint_timestamp_seconds") > 0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_torchrun_runs_on_the_node_s_own_host_name(requeued: dict[str, Job], variant: str) -> None:
    job = requeued[variant]
    for node in job.nodes:  # the rendezvous assigns the ranks: any rank, but on each node its own name
        assert re.search(rf"\[rank\d\]: {job.spec.name} on {node} \(host name {node}\)", job.log())
