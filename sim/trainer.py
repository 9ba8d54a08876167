"""A simulated training job: ``python -m sim.trainer --name llama-7b --port P --checkpoint-dir C --state-dir D``.

One process stands for one node's ranks of a job (``--rank``/``--world-size``, default ``$SLURM_PROCID`` and
``$SLURM_NTASKS``: ``srun`` starts one per node of a multi-node job). ``--node-ports node1=P1,node2=P2,...``
instead of ``--port`` serves metrics on the port of the node it runs on: one static scrape target per node.

It steps every ``--step-seconds`` (0.2 s), with a loss that decreases with noise; checkpoints every
``--checkpoint-every`` steps into ``C/step_000123/`` (:mod:`sim.checkpoints`); at start resumes from the newest
checkpoint (logging ``resuming from step N``; the ranks of a multi-node job each keep ``C/rank<N>/`` and resume
from the newest step all of them saved) after checking its sha256, and fails with PyTorch's
``PytorchStreamReader failed reading zip archive: failed finding central directory`` when it is corrupt. It
serves the training metrics of rules/README.md on ``/metrics`` with ``nightshift_progress`` (progress/, the
library real training scripts use) and writes its status to ``D/trainers/<name>[.rank<N>].json``.

Identity: ``--slurm-job-id`` (default ``$SLURM_JOB_ID``), ``--hostname`` (default ``$SLURMD_NODENAME``, then
the host name), ``--namespace``/``--pod`` (default ``$POD_NAMESPACE``/``$POD_NAME``).

A checkpoint request (SIGUSR1, the progress library's contract) is answered with a checkpoint at the end of the
step. Faults (:mod:`sim.faults`) are read on every step: hang (stops stepping, stays alive), slowdown (factor), nan
(loss becomes NaN), corrupt_checkpoint (the newest checkpoint is torn and the process dies as if killed
mid-save; at start-up, the resume then fails), and nccl/oom/io/s3_timeout (the job logs the real error text,
increments ``training_errors_total{error_class}``, keeps serving metrics until a scrape has seen the increment,
at most ``--linger`` seconds, and exits 1).

Collective failures (a job of world size > 1): when a peer rank of the same run failed or exited, a rank stops
stepping (stuck in the all-reduce) for ``--nccl-timeout`` seconds, then logs NCCL's error on the lost connection
and the watchdog timeout, counts ``error_class="nccl"`` and exits 1, as every rank of a real job does after one
rank dies. With ``--exit-on-gpu-fault``, a fatal Xid (:data:`sim.gpus.FATAL_XIDS`) on the rank's node ends it
with the CUDA error (``nccl``: reported by ProcessGroupNCCL's watchdog in a process group; ``cuda``: raised by the
training step of a lone process); without it the rank ignores GPU faults (the exporter still shows them).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import nightshift_progress

from sim import checkpoints, faults, gpus, logtext, statedir

# Crash fault → the error text the job logs before it exits.
CRASH_TEXT: dict[str, Callable[[logtext.Context, float], str]] = {
    "nccl": logtext.nccl,
    "oom": lambda ctx, now: logtext.cuda_oom(ctx),
    "io": lambda ctx, now: logtext.storage_io(ctx),
    "s3_timeout": lambda ctx, now: logtext.object_store_timeout(ctx),
}


@dataclass(frozen=True)
class Identity:
    """Who the job is; empty strings for what does not apply (Prometheus drops empty labels). ``rank`` and
    ``world_size`` place this process in the job; they are not labels (Hostname tells the ranks apart)."""

    name: str
    hostname: str
    slurm_job_id: str = ""
    namespace: str = ""
    pod: str = ""
    rank: int = 0
    world_size: int = 1

    def progress(self) -> nightshift_progress.Progress:
        """The job's metrics (nightshift_progress, the library a real training script uses)."""
        identity = nightshift_progress.Identity(
            self.name, self.slurm_job_id, self.namespace, self.pod, self.hostname, rank=self.rank
        )
        return nightshift_progress.Progress(identity)


@dataclass(frozen=True)
class Settings:
    step_seconds: float = 0.2
    checkpoint_every: int = 25
    batch_size: int = 256
    keep: int = 3
    linger: float = 3.0
    log_every: int = 25
    # NCCL's watchdog gives up after 10 minutes by default; the simulator's after half a second, so that every rank
    # has logged and counted its error before a remediation that acts within seconds stops the job.
    nccl_timeout: float = 0.5
    exit_on_gpu_fault: bool = False


class JobExit(Exception):
    """The job is ending with ``code`` after logging an error of ``error_class``."""

    def __init__(self, code: int, error_class: str):
        super().__init__(error_class)
        self.code = code
        self.error_class = error_class


class Trainer:
    """One training process. :meth:`run` returns the exit status."""

    def __init__(
        self,
        identity: Identity,
        settings: Settings,
        state_dir: Path,
        checkpoint_dir: Path,
        port: int,
        host: str = "127.0.0.1",
        out: TextIO = sys.stdout,
    ):
        self.identity = identity
        self.settings = settings
        self.state_dir = state_dir
        self.checkpoint_dir = checkpoint_dir
        self.port = port
        self.host = host
        self.out = out
        self.progress = identity.progress()
        self.rng = random.Random()
        self.step = 0
        self.samples = 0
        self.nan = False
        self.phase = "starting"
        self.started = time.time()
        self.prefix = f"[rank{identity.rank}]:"

    # -- bookkeeping ------------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        print(message, file=self.out, flush=True)

    def set_phase(self, phase: str) -> None:
        """Record the phase (running | hung | failed | exited) where the exporter and ``sim.cli status`` see it."""
        self.phase = phase
        status = {
            **asdict(self.identity),
            "pid": os.getpid(),
            "port": self.port,
            "checkpoint_dir": str(self.checkpoint_dir),
            "phase": phase,
            "step": self.step,
            "updated": time.time(),
        }
        ident = self.identity
        statedir.write_json(statedir.trainer_status_path(self.state_dir, ident.name, ident.rank), status)

    def _rank_dir(self, rank: int) -> Path:
        """Where ``rank`` keeps its checkpoints: ``C`` for a lone process, ``C/rank<N>`` in a multi-node job."""
        return self.checkpoint_dir / f"rank{rank}" if self.identity.world_size > 1 else self.checkpoint_dir

    def lost_peer(self) -> str | None:
        """The node of a peer rank of this run that failed or exited since this rank started, None if none."""
        ident = self.identity
        for rank in range(ident.world_size):
            if rank == ident.rank:
                continue
            peer = statedir.read_json(statedir.trainer_status_path(self.state_dir, ident.name, rank), {})
            ended = peer.get("phase") in ("failed", "exited") and peer.get("updated", 0) >= self.started
            if ended and peer.get("slurm_job_id") == ident.slurm_job_id:
                return str(peer.get("hostname", ""))
        return None

    def _context(self, gpu: int = 0) -> logtext.Context:
        ident = self.identity
        return logtext.Context(ident.hostname, os.getpid(), ident.name, self.step, gpu=gpu, rank=ident.rank)

    # -- training ---------------------------------------------------------------------------------------
    def resume(self) -> None:
        """Continue from the newest checkpoint every rank holds, or start at step 0; :class:`JobExit` if it is
        corrupt."""
        root = self._rank_dir(self.identity.rank)
        step = checkpoints.newest_common([self._rank_dir(r) for r in range(self.identity.world_size)])
        checkpoint = None if step is None else checkpoints.at(root, step)
        if checkpoint is None:
            self.log(f"{self.prefix} no checkpoint in {root}, starting from step 0")
            return
        try:
            checkpoints.validate(checkpoint)
        except checkpoints.CorruptCheckpoint as exc:
            self.log(logtext.checkpoint_corrupt(str(exc.path / exc.file)))
            raise JobExit(1, "checkpoint_corrupt") from None
        self.step, self.samples = checkpoint.step, checkpoint.samples
        self.progress.resumed(self.step, self.samples, checkpoint.created)
        self.log(f"{self.prefix} resuming from step {self.step} ({checkpoint.path})")

    def loss(self) -> float:
        if self.nan:
            return math.nan
        return 1.7 + 6.3 * math.exp(-self.step / 300) + self.rng.gauss(0, 0.02)

    def checkpoint(self, loss: float) -> None:
        root = self._rank_dir(self.identity.rank)
        with self.progress.checkpointing():
            checkpoint = checkpoints.write(root, self.step, loss, self.samples, time.time())
            checkpoints.prune(root, self.settings.keep)
        self.log(f"{self.prefix} saved checkpoint {checkpoint.path}")
        self.set_phase(self.phase)

    def corrupt_newest(self) -> None:
        """Tear the newest checkpoint (the corrupt_checkpoint fault)."""
        checkpoint = checkpoints.newest(self._rank_dir(self.identity.rank))
        if checkpoint is not None:
            checkpoints.corrupt(checkpoint)

    def collective_faults(self, state: faults.FaultState) -> None:
        """End this rank the way a real one ends when its GPU fails (``--exit-on-gpu-fault``) or a peer rank is
        gone (world size > 1); :class:`JobExit` then, else nothing."""
        ident = self.identity
        xid = state.fatal_xid(ident.hostname) if self.settings.exit_on_gpu_fault else None
        if xid is not None:
            error = gpus.cuda_error(xid.xid)
            self.log(logtext.gpu_fault(self._context(xid.gpu), time.time(), error, ident.world_size))
            raise JobExit(1, "nccl" if ident.world_size > 1 else "cuda")
        peer = self.lost_peer() if ident.world_size > 1 else None
        if peer is not None:
            time.sleep(self.settings.nccl_timeout)  # stuck in the all-reduce until NCCL's watchdog gives up
            self.log(logtext.peer_lost(self._context(), time.time(), peer))
            raise JobExit(1, "nccl")

    def apply_faults(self) -> float:
        """Act on pending faults; returns the slowdown factor. May raise :class:`JobExit` or never return."""
        name = self.identity.name
        state = faults.load(self.state_dir)
        self.collective_faults(state)
        pending = state.job(name)
        for kind, text in CRASH_TEXT.items():
            if kind in pending and faults.consume_job_fault(self.state_dir, name, kind):
                self.log(text(self._context(), time.time()))
                raise JobExit(1, faults.CRASH_FAULTS[kind])
        if "corrupt_checkpoint" in pending and faults.consume_job_fault(
            self.state_dir, name, "corrupt_checkpoint"
        ):
            self.log(f"{self.prefix} saving checkpoint step_{self.step:06d}")
            self.corrupt_newest()
            os.kill(os.getpid(), signal.SIGKILL)  # dies mid-save, as a node crash or the OOM killer would
        if "nan" in pending and faults.consume_job_fault(self.state_dir, name, "nan"):
            self.nan = True
        if "hang" in pending and faults.consume_job_fault(self.state_dir, name, "hang"):
            self.set_phase("hung")  # silent, as real hangs are: no log line, the process stays alive
            while True:
                time.sleep(1)
        return max(float(pending.get("slowdown", 1.0)), 1.0)

    def train_step(self, slowdown: float) -> None:
        start = time.monotonic()
        with self.progress.timing():  # the rank's own work: a slowed rank is the job's straggler
            time.sleep(self.settings.step_seconds * slowdown)
        self.step += 1
        self.samples += self.settings.batch_size
        loss = self.loss()
        self.progress.step(samples=self.settings.batch_size)
        self.progress.loss(loss)
        if self.nan or self.step % self.settings.log_every == 0:
            rate = self.settings.batch_size / (time.monotonic() - start)
            self.log(f"{self.prefix} step {self.step} loss: {loss:.4f} samples/s: {rate:.1f}")
        if self.progress.checkpoint_requested():  # Nightshift asks (SIGUSR1: a planned swap, a straggler)
            self.log(f"{self.prefix} checkpoint requested: saving step {self.step}")
            self.checkpoint(loss)
        elif self.step % self.settings.checkpoint_every == 0:
            self.checkpoint(loss)

    def run(self) -> int:
        """Train until a fault ends the job or a signal stops it; clean up the job mapping and status."""
        self.progress.serve(self.port, self.host)
        self.progress.checkpoint_request.install_signal(signal.SIGUSR1)
        ident = self.identity
        self.log(
            f"{self.prefix} {ident.name} on {ident.hostname}, rank {ident.rank} of {ident.world_size}, slurm job "
            f"{ident.slurm_job_id or '-'}, :{self.port}"
        )
        try:
            self.set_phase("starting")
            self._rank_dir(ident.rank).mkdir(parents=True, exist_ok=True)
            if faults.consume_job_fault(self.state_dir, ident.name, "corrupt_checkpoint"):
                self.corrupt_newest()
            self.resume()
            self.set_phase("running")
            while True:
                self.train_step(self.apply_faults())
        except JobExit as exit_:
            self.progress.error(exit_.error_class)
            self.set_phase("failed")
            self.log(logtext.child_failed(self._context(), exit_.code, time.time()))
            return exit_.code
        finally:
            # Serves --linger s after the last change (the error counted above); the simulated job starts its
            # endpoint long before it fails, so it does not wait for a scrape (scrape_wait 0).
            self.progress.close(self.settings.linger, scrape_wait=0)
            self.set_phase("exited")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(prog="python -m sim.trainer", description="A simulated training job.")
    parser.add_argument("--name", required=True, help="training job name (label train_job)")
    ports = parser.add_mutually_exclusive_group(required=True)
    ports.add_argument("--port", type=int, help="metrics port")
    ports.add_argument(
        "--node-ports", type=_node_ports, help="node=port,...: serve on the port of the node it runs on"
    )
    parser.add_argument(
        "--node-hosts",
        type=_node_map,
        help="node=address,...: serve on the address of the node it runs on (its Slurm NodeAddr)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--slurm-job-id", default=env.get("SLURM_JOB_ID", ""))
    parser.add_argument("--hostname", default=env.get("SLURMD_NODENAME") or socket.gethostname())
    parser.add_argument("--namespace", default=env.get("POD_NAMESPACE", ""))
    parser.add_argument("--pod", default=env.get("POD_NAME", ""))
    parser.add_argument("--rank", type=int, default=int(env.get("SLURM_PROCID") or 0))
    parser.add_argument("--world-size", type=int, default=int(env.get("SLURM_NTASKS") or 1))
    defaults = Settings()
    parser.add_argument("--step-seconds", type=float, default=defaults.step_seconds)
    parser.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every, help="steps")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--keep", type=int, default=defaults.keep, help="checkpoints kept")
    parser.add_argument(
        "--linger",
        type=float,
        default=defaults.linger,
        help="at most this many seconds of serving after an error",
    )
    parser.add_argument("--log-every", type=int, default=defaults.log_every, help="steps")
    parser.add_argument(
        "--nccl-timeout",
        type=float,
        default=defaults.nccl_timeout,
        help="seconds before a lost peer ends a rank",
    )
    parser.add_argument(
        "--exit-on-gpu-fault", action="store_true", help="a fatal Xid on this node ends the rank (CUDA error)"
    )
    args = parser.parse_args(argv)
    if not 0 <= args.rank < args.world_size:
        parser.error(f"--rank {args.rank} is outside --world-size {args.world_size}")
    if args.node_ports is not None:
        if args.hostname not in args.node_ports:
            parser.error(f"--node-ports has no port for {args.hostname}")
        args.port = args.node_ports[args.hostname]
    if args.node_hosts is not None:
        if args.hostname not in args.node_hosts:
            parser.error(f"--node-hosts has no address for {args.hostname}")
        args.host = args.node_hosts[args.hostname]
    return args


def _node_ports(text: str) -> dict[str, int]:
    """``node1=9101,node2=9102`` → {"node1": 9101, "node2": 9102}."""
    try:
        return {node: int(port) for node, port in _node_map(text).items()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected node=port,... , got {text!r}") from None


def _node_map(text: str) -> dict[str, str]:
    """``node1=a,node2=b`` → {"node1": "a", "node2": "b"}."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected node=value,... , got {text!r}")
    return dict(pairs)  # every pair has two items (checked above)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    identity = Identity(
        args.name, args.hostname, args.slurm_job_id, args.namespace, args.pod, args.rank, args.world_size
    )
    settings = Settings(
        args.step_seconds,
        args.checkpoint_every,
        args.batch_size,
        args.keep,
        args.linger,
        args.log_every,
        args.nccl_timeout,
        args.exit_on_gpu_fault,
    )
    trainer = Trainer(identity, settings, args.state_dir, args.checkpoint_dir, args.port, args.host)

    def stop(signum: int, _frame: object) -> None:
        trainer.log(f"{trainer.prefix} received signal {signum}, exiting")
        raise SystemExit(128 + signum)  # unwinds run(), which cleans up

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return trainer.run()


if __name__ == "__main__":
    sys.exit(main())
