"""Waking an idle worker the moment the webhook accepts a notification, instead of at its next poll.

Worker threads in the webhook's own process wait on an Event. A worker *process* on the same host (``nightshift
worker`` beside ``serve`` with ``embedded_worker: false``) listens on a Unix datagram socket in the data directory,
``worker.sock``, and every accept sends it one byte. A wakeup is only a hint: a lost datagram, a full socket buffer,
no listener, or a path too long for a Unix socket (108 bytes) all leave the worker to its poll
(``worker.poll_seconds``); nothing depends on it for correctness. One process per host listens; others poll.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
from pathlib import Path

log = logging.getLogger(__name__)

SOCKET_NAME = "worker.sock"


class Wakeup:
    """``set``, ``is_set``, ``clear`` and ``wait`` as on a ``threading.Event``; ``set`` also reaches a listening
    process."""

    def __init__(self, socket_path: Path | None = None):
        self.socket_path = socket_path
        self._event = threading.Event()
        self._address = str(socket_path) if socket_path is not None else ""
        self._sender = _datagram_socket() if socket_path is not None else None
        self._listener: socket.socket | None = None

    def set(self) -> None:
        self._event.set()
        if self._sender is None:
            return
        # Nobody listening, a wakeup already pending (buffer full), or an unusable path: the worker polls.
        with contextlib.suppress(OSError):
            self._sender.sendto(b"!", self._address)

    def is_set(self) -> bool:
        """Whether this process set it (another process's wakeup shows only in ``wait``)."""
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()
        if self._listener is not None:
            _drain(self._listener)

    def wait(self, timeout: float) -> bool:
        """True once set (here or by another process), False after ``timeout`` seconds."""
        if self._listener is None:
            return self._event.wait(timeout)
        if self._event.is_set():
            return True
        readable, _, _ = select.select([self._listener], [], [], timeout)
        return bool(readable) or self._event.is_set()

    def listen(self) -> bool:
        """Receive other processes' wakeups from now on. False (and poll only) when another live process listens,
        or the socket cannot be made."""
        if self.socket_path is None or self._listener is not None:
            return self._listener is not None
        path = self._address
        listener = _datagram_socket()
        try:
            try:
                listener.bind(path)
            except OSError:
                if _someone_listens(path):
                    listener.close()
                    log.info("wakeup: another process listens on %s; this worker polls", path)
                    return False
                os.unlink(path)  # left by a process that died
                listener.bind(path)
        except OSError as exc:
            listener.close()
            log.warning("wakeup: cannot listen on %s (%s); this worker polls", path, exc)
            return False
        os.chmod(path, 0o600)
        self._listener = listener
        return True

    def close(self) -> None:
        """Close the sockets; a listener removes its socket file."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            if self.socket_path is not None:
                self.socket_path.unlink(missing_ok=True)
        if self._sender is not None:
            self._sender.close()
            self._sender = None


def _datagram_socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    return sock


def _someone_listens(path: str) -> bool:
    probe = _datagram_socket()
    try:
        probe.connect(path)
        return True
    except OSError:  # ConnectionRefusedError: a socket file nobody has bound
        return False
    finally:
        probe.close()


def _drain(sock: socket.socket) -> None:
    while True:
        try:
            sock.recv(64)
        except BlockingIOError:
            return
