"""The training job behind the real diagnosis corpus: a small model under DDP or FSDP2 on gloo (CPU), one fault.

Launched by ``produce.py`` under ``torchrun``; nothing here is imported by Nightshift. Environment:

- ``WORKER_PARALLEL``: ``ddp`` (default) or ``fsdp`` (``torch.distributed.fsdp.fully_shard`` on a CPU mesh);
- ``WORKER_STEPS``: steps to train (default 12); ``WORKER_TIMEOUT``: the process group's timeout in seconds;
- ``WORKER_FAULT``: what goes wrong (none by default), at step ``WORKER_FAULT_STEP`` on rank ``WORKER_FAULT_RANK``:
  ``sigkill``, ``sigstop``, ``sigabrt``, ``sigsegv``, ``exception``, ``nan`` (every rank), ``stuck`` (a busy
  Python loop: the rank never reaches the next collective), ``first_attempt`` (an exception on the first
  torchrun attempt only), ``startup_first_attempt`` (rank 1 fails before joining the process group, on the first
  attempt only), ``warnings`` (a healthy run that warns);
- ``WORKER_CKPT``: a checkpoint path: ``*.pt`` is written with ``torch.save`` by rank 0, a directory with
  ``torch.distributed.checkpoint`` (DCP) by every rank, every ``WORKER_CKPT_EVERY`` steps; ``WORKER_RESUME=1``
  loads it before training;
- ``WORKER_FR_DUMP``: a file prefix: on SIGUSR1 each rank writes its Flight Recorder dump
  (``torch._C._distributed_c10d._dump_fr_trace_json``, recording on with ``TORCH_FR_BUFFER_SIZE``) to
  ``PREFIX<rank>``, from a thread that waits for the signal, so a rank blocked in a collective dumps too.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.elastic.multiprocessing.errors import record

log = logging.getLogger("train")


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
        self.head = torch.nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def wrap(model: Net, world: int) -> torch.nn.Module:
    if env("WORKER_PARALLEL", "ddp") == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model.body:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return torch.nn.parallel.DistributedDataParallel(model)


def save(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int, rank: int) -> None:
    path = Path(env("WORKER_CKPT"))
    if path.suffix == ".pt":
        if rank == 0:
            torch.save({"step": step, "model": model.state_dict(), "optim": optim.state_dict()}, path)
    else:
        dcp.save({"model": model.state_dict(), "step": torch.tensor(step)}, checkpoint_id=str(path))
    log.info("saved checkpoint at step %d to %s", step, path)


def resume(model: torch.nn.Module, optim: torch.optim.Optimizer) -> int:
    path = Path(env("WORKER_CKPT"))
    log.info("resuming from checkpoint %s", path)
    if path.suffix == ".pt":
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        return int(state["step"])
    state = {"model": model.state_dict(), "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    model.load_state_dict(state["model"])
    return int(state["step"])


def inject(fault: str, rank: int, step: int) -> torch.Tensor | None:
    """Do this rank's fault, if it is due; a multiplier for the loss for ``nan``."""
    due = step == int(env("WORKER_FAULT_STEP", "5"))
    mine = rank == int(env("WORKER_FAULT_RANK", "1"))
    if fault == "nan" and step >= int(env("WORKER_FAULT_STEP", "5")):
        return torch.tensor(float("nan"))
    if not (due and mine):
        return None
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault == "sigabrt":
        os.abort()
    elif fault == "sigsegv":
        ctypes.string_at(0)
    elif fault == "exception" or (fault == "first_attempt" and env("TORCHELASTIC_RESTART_COUNT", "0") == "0"):
        batch = {"input_ids": torch.zeros(4)}
        batch["labels"].sum()  # KeyError: 'labels', as a data pipeline bug raises
    elif fault == "stuck":
        deadline = time.monotonic() + float(env("WORKER_STUCK_SECONDS", "600"))
        # a rank spinning in Python code: it never reaches the next collective
        while time.monotonic() < deadline:
            sum(range(10_000))
    return None


def fr_dumper(rank: int) -> None:
    """Dump the Flight Recorder on SIGUSR1 from a thread of its own (blocked in every other thread)."""
    prefix = env("WORKER_FR_DUMP")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    def wait() -> None:
        while True:
            signal.sigwait({signal.SIGUSR1})
            from torch._C._distributed_c10d import _dump_fr_trace_json

            Path(f"{prefix}{rank}").write_bytes(_dump_fr_trace_json())

    threading.Thread(target=wait, daemon=True).start()


@record
def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [rank%(rank)s] %(message)s")
    rank, world = int(env("RANK")), int(env("WORLD_SIZE"))
    old_factory = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record_ = old_factory(*args, **kwargs)
        record_.rank = rank
        return record_

    logging.setLogRecordFactory(factory)
    fault = env("WORKER_FAULT", "none")
    if fault == "startup_first_attempt" and env("TORCHELASTIC_RESTART_COUNT", "0") == "0" and rank == 1:
        raise FileNotFoundError("[Errno 2] No such file or directory: '/data/shards/index.json'")
    if env("WORKER_FR_DUMP"):
        fr_dumper(rank)
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(env("WORKER_TIMEOUT", "30"))))
    log.info("process group up: world_size=%d backend=gloo host=%s", world, os.uname().nodename)
    torch.manual_seed(0)
    model = wrap(Net(), world)
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    start = resume(model, optim) if env("WORKER_RESUME") == "1" else 0
    every = int(env("WORKER_CKPT_EVERY", "0"))
    generator = torch.Generator().manual_seed(rank)
    if fault == "warnings":
        warnings.warn("torch.cuda.amp.GradScaler is not enabled: running on CPU", UserWarning, stacklevel=1)
        warnings.warn(
            "`resume_download` is deprecated and will be removed in version 1.0.0",
            FutureWarning,
            stacklevel=1,
        )
    for step in range(start + 1, start + int(env("WORKER_STEPS", "12")) + 1):
        x = torch.randn(32, 256, generator=generator)
        loss = (model(x) - x.sum(dim=1, keepdim=True) * 0.01).pow(2).mean()
        if (factor := inject(fault, rank, step)) is not None:
            loss = loss * factor
        optim.zero_grad()
        loss.backward()
        optim.step()
        log.info("step %d loss %.4f", step, loss.item())
        if fault == "nan" and not torch.isfinite(loss) and step >= int(env("WORKER_FAULT_STEP", "5")) + 2:
            raise FloatingPointError(f"loss is {loss.item()} at step {step}: stopping the run")
        if every and step % every == 0:
            save(model, optim, step, rank)
        time.sleep(float(env("WORKER_STEP_SECONDS", "0.2")))
    dist.barrier()
    log.info("training complete after %d steps", step)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
