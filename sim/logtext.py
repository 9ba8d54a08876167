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
    rank: int = 0


def _glog_time(now: float) -> str:
    # glog prefix of PyTorch's C++ logging, e.g. E1218 20:27:21.426415540
    return time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e9):09d}"


def _traceback(frames: list[tuple[str, int, str, str]]) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines += [f'  File "{path}", line {line}, in {func}', f"    {code}"]
    return lines


def _glog(ctx: Context, now: float, line: int) -> str:
    """The prefix of a ProcessGroupNCCL log line of this rank."""
    return f"[rank{ctx.rank}]:[E{_glog_time(now)} ProcessGroupNCCL.cpp:{line}]"


def _work(ctx: Context) -> str:
    return (
        f"WorkNCCL(SeqNum={ctx.step}, OpType=ALLREDUCE, NumelIn=131072000, NumelOut=131072000, "
        "Timeout(ms)=600000)"
    )


def _timed_out(ctx: Context) -> str:
    return (
        f"[Rank {ctx.rank}] Watchdog caught collective operation timeout: {_work(ctx)} ran for 600081 "
        "milliseconds before timing out."
    )


def ib_address(node: str) -> str:
    """The InfiniBand address NCCL prints for ``node`` (10.42.0.<its number>), e.g. ``10.42.0.2`` for node2."""
    digits = "".join(ch for ch in node if ch.isdigit())
    return f"10.42.0.{int(digits) % 256 if digits else 1}"


def _taking_down(ctx: Context, now: float) -> list[str]:
    return [
        f"{_glog(ctx, now, 1632)} [Rank {ctx.rank}] Some NCCL operations have failed or timed out. Due to the "
        "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"{_glog(ctx, now, 1638)} [Rank {ctx.rank}] To avoid data inconsistency, we are taking the entire "
        "process down.",
    ]


def nccl(ctx: Context, now: float) -> str:
    """NCCL WARN on a failed IB completion, the c10d watchdog timeout, and the DistBackendError."""
    lines = [
        f"{ctx.hostname}:{ctx.pid}:{ctx.pid + 43} [{ctx.gpu}] transport/net_ib.cc:1295 NCCL WARN {IB_WARN}",
        f"{_glog(ctx, now, 629)} {_timed_out(ctx)}",
        *_taking_down(ctx, now),
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


def _watchdog(ctx: Context, exception: str) -> str:
    return f"[PG 0 Rank {ctx.rank}] Process group watchdog thread terminated with exception: {exception}"


def peer_lost(ctx: Context, now: float, peer: str) -> str:
    """A healthy rank whose peer on node ``peer`` died inside a collective: NCCL's IB error on the lost
    connection, then the watchdog's timeout, and the process taken down (c10::DistBackendError)."""
    watchdog = _watchdog(ctx, _timed_out(ctx))
    lines = [
        f"{ctx.hostname}:{ctx.pid}:{ctx.pid + 43} [{ctx.gpu}] transport/net_ib.cc:1295 NCCL WARN NET/IB : "
        f"Got completion from peer {ib_address(peer)}<47534> with error 12, opcode 0, len 0, vendor err 129",
        f"{_glog(ctx, now, 629)} {_timed_out(ctx)}",
        f"{_glog(ctx, now, 1785)} [PG 0 Rank {ctx.rank}] Exception (either an error or timeout) detected by "
        f"watchdog at work: {ctx.step}, last enqueued NCCL work: {ctx.step}, last completed NCCL work: "
        f"{ctx.step - 1}.",
        *_taking_down(ctx, now),
        f"{_glog(ctx, now, 1595)} {watchdog}",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  {watchdog}",
    ]
    return "\n".join(lines)


_CUDA_HINTS = [
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
    "be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]


def gpu_fault(ctx: Context, now: float, error: str, world_size: int) -> str:
    """The process whose GPU ``ctx.gpu`` failed under it (an Xid) gets CUDA ``error``. In a process group
    (``world_size`` > 1) NCCL reports the CUDA failure and ProcessGroupNCCL's watchdog takes the process down
    (c10::DistBackendError); a lone process raises the RuntimeError from its training step."""
    if world_size <= 1:
        frames = [("train.py", 212, "train_step", "loss.backward()")]
        return "\n".join([*_traceback(frames), f"RuntimeError: CUDA error: {error}", *_CUDA_HINTS])
    watchdog = _watchdog(ctx, f"CUDA error: {error}")
    lines = [
        f"{ctx.hostname}:{ctx.pid}:{ctx.pid + 43} [{ctx.gpu}] enqueue.cc:1556 NCCL WARN Cuda failure '{error}'",
        f"{_glog(ctx, now, 1595)} {watchdog}",
        *_CUDA_HINTS,
        "",
        "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 (most recent "
        "call first):",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  {watchdog}",
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
    """torchrun's summary block after this rank exits with ``exitcode``."""
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
            f"[{ctx.rank}]:",
            f"  time      : {time.strftime('%Y-%m-%d_%H:%M:%S', time.localtime(now))}",
            f"  host      : {ctx.hostname}",
            f"  rank      : {ctx.rank} (local_rank: 0)",
            f"  exitcode  : {exitcode} (pid: {ctx.pid})",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            rule,
        ]
    )
