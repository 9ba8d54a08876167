"""A rank's debug socket: PyTorch's own per-process worker server, where Nightshift reads the rank's Flight Recorder
while the rank hangs (importing this module imports ``torch``; ``import nightshift_progress`` never does).

PyTorch (2.7 and later; checked on 2.13.0+cpu) serves debug handlers from a thread of the process:
``torch._C._distributed_c10d._WorkerServer(<unix socket path>)``, answering ``POST /handler/<name>`` over HTTP,
among them ``fr_trace_json`` (the Flight Recorder: the rank's last collectives and, per process group, the last one
enqueued and completed), ``dump_traceback`` (every thread's Python stack) and ``ping``. The server thread answers
while the training thread is blocked in a collective, so the ranks that wait show the collective they wait in; a
rank that stopped (SIGSTOP, a hard hang) does not answer at all. The Flight Recorder records only with
``TORCH_FR_BUFFER_SIZE`` set (entries kept; ``TORCH_NCCL_TRACE_BUFFER_SIZE`` before 2.7), for NCCL and gloo alike.

The contract with Nightshift's collect step (``slurm.job_stacks``, app/actions/stacks.py): the socket is
``torch-rank-<RANK>.sock`` in the node-local exchange directory of :func:`nightshift_progress.timing.exchange_dir`
(``NIGHTSHIFT_PROGRESS_DIR``, else ``/dev/shm/nightshift-progress-<uid>-<SLURM_JOB_ID>``), which the collect step
finds from the process's environment. Usage, in each rank before training::

    from nightshift_progress.torch_debug import serve_debug_socket

    server = serve_debug_socket(progress)  # None when this PyTorch has no worker server

Only the user who owns the directory (mode 0700) reaches the socket: Nightshift's collect step runs as root or as
the job's owner, as it must for py-spy.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from nightshift_progress.progress import Progress

log = logging.getLogger("nightshift_progress")

# A Unix socket path is at most 107 bytes on Linux (sun_path is 108 with the terminating NUL).
MAX_SOCKET_PATH = 107


def socket_path(directory: Path, rank: int) -> Path:
    """Where rank ``rank`` serves its debug handlers in the node's exchange directory ``directory``."""
    return directory / f"torch-rank-{rank}.sock"


def serve_debug_socket(progress: Progress) -> Any:
    """Start PyTorch's worker server for this rank at :func:`socket_path` in the progress exchange directory; the
    server (keep a reference; ``shutdown()`` it at the end), or None when this PyTorch has none or the path cannot
    be served (too long, not writable), which is logged, never raised: the training goes on without it."""
    try:
        from torch._C._distributed_c10d import _WorkerServer
    except ImportError:
        log.warning(
            "nightshift_progress: this PyTorch has no worker server: no Flight Recorder dumps on demand"
        )
        return None
    path = socket_path(progress.rank_timing.directory, progress.identity.rank)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        log.warning("nightshift_progress: %s is too long for a Unix socket: no debug socket", path)
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.unlink(missing_ok=True)  # a previous run's
        return _WorkerServer(str(path))
    except (OSError, RuntimeError) as exc:
        log.warning("nightshift_progress: no debug socket at %s: %s", path, exc)
        return None
