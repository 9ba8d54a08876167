"""The log text a real training job prints when it fails, per fault (strings from NCCL, PyTorch, botocore).

Pure functions of a :class:`Context`; the trainer prints the result. The texts follow the exact formats of
NCCL's WARN lines, PyTorch's ProcessGroupNCCL watchdog and DistBackendError, torch.OutOfMemoryError,
OSError, botocore's ReadTimeoutError, PytorchStreamReader and torchrun's ChildFailedError summary, so the
diagnosis signatures can be exercised on realistic logs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

IB_WARN = (
    "NET/IB : Got completion from peer 10.42.0.2<47534> with error 5, opcode 48, len 32764, vendor err 244"
)


@dataclass(frozen=True)
class Context:
    hostname: str
    pid: int
    job: str
    step: int
    gpu: int = 0


def _glog_time(now: float) -> str:
    # glog prefix of PyTorch's C++ logging, e.g. E1218 20:27:21.426415540
    return time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e9):09d}"


def _traceback(frames: list[tuple[str, int, str, str]]) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines += [f'  File "{path}", line {line}, in {func}', f"    {code}"]
    return lines


def nccl(ctx: Context, now: float) -> str:
    """NCCL WARN on a failed IB completion, the c10d watchdog timeout, and the DistBackendError."""
    glog = f"[rank0]:[E{_glog_time(now)} ProcessGroupNCCL.cpp"
    lines = [
        f"{ctx.hostname}:{ctx.pid}:{ctx.pid + 43} [{ctx.gpu}] transport/net_ib.cc:1295 NCCL WARN {IB_WARN}",
        f"{glog}:629] [Rank 0] Watchdog caught collective operation timeout: "
        f"WorkNCCL(SeqNum={ctx.step}, OpType=ALLREDUCE, NumelIn=131072000, NumelOut=131072000, "
        "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
        f"{glog}:1632] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
        "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"{glog}:1638] To avoid data inconsistency, we are taking the entire process down.",
        *_traceback([("train.py", 188, "train_step", "dist.all_reduce(grad_norm)")]),
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, remote process exited or there was a network "
        "error, NCCL version 2.19.3",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.",
        "Last error:",
        IB_WARN,
    ]
    return "\n".join(lines)


def cuda_oom(ctx: Context) -> str:
    message = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.75 GiB. "
        f"GPU {ctx.gpu} has a total capacity of 79.10 GiB of which 2.61 GiB is free. "
        f"Process {ctx.pid} has 76.48 GiB memory in use. Of the allocated memory 75.43 GiB is allocated "
        "by PyTorch, and 47.16 MiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    return "\n".join([*_traceback([("train.py", 212, "train_step", "loss.backward()")]), message])


def storage_io(ctx: Context) -> str:
    shard = f"/datasets/{ctx.job}/shard_{ctx.step % 1000:05d}.bin"
    frames = [
        ("train.py", 97, "next_batch", "batch = next(loader)"),
        ("data.py", 41, "read_shard", "return f.read(self.shard_bytes)"),
    ]
    return "\n".join([*_traceback(frames), f"OSError: [Errno 5] Input/output error: '{shard}'"])


def object_store_timeout(ctx: Context) -> str:
    url = f"https://s3.us-east-1.amazonaws.com/training-data/{ctx.job}/shard-{ctx.step % 1000:05d}.tar"
    frames = [("data.py", 63, "fetch", "body = s3.get_object(Bucket=bucket, Key=key)")]
    return "\n".join(
        [*_traceback(frames), f'botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: "{url}"']
    )


def checkpoint_corrupt(path: str) -> str:
    """torch.load of a truncated checkpoint at ``path``."""
    frames = [
        ("train.py", 61, "resume", "state = torch.load(path, map_location='cpu')"),
        ("torch/serialization.py", 1025, "load", "with _open_zipfile_reader(opened_file) as zf:"),
    ]
    return "\n".join(
        [
            f"[rank0]: loading checkpoint {path}",
            *_traceback(frames),
            "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
        ]
    )


def child_failed(ctx: Context, exitcode: int, now: float) -> str:
    """torchrun's summary block after rank 0 exits with ``exitcode``."""
    rule, thin = "=" * 60, "-" * 60
    return "\n".join(
        [
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            rule,
            "train.py FAILED",
            thin,
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            thin,
            "Root Cause (first observed failure):",
            "[0]:",
            f"  time      : {time.strftime('%Y-%m-%d_%H:%M:%S', time.localtime(now))}",
            f"  host      : {ctx.hostname}",
            "  rank      : 0 (local_rank: 0)",
            f"  exitcode  : {exitcode} (pid: {ctx.pid})",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            rule,
        ]
    )
