"""One writer at a time on a SQLite database, across this process's threads and across processes.

SQLite admits one writer; the others wait in its busy handler, which sleeps between tries in steps of 1 to
100 ms and is not first come, first served. A webhook whose commit lands in one of those sleeps answers tens to
hundreds of milliseconds late (measured: p99 310 ms with the worker in a process of its own). Writers that queue
here first never meet SQLite's lock held: threads of a process queue on a ``threading.Lock``, processes on
``flock(2)`` of a file beside the database, which the kernel hands to a waiter the moment it is released.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from types import TracebackType


class WriterLock:
    """Context manager around every write transaction of a file-backed SQLite store."""

    def __init__(self, path: Path):
        self.path = path
        self._threads = threading.Lock()
        self._fd: int | None = None
        self._fd_pid = 0

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            fcntl.flock(self._descriptor(), fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        try:
            fcntl.flock(self._descriptor(), fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def _descriptor(self) -> int:
        # flock belongs to the open file, which a forked child shares with its parent: each process opens its own.
        if self._fd is None or self._fd_pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._fd_pid = os.getpid()
        return self._fd
