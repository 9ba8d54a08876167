"""A real ``torch.distributed`` training job: one worker of ``torchrun ... -m sim.torch_trainer --name N ...``.

The simulator's other trainer (:mod:`sim.trainer`) plays a job; this one is one: a small MLP regression trained
with DDP (``--strategy ddp``) or FSDP2 (``--strategy fsdp``, ``torch.distributed.fsdp.fully_shard``) over gloo on
CPU, every rank a process that torchrun started, with the environment torchrun gives it (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...). :mod:`sim.torch_job` launches it as clusters do: ``sbatch``
→ ``srun`` one task per node → ``torchrun --nnodes N --node-rank $SLURM_NODEID --rdzv-backend c10d``.

Every ``--checkpoint-every`` steps it saves model and optimizer with ``torch.distributed.checkpoint`` into
``C/step-<N>/`` (``__<rank>_0.distcp`` shards and ``.metadata``, torchtitan's naming); at start it resumes from
the newest ``step-<N>`` holding a ``.metadata`` (logging ``resuming from step N (loss L)``), and a checkpoint that
does not load fails the job with DCP's own error. Data are drawn from a generator seeded by (step, rank), so a
resumed run sees the batches it would have seen: its loss continues from the checkpointed one.

Progress goes through the progress library (progress/): ``training_step_total``, ``training_loss`` (the mean over
ranks), checkpoint markers, and error classes through its logging handler, which reads the text of every
exception the worker logs before it exits. Local rank 0 serves ``/metrics`` on the job's port at its node's
address (``--node-hosts``). The worker writes its status (pid, node, step, a heartbeat every step) to
``D/trainers/<name>[.rank<N>].json``, where :mod:`sim.faults` finds the process to signal and the simulated
exporter sees whether its GPUs are busy.

Faults read on every step from ``D/faults.json`` (:func:`sim.faults.inject_rank_fault`), each for one rank (or
every rank) of the job and consumed once: ``exception`` (a Python error raised in the training step), ``nan``
(the rank's inputs become NaN for ``count`` steps: the loss and, through DDP's all-reduce, every rank's weights),
``oom`` (the rank allocates until the memory limit of its cgroup kills it). Signals (SIGKILL, SIGSTOP) come from
outside, as they do on a cluster.

A rank checks its own loss before the gradients mix, as Megatron-LM's ``check_for_nan_in_loss_and_grad`` does, and
logs Megatron's words (``Rank 1: found NaN in local forward loss calculation. Device: cpu, node: node2``) when it
is not finite; that step is then skipped on every rank (a GradScaler-style skip: the weights stay finite), its loss
is reported as NaN and no loss line is logged. So a rank whose own computation goes wrong again and again (silent
data corruption) names itself, and a diverging model shows on every rank. Each rank serves PyTorch's worker server
on its debug socket (:mod:`nightshift_progress.torch_debug`), so its Flight Recorder (``TORCH_FR_BUFFER_SIZE``,
set by :mod:`sim.torch_job`) can be read while it hangs.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import nightshift_progress
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from nightshift_progress.identity import identity_from_env
from nightshift_progress.torch_debug import serve_debug_socket
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.elastic.multiprocessing.errors import record

from sim import faults, statedir

log = logging.getLogger("sim.torch_trainer")

STRATEGIES = ("ddp", "fsdp")
FEATURES = 16
HIDDEN = 64
_STEP_DIR = re.compile(r"^step-(\d+)$")
DCP_METADATA = ".metadata"


@dataclass(frozen=True)
class Settings:
    strategy: str = "ddp"
    step_seconds: float = 0.2
    checkpoint_every: int = 10
    batch_size: int = 32
    lr: float = 0.01
    max_steps: int = 0  # 0: until stopped
    log_every: int = 10
    linger: float = 3.0
    collective_timeout: float = 60.0
    # A rank failing at start-up serves until Prometheus has scraped it, this long at most (Progress.close).
    scrape_wait: float = 30.0
    warn: bool = False  # a healthy job that warns (build_model)


def newest_checkpoint(root: Path) -> tuple[int, Path] | None:
    """The newest complete DCP checkpoint under ``root`` (``step-<N>`` holding ``.metadata``), None if none."""
    found = []
    for path in root.glob("step-*") if root.is_dir() else ():
        match = _STEP_DIR.match(path.name)
        if match and (path / DCP_METADATA).is_file():
            found.append((int(match.group(1)), path))
    return max(found, default=None)


def build_model(strategy: str, warn: bool = False) -> torch.nn.Module:
    """The model under ``strategy``. ``warn``: built as a job that warns and trains on (PyTorch's own warnings:
    DDP's reducer on ``find_unused_parameters`` that found none, the CUDA GradScaler asked for on a CPU)."""
    if warn:
        torch.cuda.amp.GradScaler()  # FutureWarning (deprecated) and UserWarning (no CUDA: disabled)
    torch.manual_seed(0)  # every rank starts from the same weights
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1),
    )  # fmt: skip
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)  # in place: the model, its class now FSDP-wrapped
        return model
    return torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=warn)


# The target: a fixed random linear map the model learns (the same on every rank and every run).
_TRUTH = torch.Generator().manual_seed(1234)
TRUE_WEIGHTS = torch.randn(FEATURES, 1, generator=_TRUTH)


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``rank`` at ``step``: the same in every run, so a resumed run continues its loss curve."""
    generator = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(size, FEATURES, generator=generator)
    return x, x @ TRUE_WEIGHTS + 0.05 * torch.randn(size, 1, generator=generator)


class Worker:
    """One rank. :meth:`run` trains until ``max_steps``, a fault or a signal."""

    def __init__(
        self, name: str, settings: Settings, checkpoint_dir: Path, state_dir: Path, port: int, addr: str
    ):
        env = os.environ
        self.name = name
        self.settings = settings
        self.checkpoint_dir = checkpoint_dir
        self.state_dir = state_dir
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.node = node_name(env)
        self.slurm_job_id = env.get("SLURM_JOB_ID", "")
        self.progress = nightshift_progress.Progress(identity_from_env(env, name, self.node))
        self.port, self.addr = port, addr
        self.step = 0
        self.nan_steps = 0
        self.checkpoint_asked = False  # whether any rank was asked to checkpoint in the last step
        self.phase = "starting"
        self.saving = False  # inside a checkpoint save (sim.faults.stop_rank stops a rank in or out of one)
        self.debug_server: Any = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, settings: Settings) -> Worker:
        """The worker of this process (its node: :func:`node_name`) for the command line ``args``."""
        node = node_name(os.environ)
        address = node_address(args.node_hosts, node)
        return cls(args.name, settings, args.checkpoint_dir, args.state_dir, args.port, address)

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def status(self, phase: str | None = None) -> None:
        """Write this rank's status (read by sim.faults and the simulated exporter)."""
        self.phase = phase or self.phase
        now = time.time()
        statedir.write_json(
            statedir.trainer_status_path(self.state_dir, self.name, self.rank),
            {
                "name": self.name, "hostname": self.node, "slurm_job_id": self.slurm_job_id, "namespace": "",
                "pod": "", "rank": self.rank, "world_size": self.world_size, "pid": os.getpid(),
                "port": self.port, "checkpoint_dir": str(self.checkpoint_dir), "phase": self.phase,
                "step": self.step, "saving": self.saving, "updated": now, "heartbeat": now, "trainer": "torch",
            },
        )  # fmt: skip

    # -- checkpoints ------------------------------------------------------------------------------------------
    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: float) -> None:
        path = self.checkpoint_dir / f"step-{self.step}"
        self.saving = True
        self.status()
        try:
            with self.progress.checkpointing():
                model_state, optim_state = get_state_dict(model, optimizer)
                state = {
                    "model": model_state,
                    "optim": optim_state,
                    "train": {"step": self.step, "loss": loss},
                }
                dcp.save(state, checkpoint_id=path)
        finally:
            self.saving = False
            self.status()
        log.info("saved checkpoint %s (step %d, loss %.4f)", path, self.step, loss)

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the newest complete checkpoint (DCP's error propagates when it does not load)."""
        newest = newest_checkpoint(self.checkpoint_dir)
        if newest is None:
            log.info("no checkpoint in %s, starting from step 0", self.checkpoint_dir)
            return
        _, path = newest
        model_state, optim_state = get_state_dict(model, optimizer)
        state: dict[str, Any] = {
            "model": model_state,
            "optim": optim_state,
            "train": {"step": 0, "loss": 0.0},
        }
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.step = int(state["train"]["step"])
        loss = float(state["train"]["loss"])
        self.progress.resumed(
            self.step, self.step * self.settings.batch_size * self.world_size, path.stat().st_mtime
        )
        log.info("resuming from step %d (loss %.4f, %s)", self.step, loss, path)

    # -- faults -----------------------------------------------------------------------------------------------
    def apply_faults(self) -> None:
        """Act on this rank's pending faults (:func:`sim.faults.inject_rank_fault`)."""
        pending = faults.load(self.state_dir).rank_faults(self.name, self.rank)
        if not pending:
            return
        for kind, value in pending.items():
            if not faults.consume_rank_fault(self.state_dir, self.name, self.rank, kind):
                continue
            if kind == "exception":
                raise ValueError(
                    f"Expected input batch_size ({self.settings.batch_size}) to match target batch_size "
                    f"({self.settings.batch_size // 2})."
                )  # a data-pipeline bug, as PyTorch's loss functions word it
            if kind == "nan":
                self.nan_steps = int(value.get("count", 1_000_000))
            if kind == "oom":
                hog = []
                while True:  # until the cgroup's memory.max makes the kernel OOM killer end this process
                    hog.append(torch.ones(64 * 1024 * 1024, dtype=torch.uint8))

    # -- training ---------------------------------------------------------------------------------------------
    def train_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """One step; the job's loss (the mean over ranks, NaN when a rank's was not finite: the step is skipped)."""
        x, y = batch(self.step, self.rank, self.settings.batch_size)
        if self.nan_steps > 0:
            self.nan_steps -= 1
            x = torch.full_like(x, math.nan)
        optimizer.zero_grad()
        with (
            self.progress.timing()
        ):  # this rank's own work (DDP's forward has no collective): stragglers show here
            loss = torch.nn.functional.mse_loss(model(x), y)
        finite = bool(torch.isfinite(loss))
        if (
            not finite
        ):  # checked before the gradients mix, as Megatron-LM's check_for_nan_in_loss_and_grad does
            log.error(
                "Rank %d: found NaN in local forward loss calculation. Device: cpu, node: %s (step %d skipped)",
                self.rank, self.node, self.step + 1,
            )  # fmt: skip
        loss.backward()
        # One all-reduce for the job's loss (the mean over ranks), whether any rank was asked to checkpoint (SIGUSR1
        # or the request file, nightshift_progress.checkpoint_request: a DCP save is collective) and whether any
        # rank's loss was not finite (then no rank steps: a GradScaler-style skip keeps the weights finite).
        packed = torch.stack(
            [
                loss.detach(),
                torch.tensor(float(self.progress.checkpoint_requested())),
                torch.tensor(float(not finite)),
            ]
        )
        dist.all_reduce(packed)
        self.checkpoint_asked = bool(packed[1] > 0)
        if packed[2] == 0:
            optimizer.step()
        return float(packed[0]) / self.world_size

    def start(self) -> None:
        """Serve the progress endpoint, count logged errors, say who and where this rank is."""
        self.progress.serve(self.port, self.addr)
        self.progress.checkpoint_request.install_signal(
            signal.SIGUSR1
        )  # srun-launched; torchrun: the request file
        logging.getLogger().addHandler(self.progress.log_handler())  # error lines -> training_errors_total
        # PyTorch's worker server on the node-local debug socket: the Flight Recorder on demand (slurm.job_stacks)
        self.debug_server = serve_debug_socket(self.progress)
        log.info(
            "%s on %s (host name %s): rank %d of %d, slurm job %s", self.name, self.node, socket.gethostname(),
            self.rank, self.world_size, self.slurm_job_id or "-",
        )  # fmt: skip
        self.status("starting")

    def run(self) -> int:
        settings = self.settings
        self.start()
        log.info("strategy %s over gloo", settings.strategy)
        try:
            dist.init_process_group("gloo", timeout=timedelta(seconds=settings.collective_timeout))
            model = build_model(settings.strategy, settings.warn)
            optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            self.resume(model, optimizer)
            self.status("running")
            while not settings.max_steps or self.step < settings.max_steps:
                started = time.monotonic()
                self.apply_faults()
                loss = self.train_step(model, optimizer)
                self.step += 1
                self.progress.step(samples=settings.batch_size * self.world_size)
                self.progress.loss(loss)
                if math.isfinite(loss) and self.step % settings.log_every == 0:
                    log.info("step %d loss: %.4f", self.step, loss)
                if self.checkpoint_asked:
                    log.info("checkpoint requested: saving step %d", self.step)
                due = self.checkpoint_asked or self.step % settings.checkpoint_every == 0
                if due and math.isfinite(loss):
                    self.save(model, optimizer, loss)
                elif due:  # never a checkpoint of diverged weights
                    log.warning("step %d: loss is %s, checkpoint skipped", self.step, loss)
                self.status()
                time.sleep(max(0.0, settings.step_seconds - (time.monotonic() - started)))
            log.info("training finished at step %d", self.step)
            self.status("exited")
            dist.destroy_process_group()
            return 0
        except (Exception, CheckpointException):  # DCP's CheckpointException is a BaseException
            log.exception(
                "rank %d failed at step %d", self.rank, self.step
            )  # counted by the progress handler
            self.status("failed")
            raise
        finally:
            # Serves until a scrape has seen the last change, at most scrape_wait seconds.
            self.progress.close(settings.linger, settings.scrape_wait)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.torch_trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="training job name (label train_job)")
    parser.add_argument("--port", type=int, required=True, help="metrics port (local rank 0 serves)")
    parser.add_argument(
        "--node-hosts", default="", help="node=address,...: serve at the address of this node"
    )
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    defaults = Settings()
    parser.add_argument("--strategy", choices=STRATEGIES, default=defaults.strategy)
    parser.add_argument("--step-seconds", type=float, default=defaults.step_seconds)
    parser.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every, help="steps")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="per rank")
    parser.add_argument("--max-steps", type=int, default=defaults.max_steps, help="0: until stopped")
    parser.add_argument("--log-every", type=int, default=defaults.log_every, help="steps")
    parser.add_argument(
        "--linger", type=float, default=defaults.linger, help="seconds of serving after the end"
    )
    parser.add_argument(
        "--collective-timeout", type=float, default=defaults.collective_timeout,
        help="seconds before gloo gives up on a collective (init_process_group's timeout)",
    )  # fmt: skip
    parser.add_argument(
        "--warn", action="store_true", help="a healthy job that warns (PyTorch's own warnings)"
    )
    parser.add_argument(
        "--scrape-wait", type=float, default=defaults.scrape_wait,
        help="seconds a failed rank serves at most until a scrape has seen its last change",
    )  # fmt: skip
    return parser.parse_args(argv)


def node_name(env: Mapping[str, str]) -> str:
    """The node this rank runs on: ``SLURMD_NODENAME`` under Slurm, ``NODE_NAME`` on Kubernetes (the downward API's
    ``spec.nodeName``: a pod's host name is the pod's, or with host networking the machine's), else the host name."""
    return env.get("SLURMD_NODENAME") or env.get("NODE_NAME") or os.uname().nodename


def node_address(node_hosts: str, node: str) -> str:
    """The address of ``node`` in ``node1=a,node2=b`` (127.0.0.1 when it is not listed)."""
    pairs = dict(item.split("=", 1) for item in node_hosts.split(",") if "=" in item)
    return pairs.get(node, "127.0.0.1")


def configure_logging() -> None:
    """Log lines as ``<time> <level> [rank<N>]: <message>`` on stdout (the job's log)."""
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format=f"%(asctime)s %(levelname)s [rank{rank}]: %(message)s"
    )
    logging.captureWarnings(True)  # Python warnings become WARNING records, which the progress handler reads


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        args.strategy, args.step_seconds, args.checkpoint_every, args.batch_size, Settings.lr, args.max_steps,
        args.log_every, args.linger, args.collective_timeout, args.scrape_wait, args.warn,
    )  # fmt: skip


@record  # torchrun's error file: the summary names this rank's exception
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    return Worker.from_args(args, settings_from(args)).run()


if __name__ == "__main__":
    sys.exit(main())
