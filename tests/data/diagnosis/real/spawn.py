"""A DDP job launched by ``torch.multiprocessing.spawn`` (mp.spawn, the launcher inside the training script) instead
of torchrun: two processes on gloo, one fault in process 1 at step 3. Makes the ``mp_spawn_*.log`` cases.

    .venv/bin/python tests/data/diagnosis/real/spawn.py FAULT PORT > mp_spawn_FAULT.log 2>&1

FAULT: ``exception`` (KeyError), ``sigkill`` (as the OOM killer ends it), ``sigstop`` (a silent hang: process 0
times out after 15 s and mp.spawn raises; the stopped process stays behind: kill it).
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(index: int, world: int, fault: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=index, world_size=world, timeout=timedelta(seconds=15))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"rank {index} step {step} loss {loss.item():.4f}", flush=True)
        if index == 1 and step == 3:
            if fault == "exception":
                raise KeyError("labels")
            if fault in ("sigkill", "sigstop"):
                os.kill(os.getpid(), signal.SIGKILL if fault == "sigkill" else signal.SIGSTOP)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1], sys.argv[2]), nprocs=2, join=True)
