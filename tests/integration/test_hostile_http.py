"""A battery of hostile raw HTTP requests against the real `nightshift serve`: every answer is a 2xx/3xx or a 4xx in
the JSON error shape (never a 5xx, never an HTML page from gunicorn), reads without credentials are refused, and
the server still delivers afterwards.

The cases are generated from a few request templates and mutations (request lines, methods, versions, header
names and values, lengths, chunk framing, ids and query numbers), deterministically, so a failure names its case.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket

import pytest
import requests

from sim.webhook_sink import WebhookSink
from tests.fixtures.reader import VIEWER_TOKEN
from tests.fixtures.serve import GUNICORN_TOKEN as TOKEN
from tests.fixtures.serve import post
from tests.fixtures.serve import start_gunicorn as start_serve
from tests.payloads import alert, body, xid

pytestmark = pytest.mark.integration

PAYLOAD = body(alert(xid()))
PATHS = [
    "/api/v1/incidents",
    "/api/v1/incidents/1",
    "/api/v1/incidents/99999999999999999999999",
    "/api/v1/incidents?limit=-1",
    "/api/v1/incidents?limit=-9223372036854775809",
    "/api/v1/incidents?before=9223372036854775808",
    "/api/v1/incidents?limit=%00",
    "/api/v1/status",
    "/",
    "/history?before=-1",
    "/nodes?days=99999999999999999999",
    "/incidents/99999999999999999999999",
    "/login?next=//evil.example",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/api/v1/incidents/1/handled",
]
AUTHS = [
    "",
    "Authorization: Bearer wrong\r\n",
    f"Authorization: Bearer {VIEWER_TOKEN}\r\n",
    "Authorization: Basic !!\r\n",
]
METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD", "G\x00T", "GET GET"]
BROKEN = [
    b"GARBAGE\r\n\r\n",
    b"\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
    b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcde\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n folded: continuation\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX\x7fBad: 1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-A: " + b"\xff" * 100 + b"\r\n\r\n",
    b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 40_000 + b"\r\n\r\n",
    b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 999-nonsense\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
]
WEBHOOK_BODIES = [
    b"",
    b"{",
    b"[]",
    b"null",
    b'{"version": "4", "alerts": [{}]}',
    b'{"version": "4", "alerts": [{"status": "firing", "labels": {"' + b"n" * 300 + b'": "x"}}]}',
    b'{"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": "\\ud800"}, "startsAt": "x"}]}',
    b"[" * 10_000,
    b'{"version": "4", "truncatedAlerts": 99999999999999999999999999, "alerts": []}',
    PAYLOAD.replace(b"GpuXidError", b"Gpu\\u0000XidError"),
]


def cases() -> list[tuple[str, bytes, bool]]:
    """(name, bytes, whether a 4xx may be the UI's HTML error page: a page, not the API, asked for in valid HTTP)."""
    out: list[tuple[str, bytes, bool]] = []
    for path, auth, method in itertools.product(PATHS, AUTHS, METHODS):
        request = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        page = not path.startswith("/api/") and " " not in method and "\x00" not in method
        out.append((f"{method} {path} [{auth.strip()[:30]}]", request.encode("latin-1"), page))
    for n, data in enumerate(BROKEN):
        out.append((f"broken[{n}]", data, False))
    for n, payload in enumerate(WEBHOOK_BODIES):
        for auth in (f"Bearer {TOKEN}", "Bearer wrong"):
            head = (
                f"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            )
            out.append((f"webhook body[{n}] {auth[:12]}", head.encode() + payload, False))
    return out


def exchange(address: tuple[str, int], data: bytes) -> bytes:
    with socket.create_connection(address, timeout=15) as sock:
        with contextlib.suppress(OSError):  # refused mid-send: the answer, if any, is still read below
            sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


@pytest.fixture
def server(tmp_path):
    sink = WebhookSink()
    operator = tmp_path / "operator-token"
    operator.write_text("hostile-operator-token")
    daemon, url = start_serve(tmp_path, sink, operator_token_file=str(operator))
    try:
        yield url
    finally:
        daemon.stop()
        sink.close()


def test_hostile_raw_requests_get_4xx_json_or_success_never_5xx(server):
    host, port = server.removeprefix("http://").split(":")
    address = (host, int(port))
    tried = failures = 0
    problems = []
    for name, data, page in cases():
        tried += 1
        answer = exchange(address, data)
        if not answer:
            continue  # the server may close on garbage it cannot frame as HTTP at all; counted below
        status_line, _, rest = answer.partition(b"\r\n")
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status == 100:  # an Expect handshake: the final answer follows
            status_line, _, rest = rest.split(b"\r\n\r\n", 1)[1].partition(b"\r\n")
            status = int(status_line.split()[1])
        head, _, payload = rest.partition(b"\r\n\r\n")
        length = [
            line.split(b":", 1)[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ]
        payload = (
            payload[: int(length[0])] if length else payload
        )  # a second answer may follow (a body drained)
        html_page = page and b"content-type: text/html" in head.lower() and b"<!doctype html>" in payload
        if status >= 500 or status == 0:
            problems.append((name, status_line[:80]))
        elif status >= 400 and not data.startswith(b"HEAD") and not html_page:
            try:
                doc = json.loads(payload)
                ok = doc.get("status") == "error" and bool(doc.get("message"))
            except ValueError:
                ok = False
            if not ok:
                problems.append((name, status_line[:80], payload[:80]))
        failures += bool(problems and problems[-1][0] == name)
    print(f"hostile raw requests: {tried} tried, {tried - failures} passed, {failures} failed")
    assert not problems, problems[:20]
    # Reads without credentials were refused, and the server still works.
    assert requests.get(f"{server}/api/v1/incidents", timeout=5).status_code == 401
    assert post(server, body(alert(xid(node="after", job="4242")))).status_code == 200
