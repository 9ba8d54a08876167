"""A real ``torch.distributed`` job under Slurm, launched as clusters launch one (:mod:`sim.torch_trainer`).

``sbatch job.sh`` → ``srun`` one task per node (``node.sh``) → ``torchrun --nnodes N --nproc-per-node P
--node-rank $SLURM_NODEID --rdzv-backend c10d --rdzv-endpoint <first node's address>:<port> --rdzv-id
$SLURM_JOB_ID`` → the workers. Each node's task runs in a UTS namespace of its own (``unshare --uts``) whose host
name is the node's name, so torchrun's failure summary says ``host: node2`` as on a real cluster (the nodes of the
fixtures' Slurm share one machine). The simulated nodes share the loopback interface: gloo binds ``lo``
(``GLOO_SOCKET_IFNAME``), each agent announces its node's address (``--local-addr``), and the first node's agent
hosts the rendezvous store (``is_host``: every agent would otherwise recognise 127.0.0.x as its own).

Checkpoint requests (Nightshift's planned swaps and stragglers, ``progress/README.md``): the job announces
``nightshift.checkpoint_signal=B:USR1`` and its batch script traps SIGUSR1 (``scancel --batch --signal=USR1``) and
touches the request file, ``NIGHTSHIFT_CHECKPOINT_REQUEST_FILE``, which srun passes on to every rank; the ranks
poll it (:mod:`nightshift_progress.checkpoint_request`) and agree in one all-reduce to save the same step. The
signal cannot go to the steps: every process of the step gets it, torchrun included, and torchrun either dies of
it (SIGUSR1's default action; its workers, in sessions of their own, train on as orphans outside Slurm's
control) or, with ``--signals-to-handle`` listing it, forwards it to the workers and shuts them down: the job
ends either way. So the batch script runs ``srun`` in the background and waits for it, the trap running between.

:func:`write_scripts` writes the two scripts of a :class:`TorchJobSpec`; :func:`submit` submits them.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sim.cluster import REPO_ROOT

BIN = Path(sys.executable).parent
# The checkpoint request file, in the job's directory (shared by the nodes, as a job's directory is on a cluster).
REQUEST_FILE = "checkpoint-request"
# Collectives each rank's Flight Recorder keeps (about 500 bytes of JSON each: within slurm.job_stacks' bound).
FLIGHT_RECORDER_ENTRIES = 200


class Submitter(Protocol):
    def sbatch(self, wrap: str | None = None, *args: str, script: str | None = None) -> str: ...


@dataclass(frozen=True)
class TorchJobSpec:
    """What to run: the trainer's options (:mod:`sim.torch_trainer`) and torchrun's."""

    name: str
    port: int  # the progress endpoint's port on every node (announced in the job's comment)
    rdzv_port: int  # the rendezvous store's port on the first node
    state_dir: Path
    checkpoint_dir: Path
    node_hosts: Mapping[str, str]  # node → its address (Slurm's NodeAddr)
    strategy: str = "ddp"
    nproc_per_node: int = 1
    max_restarts: int = 0
    step_seconds: float = 0.2
    checkpoint_every: int = 10
    max_steps: int = 0
    collective_timeout: float = 60.0
    linger: float = 3.0
    trainer: str = "sim.torch_trainer"  # the module torchrun starts (sim.hf_trainer, sim.lightning_trainer)
    extra: Sequence[str] = field(default_factory=tuple)  # more trainer options

    def trainer_argv(self) -> list[str]:
        hosts = ",".join(f"{node}={address}" for node, address in self.node_hosts.items())
        argv = ["--name", self.name, "--port", str(self.port), "--node-hosts", hosts]
        argv += ["--checkpoint-dir", str(self.checkpoint_dir), "--state-dir", str(self.state_dir)]
        argv += ["--step-seconds", str(self.step_seconds), "--checkpoint-every", str(self.checkpoint_every)]
        argv += ["--max-steps", str(self.max_steps), "--linger", str(self.linger)]
        argv += ["--collective-timeout", str(self.collective_timeout)]
        if self.trainer == "sim.torch_trainer":
            argv += ["--strategy", self.strategy]
        return [*argv, *self.extra]


# The batch script: the first node's address is the rendezvous endpoint; srun starts node.sh once per node. A
# SIGUSR1 to the batch shell (scancel --batch --signal=USR1) asks the ranks for a checkpoint through the request file;
# srun runs in the background so that the trap runs while the job does (bash runs a trap between waits).
JOB_SCRIPT = """\
#!/bin/bash
# {name}: a torch.distributed job (sim.torch_job). srun starts one torchrun per node.
set -u
declare -A ADDR=({addresses})
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export RDZV_ENDPOINT="${{ADDR[$head]}}:{rdzv_port}"
export NIGHTSHIFT_CHECKPOINT_REQUEST_FILE={request_file}
trap 'echo "checkpoint requested (SIGUSR1)"; touch "$NIGHTSHIFT_CHECKPOINT_REQUEST_FILE"' USR1
echo "job $SLURM_JOB_ID ({name}) on $SLURM_JOB_NODELIST, restart ${{SLURM_RESTART_COUNT:-0}}, rendezvous $RDZV_ENDPOINT"
srun --kill-on-bad-exit=0 {node_script} &
step=$!
status=0
while kill -0 "$step" 2>/dev/null; do
  wait "$step"; status=$?  # a trapped signal ends the wait early (status > 128) while the step runs on
done
exit "$status"
"""
# One node's task: a host name of its own, then torchrun (exec: srun's signals reach torchrun, which forwards them).
NODE_SCRIPT = """\
#!/bin/bash
# {name}: one node of the job (sim.torch_job), started by srun.
set -u
declare -A ADDR=({addresses})
local_addr=${{ADDR[$SLURMD_NODENAME]}}
is_host=$([ "$SLURM_NODEID" = 0 ] && echo 1 || echo 0)
cd {repo}
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONPATH={repo}
export TORCH_FR_BUFFER_SIZE={flight_recorder}  # the Flight Recorder's entries, read on demand (slurm.job_stacks)
exec unshare --uts /bin/bash -c 'hostname "$SLURMD_NODENAME" && exec "$@"' node \\
  {torchrun} --nnodes "$SLURM_NNODES" --nproc-per-node {nproc} --node-rank "$SLURM_NODEID" \\
  --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$SLURM_JOB_ID" \\
  --rdzv-conf "is_host=$is_host" --local-addr "$local_addr" --max-restarts {max_restarts} \\
  -m {module} {trainer_args}
"""


def write_scripts(spec: TorchJobSpec, directory: Path) -> Path:
    """Write ``job.sh`` and ``node.sh`` of ``spec`` into ``directory``; the batch script's path."""
    directory.mkdir(parents=True, exist_ok=True)
    addresses = " ".join(f"[{node}]={shlex.quote(address)}" for node, address in spec.node_hosts.items())
    node_script = directory / "node.sh"
    node_script.write_text(
        NODE_SCRIPT.format(
            name=spec.name,
            addresses=addresses,
            repo=shlex.quote(str(REPO_ROOT)),
            torchrun=shlex.quote(str(BIN / "torchrun")),
            nproc=spec.nproc_per_node,
            max_restarts=spec.max_restarts,
            module=spec.trainer,
            trainer_args=shlex.join(spec.trainer_argv()),
            flight_recorder=FLIGHT_RECORDER_ENTRIES,
        )
    )
    node_script.chmod(0o755)
    job_script = directory / "job.sh"
    job_script.write_text(
        JOB_SCRIPT.format(
            name=spec.name,
            addresses=addresses,
            rdzv_port=spec.rdzv_port,
            node_script=shlex.quote(str(node_script)),
            request_file=shlex.quote(str(directory / REQUEST_FILE)),
        )
    )
    return job_script


def submit(
    slurm: Submitter, spec: TorchJobSpec, nodes: Sequence[str], directory: Path, *sbatch_args: str
) -> str:
    """Submit ``spec`` as a requeueable batch job on ``nodes`` (one task per node); the job id. The job announces
    in its comment its progress port (``nightshift.progress_port``, read by Nightshift's service discovery) and
    that its batch shell takes checkpoint requests (``nightshift.checkpoint_signal=B:USR1``)."""
    script = write_scripts(spec, directory).read_text()
    return slurm.sbatch(
        None,
        "--requeue",
        f"--nodes={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        f"--job-name={spec.name}",
        "--open-mode=append",  # a requeued run adds to the log
        f"--comment=nightshift.progress_port={spec.port},nightshift.checkpoint_signal=B:USR1",
        *sbatch_args,
        script=script,
    )


# --- reading a job's log -------------------------------------------------------------------------------------------

_RESUMED = re.compile(r"\[rank0\]: resuming from step (\d+) \(loss (\S+),")
_LOSS = re.compile(r"\[rank0\]: step (\d+) loss: (\S+)")
_SAVED = re.compile(r"\[rank0\]: saved checkpoint \S+ \(step (\d+), loss ([^)\s]+)\)")


@dataclass(frozen=True)
class Resume:
    """One run of the job resuming: the checkpoint's step and the loss saved with it."""

    step: int
    loss: float


def resumes(log: str) -> list[Resume]:
    """Every resume in a job's log (rank 0's lines; the other ranks load the same checkpoint), oldest first."""
    return [Resume(int(step), float(loss)) for step, loss in _RESUMED.findall(log)]


def saves(log: str) -> list[tuple[int, float]]:
    """(step, loss) of every checkpoint rank 0 saved, in log order: the loss is the one saved with it (a save on
    request lands on any step, where no loss line may have been logged)."""
    return [(int(step), float(loss)) for step, loss in _SAVED.findall(log)]


def losses(log: str) -> list[tuple[int, float]]:
    """(step, loss) of every loss line rank 0 logged, in log order (a resumed run repeats steps)."""
    return [(int(step), float(loss)) for step, loss in _LOSS.findall(log)]
