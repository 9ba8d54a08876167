"""The checkpoint request: how Nightshift asks a running job to checkpoint now (before it swaps out a node that
warns it will fail, or restarts the job off a straggler), and how the job answers.

The contract (``docs/playbooks.md``, planned swaps):

- **Asking.** Either a signal to the training processes, ``SIGUSR1`` by default (Slurm: ``scancel
  --signal=USR1 <job>``, which reaches the processes ``srun`` started), or a request file touched on the node
  (Kubernetes: an exec of ``touch`` in the job's pods; any scheduler: a prolog-style hook). The file is
  ``NIGHTSHIFT_CHECKPOINT_REQUEST_FILE``, else ``checkpoint-request`` in the node's exchange directory
  (:func:`nightshift_progress.timing.exchange_dir`).
- **Stale requests.** A request file older than the checkpoint a run resumed from (``Progress.resumed`` with
  its ``checkpoint_time``) was answered before: a requeued job does not checkpoint again at its first step.
- **Answering.** The training loop polls :meth:`Progress.checkpoint_requested` (cheap: a flag and at most one
  ``stat`` a second) and, when it is true, writes a checkpoint inside :meth:`Progress.checkpointing` (or calls
  :meth:`Progress.checkpoint_saved` after). The new ``training_last_checkpoint_timestamp_seconds`` is the
  answer Nightshift waits for; ``training_checkpoint_requested`` (1 while a request is pending) shows it was
  heard. The Hugging Face and Lightning callbacks do both.

The signal handler is installed only from the main thread and only where the signal still has its default
action, so a framework's own handler (Lightning's SLURM auto-requeue uses ``SIGUSR1``) is never replaced;
``NIGHTSHIFT_CHECKPOINT_SIGNAL`` names another signal (``USR2``) or ``none``. Under ``torchrun`` the signal
reaches every process of the step, torchrun's agent included, which dies of it or (``--signals-to-handle``)
shuts the workers down: use the request file there, touched from a ``trap`` in the batch script
(``progress/README.md`` says how; ``sim/torch_job.py`` does it).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

DEFAULT_SIGNAL = "USR1"
REQUEST_FILE = "checkpoint-request"
# At most one stat of the request file a second, however fast the training loop polls.
POLL_SECONDS = 1.0


def signal_from_env(env: Mapping[str, str]) -> signal.Signals | None:
    """The signal ``NIGHTSHIFT_CHECKPOINT_SIGNAL`` names (``USR1`` by default; ``none`` for no signal).
    ValueError for a name that is not a signal."""
    name = env.get("NIGHTSHIFT_CHECKPOINT_SIGNAL", DEFAULT_SIGNAL).strip().upper()
    if name in ("", "NONE"):
        return None
    try:
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except KeyError:
        raise ValueError(
            f"NIGHTSHIFT_CHECKPOINT_SIGNAL={name!r} is not a signal (USR1, USR2 or none)"
        ) from None


class CheckpointRequest:
    """Whether a checkpoint has been asked for since the last one was saved."""

    def __init__(self, request_file: Path, *, clock: Callable[[], float] = time.time):
        self.request_file = request_file
        self._clock = clock
        self._signalled = False
        self._last_saved = -math.inf
        self._polled_at = -math.inf
        self._file_pending = False

    def install_signal(self, signum: signal.Signals | None) -> bool:
        """Handle ``signum`` as a request, if this is the main thread and nobody else handles it; whether it did."""
        if signum is None or threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(signum) is not signal.SIG_DFL:
            return False
        signal.signal(signum, self._on_signal)
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = True

    def requested(self) -> bool:
        """True while a request (signal, or a request file newer than the last checkpoint) is pending."""
        if self._signalled:
            return True
        now = self._clock()
        if now - self._polled_at >= POLL_SECONDS:
            self._polled_at = now
            try:
                self._file_pending = self.request_file.stat().st_mtime > self._last_saved
            except OSError:
                self._file_pending = False
        return self._file_pending

    def saved(self, timestamp: float) -> None:
        """A checkpoint was saved at ``timestamp``: the pending request is answered."""
        self._signalled = False
        self._file_pending = False
        self._last_saved = max(self._last_saved, timestamp)

    def resumed_from(self, timestamp: float) -> None:
        """The job resumed from a checkpoint saved at ``timestamp``: a request file older than it was answered by
        that checkpoint (before a requeue, say), so it asks nothing of this run. A signal is left pending."""
        self._last_saved = max(self._last_saved, timestamp)
        self._polled_at = -math.inf  # look at the file again with the new bound


def request_file_from_env(env: Mapping[str, str], exchange: Path) -> Path:
    """``NIGHTSHIFT_CHECKPOINT_REQUEST_FILE``, else ``checkpoint-request`` in the exchange directory."""
    configured = env.get("NIGHTSHIFT_CHECKPOINT_REQUEST_FILE", "")
    return Path(configured) if configured else exchange / REQUEST_FILE


def ask(request_file: Path) -> None:
    """Ask for a checkpoint through the request file (what an operator's hook or a test does)."""
    request_file.parent.mkdir(parents=True, exist_ok=True)
    request_file.touch()
    os.utime(request_file)
