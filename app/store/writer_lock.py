"""One writer at a time on a SQLite database, across this process's threads and across processes; bounded waits.

SQLite admits one writer; the others wait in its busy handler, which sleeps between tries in steps of 1 to
100 ms and is not first come, first served. A webhook whose commit lands in one of those sleeps answers tens to
hundreds of milliseconds late (measured: p99 310 ms with the worker in a process of its own). Writers that queue
here first never meet SQLite's lock held: threads of a process queue on a ``threading.Lock``, processes on
``flock(2)`` of a file beside the database.

Every wait ends after ``timeout_s`` with :class:`app.domain.errors.StoreUnavailable`, so that a process holding the lock
(a stuck worker, an operator's ``sqlite3`` shell) costs the webhook a prompt 503, which Alertmanager retries, instead
of a hang. ``flock`` has no timeout of its own and a blocking call cannot be interrupted from Python outside the main
thread, so a process that finds the file locked tries again every ``POLL_S`` (``LOCK_NB``) until its deadline. The
uncontended path is one non-blocking call, as before.

Once a wait for another process has timed out, the next writers of this process wait only ``STUCK_WAIT_S`` until
one gets through: while a lock stays held for minutes, each webhook would otherwise hold one of the server's few
threads for the whole timeout, and ``/healthz`` would queue behind them.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from types import TracebackType

from app.domain.errors import StoreUnavailable

# How often a process waiting for another's flock tries again: the most it adds to a hand-over between processes.
POLL_S = 0.001
# How long a writer waits for another process while the last wait timed out (see above): far longer than a
# transaction, so a holder doing normal work again lets it through at once.
STUCK_WAIT_S = 0.1


class WriterLock:
    """Context manager around every write transaction of a SQLite store; ``path`` None: threads only (in memory)."""

    def __init__(self, path: Path | None, timeout_s: float):
        self.path = path
        self.timeout_s = timeout_s
        self._threads = threading.Lock()
        self._fd: int | None = None
        self._fd_pid = 0
        self._stuck = False  # the last wait for another process timed out (read and written under _threads)

    def __enter__(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        if not self._threads.acquire(timeout=self.timeout_s):
            raise self._busy("another thread of this process")
        if self.path is None:
            return
        try:
            self._flock(self._descriptor(self.path), deadline)
        except BaseException:
            self._threads.release()
            raise

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        try:
            if self.path is not None:
                fcntl.flock(self._descriptor(self.path), fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def _flock(self, fd: int, deadline: float) -> None:
        if self._stuck:
            deadline = min(deadline, time.monotonic() + STUCK_WAIT_S)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._stuck = False
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._stuck = True
                    raise self._busy(f"another process ({self.path})") from None
                time.sleep(min(POLL_S, left))

    def _busy(self, holder: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"store busy: {holder} held the write lock for more than {self.timeout_s:g} s"
        )

    def _descriptor(self, path: Path) -> int:
        # flock belongs to the open file, which a forked child shares with its parent: each process opens its own.
        if self._fd is None or self._fd_pid != os.getpid():
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._fd_pid = os.getpid()
        return self._fd
