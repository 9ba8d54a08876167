"""The state directory the simulator's processes share, and atomic JSON files in it.

Layout (``D`` is ``--state-dir``)::

    D/faults.json              injected faults (sim.faults); written under D/.lock
    D/hpc-jobs/<node>/<gpu>    Slurm job ids on that GPU, one a line (dcgm-exporter's HPC job mapping)
    D/trainers/<name>.json     each trainer's status: pid, node, phase (running|hung|failed|exited), step, ...
    D/trainers/<name>.rank<N>.json   the same for rank N > 0 of a multi-node job
    D/nodes/<node>/kern.log    dmesg-style kernel log lines (Xid events)

Writers replace files atomically (write a temporary file, then ``os.replace``), so a reader never sees half a
file; read-modify-write of ``faults.json`` holds an ``flock`` on ``D/.lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def faults_path(state_dir: Path) -> Path:
    return state_dir / "faults.json"


def hpc_job_dir(state_dir: Path, node: str) -> Path:
    """dcgm-exporter's ``--hpc-job-mapping-dir`` of ``node``: a file per GPU index holding job ids, one a line
    (written by deploy/slurm/hpc-job-mapping.sh)."""
    return state_dir / "hpc-jobs" / node


def trainer_status_path(state_dir: Path, name: str, rank: int = 0) -> Path:
    return state_dir / "trainers" / (f"{name}.json" if rank == 0 else f"{name}.rank{rank}.json")


def kern_log_path(state_dir: Path, node: str) -> Path:
    return state_dir / "nodes" / node / "kern.log"


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (readers see the old or the new file, never a mix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: Path, default: Any) -> Any:
    """The JSON in ``path``, or ``default`` when the file does not exist yet."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Hold the state directory's lock (for read-modify-write of faults.json by several processes)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` is running: it exists (signal 0) and is not a zombie awaiting its parent."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        # /proc/<pid>/stat: "pid (comm) state ..."; comm may contain spaces, so split after the last ")".
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def read_trainers(state_dir: Path) -> list[dict[str, Any]]:
    """Every trainer status file (see :mod:`sim.trainer`), oldest name first; unreadable ones are skipped."""
    statuses = []
    for path in sorted((state_dir / "trainers").glob("*.json")):
        with contextlib.suppress(ValueError, OSError):
            statuses.append(json.loads(path.read_text()))
    return statuses
