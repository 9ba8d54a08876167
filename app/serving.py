"""The gunicorn worker class of ``nightshift serve``: gthread with a front buffer, so slow clients hold no thread.

gunicorn's gthread worker hands a connection to a thread as soon as its first bytes arrive, and the thread then
blocks reading the rest of the head and the body: ten clients sending a header line every few seconds hold all the
threads, and Alertmanager's deliveries wait behind them. :class:`BufferingWorker` reads every request on the
worker's event loop instead (non-blocking, in the one thread that accepts connections) until
:func:`app.domain.framing.request_state` says it is complete, and only then gives it, bytes in hand, to a thread. So:

- a thread only ever serves a request that has fully arrived: slow clients cost a socket and a buffer, not a thread;
- a request must arrive within ``http.read_timeout_seconds`` (408 otherwise), its head within
  ``http.max_header_bytes`` (431) and its body within ``webhook.max_body_bytes`` (413, by Content-Length before
  reading it, or chunked as it comes); these answers, and gunicorn's own 400/414/431 for a malformed request, carry
  the JSON error shape ``{"status": "error", "message": ...}`` like every other error;
- at most ``worker_connections`` (gunicorn's, default 1000) connections per worker, buffers included;
- a client that asks ``Expect: 100-continue`` gets its ``100 Continue`` from the front once the head is in (gunicorn
  sends another when a thread takes the request; clients read any number of 1xx answers).

Kept-alive connections go through the same buffer for each request. TLS is not terminated here (put a proxy in
front); with ``certfile`` set, the worker behaves as plain gthread. Written against gunicorn 27's gthread worker
(pyproject pins ``gunicorn>=27,<28``).
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from app.domain.framing import COMPLETE, INCOMPLETE, json_error_response, request_state

READ_SIZE = 65536
LINGER_SECONDS = 2.0  # after a refusal, how long the rest of the client's request is read and discarded


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """Stands in for ``gunicorn.util.write_error``: gunicorn's own error answers in the JSON error shape."""
    util.write_nonblock(sock, json_error_response(status_int, mesg or reason))


class BufferingWorker(ThreadWorker):
    """gthread, with each request read in full on the event loop before a thread serves it (module docstring)."""

    read_timeout = 10.0
    max_header = 32_768
    max_body = 1_048_576

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading: dict[Any, float] = {}  # connection -> deadline (monotonic)
        self.lingering: dict[Any, float] = {}  # refused connection -> when to close it

    def init_process(self) -> None:
        util.write_error = write_json_error  # this worker process only
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        settings = self.wsgi.extensions["nightshift"].settings
        self.read_timeout = settings.http.read_timeout_seconds
        self.max_header = settings.http.max_header_bytes
        self.max_body = settings.webhook.max_body_bytes

    # --- reading on the event loop -----------------------------------------------------------------------------

    def enqueue_req(self, conn: Any) -> None:
        """Called for a new connection, a kept-alive one that became readable, or one with read-ahead: read first."""
        if self.cfg.is_ssl:
            super().enqueue_req(conn)
            return
        conn.front = bytearray()
        conn.continued = False
        if conn.parser is not None:  # kept alive: bytes already read past the previous request belong here
            conn.front += conn.parser.unreader.take_buffered()
        conn.sock.setblocking(False)
        # Read what is there already (a kept-alive connection is readable when this is called): a request that
        # arrived whole is dispatched now, without another turn of the event loop.
        if not self._read_available(conn) or self._advance(conn):
            return
        self.reading[conn] = time.monotonic() + self.read_timeout
        self.poller.register(conn.sock, selectors.EVENT_READ, self._on_readable(conn))

    def _on_readable(self, conn: Any) -> Callable[[Any], None]:
        def readable(_sock: Any) -> None:
            if self._read_available(conn):
                self._advance(conn)

        return readable

    def _read_available(self, conn: Any) -> bool:
        """Append what the socket holds to the buffer, without blocking; False when the client went away."""
        try:
            while True:
                chunk = conn.sock.recv(READ_SIZE)
                if not chunk:  # the client went away before its request was complete
                    self._drop(conn)
                    return False
                conn.front += chunk
                if len(chunk) < READ_SIZE or len(conn.front) > self.max_header + self.max_body:
                    return True  # drained, or enough to judge: framing refuses what is over the limits
        except BlockingIOError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return True
            self._drop(conn)
            return False

    def _advance(self, conn: Any) -> bool:
        """Dispatch a complete request or refuse a bad one; False while more bytes may come."""
        if not conn.front:
            return False
        framing = request_state(bytes(conn.front), self.max_header, self.max_body)
        if framing.state == INCOMPLETE:
            if framing.expect_continue and not conn.continued:
                conn.continued = True
                with contextlib.suppress(OSError):  # a client gone away is noticed at the next read
                    conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            return False
        self._forget(conn)
        if framing.state == COMPLETE:
            conn.data_ready = True
            super().enqueue_req(conn)  # the thread finds every byte in hand (handle)
        else:
            self._refuse(conn, framing.status, framing.message)
        return True

    def _refuse(self, conn: Any, status: int, message: str) -> None:
        """Answer with the JSON error, then read and discard what the client still sends for a moment before
        closing: closing on unread bytes would reset the connection and could lose the answer."""
        self.log.warning("refused a request from %s: %s %s", conn.client, status, message)
        try:
            conn.sock.send(json_error_response(status, message))  # small: fits the socket buffer
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.nr_conns -= 1
            conn.close()
            return
        self.lingering[conn] = time.monotonic() + LINGER_SECONDS
        self.poller.register(conn.sock, selectors.EVENT_READ, self._on_lingering(conn))

    def _on_lingering(self, conn: Any) -> Callable[[Any], None]:
        def readable(_sock: Any) -> None:
            try:
                while conn.sock.recv(READ_SIZE):
                    pass
            except BlockingIOError:
                return
            except OSError:
                pass
            self._close_lingering(conn)  # end of stream, or the connection failed

        return readable

    def _close_lingering(self, conn: Any) -> None:
        self.lingering.pop(conn, None)
        self._drop(conn)

    def _forget(self, conn: Any) -> None:
        self.reading.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):  # not registered (any more)
            self.poller.unregister(conn.sock)

    def _drop(self, conn: Any) -> None:
        self._forget(conn)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        """gthread's pending connections, and requests still arriving after their deadline (408)."""
        super().murder_pending()
        now = time.monotonic()
        for conn, deadline in list(self.reading.items()):
            if deadline <= now:
                self._forget(conn)
                self._refuse(conn, 408, f"request not received within {self.read_timeout:g}s")
        for conn, deadline in list(self.lingering.items()):
            if deadline <= now:
                self._close_lingering(conn)

    # --- serving on a thread -----------------------------------------------------------------------------------

    def handle(self, conn: Any) -> Any:
        front = getattr(conn, "front", None)
        if front is not None:
            conn.front = None
            conn.sock.setblocking(True)
            conn.init()
            conn.parser.unreader.unread(bytes(front))
        return super().handle(conn)
