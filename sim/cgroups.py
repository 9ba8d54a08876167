"""Resource limits on one process, as a node's kernel enforces them: a memory cap (the OOM killer ends the process
when it allocates past it) and a CPU quota (a slow rank). For :mod:`sim.faults`.

cgroup v2 where its controller is delegated (``memory``/``cpu`` in ``/sys/fs/cgroup/cgroup.controllers``:
``memory.max``, ``cpu.max``), else cgroup v1 (``memory.limit_in_bytes``; ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``). A group is created under the one this process is in, named ``nightshift-sim-<name>``;
:func:`remove` deletes it once its processes are gone. Needs root (or a delegated subtree): :class:`Unavailable`
otherwise, with what was found.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000


class Unavailable(RuntimeError):
    """No writable cgroup hierarchy with the controller."""


def _v2_has(controller: str) -> bool:
    controllers = ROOT / "cgroup.controllers"
    return controllers.is_file() and controller in controllers.read_text().split()


def _own_group(controller: str) -> str:
    """This process's group in the v1 hierarchy of ``controller`` ('' for the root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    return ""


def _group(controller: str, name: str) -> tuple[Path, bool]:
    """The new group's directory and whether it is v2."""
    if _v2_has(controller):
        base, v2 = ROOT, True
    elif (ROOT / controller).is_dir():
        base, v2 = ROOT / controller / _own_group(controller), False
    else:
        raise Unavailable(
            f"no cgroup {controller} controller under {ROOT} (v2 not delegated, no v1 hierarchy)"
        )
    path = base / f"nightshift-sim-{name}"
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise Unavailable(f"cannot create {path}: {exc}") from None
    return path, v2


def _place(path: Path, pid: int) -> None:
    (path / "cgroup.procs").write_text(f"{pid}\n")


def limit_memory(pid: int, name: str, limit_bytes: int) -> Path:
    """Move ``pid`` into a memory group capped at ``limit_bytes``; the group's directory."""
    path, v2 = _group("memory", name)
    (path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(f"{limit_bytes}\n")
    if not v2:
        with contextlib.suppress(OSError):  # no swap accounting on some kernels: then swap is off anyway
            (path / "memory.memsw.limit_in_bytes").write_text(f"{limit_bytes}\n")
    _place(path, pid)
    return path


def limit_cpu(pid: int, name: str, fraction: float) -> Path:
    """Move ``pid`` into a CPU group allowed ``fraction`` of one CPU; the group's directory."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a CPU fraction in (0, 1], got {fraction}")
    path, v2 = _group("cpu", name)
    quota = max(1000, int(CPU_PERIOD_US * fraction))
    if v2:
        (path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}\n")
    else:
        (path / "cpu.cfs_period_us").write_text(f"{CPU_PERIOD_US}\n")
        (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    _place(path, pid)
    return path


def remove(path: Path, timeout: float = 30.0) -> None:
    """Delete a group made here once its processes have exited (a cancelled job's take a few seconds), waiting at
    most ``timeout`` seconds; nothing when it is gone. OSError when it still holds a process after that."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: a process is still in it
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
