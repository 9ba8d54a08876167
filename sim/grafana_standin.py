"""A Grafana stand-in: the annotations API of one organisation, for the demo and the e2e tests.

No Grafana server is installable here, so :class:`GrafanaAnnotations` reproduces the contract Nightshift relies on,
from Grafana's docs and ``pkg/api/annotations.go``, and is the one implementation behind both this HTTP server
(``python -m sim.grafana_standin --port P --token-file F``) and the unit tests' ``responses`` fake
(``tests/contracts.py``):

- every call needs ``Authorization: Bearer <service-account token>`` (else 401 ``Unauthorized``);
- ``POST /api/annotations`` binds the JSON body to a typed DTO (a type mismatch is 400 ``bad request data``),
  ``time``/``timeEnd`` are integer epoch **milliseconds** (values below 10**12 are refused as the classic
  seconds-for-milliseconds mistake), ``text`` must be non-empty, ``tags`` is a list of strings; the answer is
  200 ``{"message": "Annotation added", "id": N}``;
- ``PATCH /api/annotations/<id>`` updates only the fields it is given (404 for an unknown id);
- ``GET /api/annotations?tags=a&tags=b&limit=N`` lists annotations carrying every tag, newest first (a subset of
  Grafana's query: tags, limit, from/to in ms);
- ``GET /api/health`` answers ``{"database": "ok", ...}``.

Annotations live in memory: a restarted stand-in starts empty, which is all the demo needs.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

# PostAnnotationsCmd / PatchAnnotationsCmd (pkg/api/dtos/annotations.go): field → accepted JSON types.
POST_FIELDS: dict[str, tuple[type, ...]] = {
    "dashboardId": (int,),
    "dashboardUID": (str,),
    "panelId": (int,),
    "time": (int,),
    "timeEnd": (int,),
    "text": (str,),
    "tags": (list,),
    "data": (dict,),
}
PATCH_FIELDS = {key: POST_FIELDS[key] for key in ("time", "timeEnd", "text", "tags", "data")}
ANNOTATIONS = "/api/annotations"
DEFAULT_LIMIT = 100  # Grafana's default for GET /api/annotations

Reply = tuple[int, Any]  # (HTTP status, JSON body)


class Headers(Protocol):
    """What both header types offer (``http.server``'s message and ``requests``' case-insensitive dict)."""

    def get(self, name: str, default: Any = None) -> Any: ...


class BadRequest(Exception):
    """The request is refused with ``reply``."""

    def __init__(self, status: int, body: dict[str, Any]):
        super().__init__(body.get("message", ""))
        self.reply: Reply = (status, body)


class GrafanaAnnotations:
    """The annotations of one Grafana organisation, and the requests that read and change them.

    ``annotations`` maps id → ``{time, timeEnd, text, tags, dashboardUID}``; ``bodies`` is every JSON body accepted
    by POST or PATCH, in order (tests assert on both). Thread-safe: the HTTP server calls :meth:`handle` from
    several threads.
    """

    def __init__(self, token: str):
        self.token = token
        self.annotations: dict[int, dict[str, Any]] = {}
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def handle(self, method: str, url: str, headers: Headers, body: bytes | str | None) -> Reply:
        """Answer one request: ``url`` is the path with its query string."""
        parts = urlsplit(url)
        path = parts.path.rstrip("/")
        try:
            if method == "GET" and path == "/api/health":
                return 200, {"commit": "8d3e4f1", "database": "ok", "version": "11.3.0"}
            self._authenticate(headers)
            with self._lock:
                if method == "POST" and path == ANNOTATIONS:
                    return self._create(self._bind(headers, body, POST_FIELDS))
                if method == "PATCH" and path.startswith(f"{ANNOTATIONS}/"):
                    annotation_id = path.rsplit("/", 1)[1]
                    if not annotation_id.isdigit():
                        return 404, {"message": "Not found"}
                    return self._update(int(annotation_id), self._bind(headers, body, PATCH_FIELDS))
                if method == "GET" and path == ANNOTATIONS:
                    return self._find(parse_qs(parts.query))
        except BadRequest as refused:
            return refused.reply
        return 404, {"message": "Not found"}

    def _authenticate(self, headers: Headers) -> None:
        if headers.get("Authorization") != f"Bearer {self.token}":
            raise BadRequest(401, {"message": "Unauthorized"})

    def _bind(
        self, headers: Headers, raw: bytes | str | None, fields: Mapping[str, tuple[type, ...]]
    ) -> dict[str, Any]:
        """Decode the body like Grafana's ``web.Bind`` into the DTO's fields; BadRequest when it does not fit."""
        if not (headers.get("Content-Type") or "").startswith("application/json"):
            raise BadRequest(400, {"message": "bad request data"})
        try:
            body = json.loads(raw or b"")
        except (TypeError, ValueError):
            raise BadRequest(400, {"message": "bad request data"}) from None
        if not isinstance(body, dict):
            raise BadRequest(400, {"message": "bad request data"})
        for key, value in body.items():
            types = fields.get(key)
            if types is None:
                continue  # encoding/json ignores unknown fields
            if isinstance(value, bool) or not isinstance(value, types):
                raise BadRequest(400, {"message": "bad request data", "field": key})
        if not all(isinstance(tag, str) for tag in body.get("tags") or []):
            raise BadRequest(400, {"message": "bad request data", "field": "tags"})
        for key in ("time", "timeEnd"):
            if body.get(key) and body[key] < 10**12:
                raise BadRequest(400, {"message": f"{key} {body[key]} is in seconds, not milliseconds"})
        self.bodies.append(body)
        return body

    def _create(self, body: dict[str, Any]) -> Reply:
        if not body.get("text"):
            return 400, {"message": "Failed to save annotation"}
        start, end = body.get("time", 0), body.get("timeEnd", 0)
        if not start and not end:
            return 400, {"message": "Failed to save annotation"}  # ErrTimerangeMissing
        start, end = start or end, end or start  # validateTimeRange
        annotation_id = len(self.annotations) + 1
        self.annotations[annotation_id] = {
            "time": min(start, end),
            "timeEnd": max(start, end),
            "text": body["text"],
            "tags": list(body.get("tags") or []),
            "dashboardUID": body.get("dashboardUID", ""),
        }
        return 200, {"message": "Annotation added", "id": annotation_id}

    def _update(self, annotation_id: int, body: dict[str, Any]) -> Reply:
        stored = self.annotations.get(annotation_id)
        if stored is None:
            return 404, {"message": "Annotation not found"}
        if body.get("tags") is not None:
            stored["tags"] = body["tags"]
        if body.get("text"):
            stored["text"] = body["text"]
        for key in ("time", "timeEnd"):
            if body.get(key, 0) > 0:
                stored[key] = body[key]
        return 200, {"message": "Annotation patched"}

    def _find(self, query: Mapping[str, Sequence[str]]) -> Reply:
        try:
            limit = int(query.get("limit", [DEFAULT_LIMIT])[0])
            start = int(query.get("from", [0])[0])
            end = int(query.get("to", [0])[0])
        except ValueError:
            return 400, {"message": "bad request data"}
        tags = set(query.get("tags", []))
        found = [
            {"id": annotation_id, "panelId": 0, **stored}
            for annotation_id, stored in self.annotations.items()
            if tags <= set(stored["tags"])
            and (not start or stored["timeEnd"] >= start)
            and (not end or stored["time"] <= end)
        ]
        found.sort(key=lambda a: (a["time"], a["id"]), reverse=True)
        return 200, found[:limit]


def make_server(annotations: GrafanaAnnotations, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server answering every request with ``annotations.handle``; one log line per request."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            status, body = annotations.handle(self.command, self.path, self.headers, self.rfile.read(length))
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PATCH = _answer

        def log_message(self, format: str, *args: Any) -> None:
            print(f"{self.address_string()} {format % args}", flush=True)

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim.grafana_standin", description="Grafana's annotations API, in memory."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-file", type=Path, required=True, help="the service-account token expected")
    args = parser.parse_args(argv)
    server = make_server(GrafanaAnnotations(args.token_file.read_text().strip()), args.host, args.port)
    print(f"grafana stand-in on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
