"""A webhook receiver on a loopback port that records every JSON POST: for tests and the payload capture script."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any


class WebhookSink:
    """Answers every POST 200 and records it. With ``token``, a POST without ``Authorization: Bearer <token>`` is
    answered 401 and not recorded. Serves from construction until :meth:`close`."""

    def __init__(self, token: str | None = None):
        self.received: list[Received] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                authorised = token is None or self.headers.get("Authorization") == f"Bearer {token}"
                if authorised:
                    with sink._lock:
                        sink.received.append(Received(self.path, dict(self.headers), json.loads(body)))
                self.send_response(200 if authorised else 401)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str = "/api/v1/alerts") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def bodies(self) -> list[Any]:
        """Every recorded JSON body, in arrival order."""
        with self._lock:
            return [request.body for request in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
