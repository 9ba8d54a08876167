"""Fault injection for the simulator: the faults.json model, its queries, and inject/clear operations.

GPU faults (read by :mod:`sim.dcgm_exporter` on every scrape; they last until cleared, as hardware faults do;
``clear`` plays the GPU reset / node reboot, which also resets DCGM's volatile counters and the sticky Xid):

- ``xid``: an Xid event on one GPU (also appended to ``D/nodes/<node>/kern.log`` as the driver would log it)
- ``ecc``: one more double-bit (uncorrectable) volatile ECC error
- ``ecc_sbe``: single-bit (correctable) volatile ECC errors at ``rate`` per second: an early warning
- ``row_remap``: row remapping failed (flag) and one more uncorrectable remapped row
- ``nvlink``: NVLink CRC and replay errors at ``rate`` per second
- ``thermal``: hardware thermal slowdown (clock event reasons HW_SLOWDOWN | HW_THERMAL, 91 C)
- ``vanish``: the GPU disappears from the exporter (fell off the bus, DCGM no longer sees it)

A fatal Xid (:data:`sim.gpus.FATAL_XIDS`, e.g. 79) also ends the ranks of a multi-node job that runs on the node
(:mod:`sim.trainer`, ``--exit-on-gpu-fault``), and fails ``dcgmi diag`` on the node (:mod:`sim.dcgmi`).

Validation verdicts (read by :mod:`sim.dcgmi`): ``inject_validation(node, "fail" | "pass" | "hang")`` overrides
what ``dcgmi diag`` concludes from the node's faults (``hang``: it never returns, for timeouts); cleared with the
node's faults.

Job faults (read by :mod:`sim.trainer` on every step). ``slowdown`` lasts until cleared (a degraded node
or file system); every other job fault is *consumed* by the trainer process that acts on it, so a restarted
job runs clean, as it does after a real transient fault: ``hang``, ``nan``, ``corrupt_checkpoint`` and the
crash faults of :data:`CRASH_FAULTS`.

Real faults in the real ``torch.distributed`` jobs (:mod:`sim.torch_trainer`), found through the status file each
worker writes: :func:`signal_rank` (SIGKILL as the OOM killer or a lost node ends a rank), :func:`stop_rank`
(SIGSTOP for a rank that stops answering, while training or inside a checkpoint save), :func:`inject_rank_fault`
(acted on inside the rank at its next step, once: a Python exception, NaN inputs, allocation until the memory cap),
:func:`limit_rank` (a memory cap or CPU quota on the worker's cgroup, :mod:`sim.cgroups`), :func:`lose_node` (a
node gone: its worker and its launcher killed at once; on the first node, the rendezvous host),
:func:`truncate_checkpoint` (a DCP shard or a ``torch.save`` file cut short) and the checkpoint file system filling
up: :func:`small_filesystem` mounts a small tmpfs as a job's checkpoint directory, :func:`fill_filesystem` writes
another tenant's ballast into it until a save no longer fits (the save fails with ENOSPC),
:func:`release_filesystem` unmounts it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sim import cgroups, gpus, statedir

GPU_FAULTS = ("ecc", "ecc_sbe", "row_remap", "nvlink", "thermal", "vanish")
# Crash faults and the training_errors_total error_class each one increments.
CRASH_FAULTS = {"nccl": "nccl", "oom": "cuda_oom", "io": "storage_io", "s3_timeout": "object_store_timeout"}
JOB_FAULTS = ("hang", "slowdown", "nan", "corrupt_checkpoint", *CRASH_FAULTS)
DEFAULT_NVLINK_RATE = 50.0  # errors/s: far above the alert threshold (1/s)
DEFAULT_SBE_RATE = 2.0  # correctable errors/s: over the fast rule's 5 in 30 s (rules/sim/gpu.yml)
VALIDATION_VERDICTS = ("fail", "pass", "hang")


@dataclass(frozen=True)
class XidEvent:
    node: str
    gpu: int
    xid: int
    at: float  # Unix time


@dataclass(frozen=True)
class GpuFaults:
    """The active hardware faults of one GPU (all off by default)."""

    ecc_dbe: int = 0
    ecc_sbe_rate: float = 0.0
    ecc_sbe_since: float = 0.0
    row_remap_failure: bool = False
    nvlink_rate: float = 0.0
    nvlink_since: float = 0.0
    thermal: bool = False
    vanished: bool = False


class FaultState:
    """One read of faults.json, with the queries the exporter and the trainer need."""

    def __init__(self, data: dict[str, Any]):
        self.data = data

    def xid_events(self, node: str, gpu: int) -> list[XidEvent]:
        """Xid events of one GPU, oldest first."""
        events = [XidEvent(**e) for e in self.data.get("xids", []) if e["node"] == node and e["gpu"] == gpu]
        return sorted(events, key=lambda e: e.at)

    def fatal_xid(self, node: str) -> XidEvent | None:
        """The newest Xid of :data:`sim.gpus.FATAL_XIDS` on any GPU of ``node``, None when there is none."""
        events = [
            XidEvent(**e)
            for e in self.data.get("xids", [])
            if e["node"] == node and e["xid"] in gpus.FATAL_XIDS
        ]
        return max(events, key=lambda e: e.at, default=None)

    def validation(self, node: str) -> str | None:
        """The injected validation verdict of ``node`` (one of :data:`VALIDATION_VERDICTS`), None when none."""
        return self.data.get("validation", {}).get(node)

    def gpu(self, node: str, gpu: int) -> GpuFaults:
        return GpuFaults(**self.data.get("gpus", {}).get(_gpu_key(node, gpu), {}))

    def job(self, name: str) -> dict[str, Any]:
        """The job's pending faults, kind → value (True, or the slowdown factor)."""
        return dict(self.data.get("jobs", {}).get(name, {}))

    def rank_faults(self, name: str, rank: int) -> dict[str, dict[str, Any]]:
        """The pending faults of one rank of a real torch job (:func:`inject_rank_fault`), kind → options."""
        return dict(self.data.get("ranks", {}).get(name, {}).get(str(rank), {}))


def load(state_dir: Path) -> FaultState:
    return FaultState(statedir.read_json(statedir.faults_path(state_dir), {}))


def _gpu_key(node: str, gpu: int) -> str:
    return f"{node}/{gpu}"


def _update(state_dir: Path, change) -> None:
    """Apply ``change(data)`` to faults.json under the state directory's lock."""
    with statedir.locked(state_dir):
        path = statedir.faults_path(state_dir)
        data = statedir.read_json(path, {})
        change(data)
        statedir.write_json(path, data)


def inject_xid(state_dir: Path, node: str, gpu: int, xid: int, now: float | None = None) -> XidEvent:
    """Record an Xid on ``node``/``gpu`` and log it to the node's kern.log the way the driver does."""
    event = XidEvent(node=node, gpu=gpu, xid=xid, at=time.time() if now is None else now)
    _update(state_dir, lambda data: data.setdefault("xids", []).append(asdict(event)))
    trainers = statedir.read_trainers(
        state_dir
    )  # the live process on the node owns the GPU, not an exited one
    pid = next(
        (
            t["pid"]
            for t in trainers
            if t.get("hostname") == node and t.get("pid") and statedir.pid_alive(int(t["pid"]))
        ),
        None,
    )
    owner = f"pid={pid}, name=python" if pid else "pid='<unknown>', name=<unknown>"
    line = (
        f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:{gpus.kernel_pci(gpu)}): {xid}, {owner}, "
        f"{gpus.xid_text(xid)}.\n"
    )
    log = statedir.kern_log_path(state_dir, node)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(line)
    return event


def inject_gpu_fault(
    state_dir: Path, node: str, gpu: int, kind: str, rate: float | None = None, now: float | None = None
) -> None:
    """Switch on GPU fault ``kind`` (one of :data:`GPU_FAULTS`) on ``node``/``gpu``."""
    if kind not in GPU_FAULTS:
        raise ValueError(f"unknown GPU fault {kind!r}; expected one of {', '.join(GPU_FAULTS)}")

    def change(data: dict[str, Any]) -> None:
        faults = data.setdefault("gpus", {}).setdefault(_gpu_key(node, gpu), {})
        if kind == "ecc":
            faults["ecc_dbe"] = faults.get("ecc_dbe", 0) + 1
        elif kind == "ecc_sbe":
            faults["ecc_sbe_rate"] = DEFAULT_SBE_RATE if rate is None else rate
            faults["ecc_sbe_since"] = time.time() if now is None else now
        elif kind == "row_remap":
            faults["row_remap_failure"] = True
        elif kind == "nvlink":
            faults["nvlink_rate"] = DEFAULT_NVLINK_RATE if rate is None else rate
            faults["nvlink_since"] = time.time() if now is None else now
        elif kind == "thermal":
            faults["thermal"] = True
        else:
            faults["vanished"] = True

    _update(state_dir, change)


def inject_validation(state_dir: Path, node: str, verdict: str) -> None:
    """Make ``dcgmi diag`` on ``node`` end with ``verdict`` (one of :data:`VALIDATION_VERDICTS`) whatever the
    node's faults, until the node's faults are cleared."""
    if verdict not in VALIDATION_VERDICTS:
        raise ValueError(
            f"unknown validation verdict {verdict!r}; expected one of {', '.join(VALIDATION_VERDICTS)}"
        )
    _update(state_dir, lambda data: data.setdefault("validation", {}).__setitem__(node, verdict))


def inject_job_fault(state_dir: Path, job: str, kind: str, factor: float | None = None) -> None:
    """Queue job fault ``kind`` (one of :data:`JOB_FAULTS`) for job ``job``; ``factor`` is for slowdown."""
    if kind not in JOB_FAULTS:
        raise ValueError(f"unknown job fault {kind!r}; expected one of {', '.join(JOB_FAULTS)}")
    if kind == "slowdown" and (factor is None or factor < 1):
        raise ValueError("slowdown needs a factor >= 1")
    value = factor if kind == "slowdown" else True
    _update(state_dir, lambda data: data.setdefault("jobs", {}).setdefault(job, {}).__setitem__(kind, value))


def consume_job_fault(state_dir: Path, job: str, kind: str) -> bool:
    """Remove fault ``kind`` of ``job``; True if it was pending (so exactly one process acts on it)."""
    found = False

    def change(data: dict[str, Any]) -> None:
        nonlocal found
        faults = data.get("jobs", {}).get(job, {})
        found = faults.pop(kind, None) is not None
        if not faults:
            data.get("jobs", {}).pop(job, None)

    _update(state_dir, change)
    return found


# Faults of one rank of a real torch.distributed job (sim.torch_trainer), acted on inside the rank's process.
RANK_FAULTS = ("exception", "nan", "oom")


def inject_rank_fault(state_dir: Path, job: str, rank: int, kind: str, **options: Any) -> None:
    """Queue fault ``kind`` (one of :data:`RANK_FAULTS`) for ``rank`` of the torch job ``job``; ``options``:
    ``count`` (nan: for this many steps, default every step from now)."""
    if kind not in RANK_FAULTS:
        raise ValueError(f"unknown rank fault {kind!r}; expected one of {', '.join(RANK_FAULTS)}")
    _update(
        state_dir,
        lambda data: (
            data.setdefault("ranks", {})
            .setdefault(job, {})
            .setdefault(str(rank), {})
            .__setitem__(kind, dict(options))
        ),
    )


def consume_rank_fault(state_dir: Path, job: str, rank: int, kind: str) -> bool:
    """Remove fault ``kind`` of ``rank`` of ``job``; True if it was pending (the rank acts on it once)."""
    found = False

    def change(data: dict[str, Any]) -> None:
        nonlocal found
        ranks = data.get("ranks", {}).get(job, {})
        found = ranks.get(str(rank), {}).pop(kind, None) is not None
        if not ranks.get(str(rank), True):
            ranks.pop(str(rank))

    _update(state_dir, change)
    return found


def rank_process(state_dir: Path, job: str, node: str | None = None, rank: int | None = None) -> int:
    """The pid of the live worker of torch job ``job`` on ``node`` (or of global ``rank``), from the status files
    the workers write; LookupError when none runs."""
    for status in statedir.read_trainers(state_dir):
        if status.get("name") != job or status.get("trainer") != "torch":
            continue
        if (node is None or status.get("hostname") == node) and (rank is None or status.get("rank") == rank):
            pid = int(status.get("pid", 0))
            if pid and statedir.pid_alive(pid) and status.get("phase") in ("starting", "running"):
                return pid
    raise LookupError(f"no live worker of {job} on {node or 'any node'} (rank {rank})")


def signal_rank(
    state_dir: Path, job: str, signum: int, node: str | None = None, rank: int | None = None
) -> int:
    """Send ``signum`` to the worker of ``job`` on ``node`` (or of ``rank``): SIGKILL as the OOM killer or a lost
    node ends it (:func:`stop_rank` stops one, in or out of a checkpoint save). The pid signalled."""
    pid = rank_process(state_dir, job, node, rank)
    os.kill(pid, signum)
    return pid


def stop_rank(state_dir: Path, job: str, node: str, saving: bool, timeout: float = 60.0) -> int:
    """SIGSTOP the worker of ``job`` on ``node`` inside a checkpoint save (``saving``) or outside one: a rank that
    hangs while training, or inside DCP's collective save, which leaves the others in the save. The worker's status
    (``saving``, written as a save begins and ends) is read once the process is stopped; a stop that landed in the
    other case is undone (SIGCONT) and tried again, for up to ``timeout`` seconds. The pid stopped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = rank_process(state_dir, job, node)
        if _saving(state_dir, pid) == saving:
            os.kill(pid, signal.SIGSTOP)
            if _stopped(pid, deadline) and _saving(state_dir, pid) == saving:
                return pid
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise TimeoutError(
        f"no stop of {job}'s worker on {node} {'inside' if saving else 'outside'} a save in {timeout}s"
    )


def _saving(state_dir: Path, pid: int) -> bool | None:
    """Whether the torch worker ``pid`` is inside a checkpoint save, per its status (None: no status of it)."""
    for status in statedir.read_trainers(state_dir):
        if status.get("pid") == pid:
            return bool(status.get("saving"))
    return None


def _stopped(pid: int, deadline: float) -> bool:
    """Wait (until ``deadline``) for ``pid`` to be in the stopped state ("T"), so that its status is final."""
    while time.monotonic() < deadline:
        fields = _proc_stat(pid)
        if not fields:
            return False
        if fields[0] in ("T", "t"):
            return True
        time.sleep(0.005)
    return False


def lose_node(state_dir: Path, job: str, node: str) -> list[int]:
    """End every process of torch job ``job`` on ``node`` at once, as a node that loses power or its network ends
    them: the worker and its launcher (torchrun's agent, the worker's parent), SIGKILL. On the job's first node the
    agent hosts the c10d rendezvous store, so the other nodes lose it too. The pids killed."""
    worker = rank_process(state_dir, job, node)
    agent = _parent(worker)
    killed = []
    for pid in (worker, agent):
        if pid > 1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def _parent(pid: int) -> int:
    """The parent pid of ``pid`` (0 when it is gone)."""
    fields = _proc_stat(pid)
    return int(fields[1]) if fields else 0


def _proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command's name (state, ppid, ...); empty when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[1].split()


def limit_rank(
    state_dir: Path, job: str, node: str, memory_bytes: int | None = None, cpu_fraction: float | None = None
) -> list[Path]:
    """Cap the worker of ``job`` on ``node`` as a node's kernel would (:mod:`sim.cgroups`): ``memory_bytes`` more
    than it uses now (then an ``oom`` rank fault makes the OOM killer end it), or ``cpu_fraction`` of one CPU (a
    slow rank). The groups made, for :func:`sim.cgroups.remove` once the worker is gone."""
    pid = rank_process(state_dir, job, node)
    groups = []
    if memory_bytes is not None:
        groups.append(cgroups.limit_memory(pid, f"{job}-{node}-memory", _rss(pid) + memory_bytes))
    if cpu_fraction is not None:
        groups.append(cgroups.limit_cpu(pid, f"{job}-{node}-cpu", cpu_fraction))
    return groups


def _rss(pid: int) -> int:
    """Resident bytes of ``pid`` (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def truncate_checkpoint(checkpoint: Path) -> Path:
    """Cut a checkpoint short, as a save interrupted by a full or failing file system leaves it: the largest shard
    (``*.distcp``) of a DCP checkpoint directory, the largest ``*.pt`` file of a directory (a Hugging Face
    ``checkpoint-N``: ``optimizer.pt``), or ``checkpoint`` itself when it is a file (a ``torch.save`` ``.pt``, a
    Lightning ``.ckpt``), to half its size; the file's path."""
    if checkpoint.is_file():
        found = [checkpoint]
    else:
        found = sorted(checkpoint.glob("*.distcp"), key=lambda path: path.stat().st_size) or sorted(
            checkpoint.glob("*.pt"), key=lambda path: path.stat().st_size
        )
    if not found:
        raise LookupError(f"no .distcp shard or .pt file in {checkpoint}")
    os.truncate(found[-1], found[-1].stat().st_size // 2)
    return found[-1]


BALLAST = ".ballast"  # another tenant's data on a shared file system (fill_filesystem)


def small_filesystem(path: Path, size_bytes: int) -> Path:
    """Mount a tmpfs of ``size_bytes`` at ``path`` (a job's checkpoint directory, made if missing): a file system
    of its own that :func:`fill_filesystem` can fill. Needs root (:class:`sim.cgroups.Unavailable` otherwise)."""
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0777", "nightshift-sim", str(path)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise cgroups.Unavailable(f"cannot mount a tmpfs at {path}: {result.stderr.strip()}")
    return path


def fill_filesystem(path: Path, leave_bytes: int = 0) -> int:
    """Fill the file system of ``path`` with a ballast file (:data:`BALLAST`) until at most ``leave_bytes`` are
    free, as another job's output fills a shared scratch: the next save that needs more fails with ENOSPC. The
    bytes written."""
    written = 0
    chunk = b"\0" * (64 * 1024)
    with (path / BALLAST).open("ab") as ballast:
        while (free := shutil.disk_usage(path).free) > leave_bytes:
            try:
                written += ballast.write(chunk[: max(1, min(len(chunk), free - leave_bytes))])
                ballast.flush()
            except OSError:  # ENOSPC: full
                break
    return written


def release_filesystem(path: Path) -> None:
    """Unmount what :func:`small_filesystem` mounted at ``path`` (lazily: a job may still hold it open)."""
    subprocess.run(["umount", "--lazy", str(path)], capture_output=True, timeout=30, check=False)


def clear(state_dir: Path, node: str | None = None, gpu: int | None = None, job: str | None = None) -> None:
    """Clear faults: of one GPU, of every GPU of a node (and its validation verdict), of one job, or (no
    argument) everything."""

    def keep_xid(event: dict[str, Any]) -> bool:
        return event["node"] != node or (gpu is not None and event["gpu"] != gpu)

    def change(data: dict[str, Any]) -> None:
        if node is None and job is None:
            data.clear()
            return
        if node is not None:
            data["xids"] = [e for e in data.get("xids", []) if keep_xid(e)]
            if gpu is None:
                data.get("validation", {}).pop(node, None)
            prefix = _gpu_key(node, gpu) if gpu is not None else f"{node}/"
            data["gpus"] = {
                key: value
                for key, value in data.get("gpus", {}).items()
                if not (key == prefix or (gpu is None and key.startswith(prefix)))
            }
        if job is not None:
            data.get("jobs", {}).pop(job, None)
            data.get("ranks", {}).pop(job, None)

    _update(state_dir, change)
