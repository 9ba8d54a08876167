"""Slow and malformed clients against the real `nightshift serve` (gunicorn, app.serving.BufferingWorker).

50 sockets that trickle their request (25 unauthenticated heads, a line at a time; 25 authenticated webhook bodies, a
byte at a time) must not delay Alertmanager's deliveries by more than a second; a request that does not arrive within
``http.read_timeout_seconds`` is answered 408; gunicorn's own refusals and the front's (400, 413, 414, 431) carry
the JSON error shape.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from sim.webhook_sink import WebhookSink
from tests.fixtures.serve import GUNICORN_TOKEN as TOKEN
from tests.fixtures.serve import post
from tests.fixtures.serve import start_gunicorn as start_serve
from tests.payloads import alert, body, xid

pytestmark = pytest.mark.integration

SLOW_CLIENTS = 50
READ_TIMEOUT = 20  # seconds a request may take to arrive; longer than the test's trickle


@pytest.fixture
def slow_server(tmp_path) -> Iterator[str]:
    sink = WebhookSink()
    daemon, url = start_serve(tmp_path, sink, http={"read_timeout_seconds": READ_TIMEOUT})
    try:
        yield url
    finally:
        daemon.stop()
        sink.close()
        print(daemon.log_tail())


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def raw(url: str, data: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` as is and read the whole answer: (status, headers, body)."""
    with socket.create_connection(address(url), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, payload


def assert_json_error(status: int, headers: dict[str, str], payload: bytes, expected: int) -> None:
    assert status == expected, (status, payload[:200])
    assert headers["content-type"].startswith("application/json"), headers
    doc = json.loads(payload)
    assert doc["status"] == "error" and doc["message"], doc


class Trickler(threading.Thread):
    """One slow client: sends ``data`` in pieces of ``step`` bytes every ``every`` seconds until told to stop."""

    def __init__(self, url: str, data: bytes, step: int, every: float, stop: threading.Event):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(address(url), timeout=5)
        self.data, self.step, self.every, self.stop = data, step, every, stop

    def run(self) -> None:
        try:
            for start in range(0, len(self.data), self.step):
                self.sock.sendall(self.data[start : start + self.step])
                if self.stop.wait(self.every):
                    return
        except OSError:
            pass
        finally:
            self.sock.close()


def test_fifty_slow_clients_do_not_delay_a_valid_delivery(slow_server):
    url = slow_server
    baseline = []
    for n in range(3):
        started = time.monotonic()
        assert post(url, body(alert(xid(node=f"base{n}", job=str(100 + n))))).status_code == 200
        baseline.append(time.monotonic() - started)
    stop = threading.Event()
    slow_head = b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\n" + b"".join(
        f"X-Slow-{i}: {'y' * 20}\r\n".encode() for i in range(200)
    )
    payload = body(alert(xid(node="slow", job="999")))
    slow_body = (
        f"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    clients = [Trickler(url, slow_head, 32, 0.5, stop) for _ in range(SLOW_CLIENTS // 2)]
    clients += [Trickler(url, slow_body, 1, 0.5, stop) for _ in range(SLOW_CLIENTS - SLOW_CLIENTS // 2)]
    for client in clients:
        client.start()
    try:
        time.sleep(2)  # every slow client is connected and mid-request
        delays = []
        for n in range(4):
            started = time.monotonic()
            response = post(url, body(alert(xid(node=f"node{n}", job=str(200 + n)))))
            delays.append(time.monotonic() - started)
            assert response.status_code == 200, response.text
        assert all(
            client.is_alive() for client in clients
        )  # still trickling: they held connections throughout
    finally:
        stop.set()
        for client in clients:
            client.join(10)
    print(f"baseline {[round(d, 3) for d in baseline]} s; beside {SLOW_CLIENTS} slow clients "
          f"{[round(d, 3) for d in delays]} s")  # fmt: skip
    assert max(delays) < max(baseline) + 1.0, (baseline, delays)


def test_a_request_that_does_not_arrive_in_time_is_408_and_frees_nothing_it_held(tmp_path):
    sink = WebhookSink()
    daemon, url = start_serve(tmp_path, sink, http={"read_timeout_seconds": 2})
    try:
        with socket.create_connection(address(url), timeout=10) as sock:
            sock.sendall(b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            started = time.monotonic()
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            waited = time.monotonic() - started
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:200]
        assert json.loads(payload)["status"] == "error"
        assert 1.5 <= waited <= 5, waited  # the deadline, checked about once a second
        assert post(url, body(alert(xid()))).status_code == 200
    finally:
        daemon.stop()
        sink.close()


def test_malformed_and_oversized_requests_get_the_json_error_shape(slow_server):
    url = slow_server
    # gunicorn's own refusals (its parser), answered in JSON by app.serving.write_json_error
    assert_json_error(*raw(url, b"GARBAGE\r\n\r\n"), 400)
    assert_json_error(*raw(url, b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"), 414)
    assert_json_error(*raw(url, b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: x\r\n\r\n"), 400)
    # the front buffer's, before any thread reads them
    big_head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"p" * 40_000 + b"\r\n\r\n"
    assert_json_error(*raw(url, big_head), 431)
    declared = b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n"
    assert_json_error(*raw(url, declared), 413)
    chunk = b"x" * 60_000
    chunked = (
        b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
        + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20)) + b"0\r\n\r\n"
    )  # fmt: skip
    assert_json_error(*raw(url, chunked), 413)
    # and the server still serves
    assert requests.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}


def test_keepalive_and_pipelined_requests_are_each_buffered_and_answered(slow_server):
    url = slow_server
    with requests.Session() as session:  # one kept-alive connection
        for _ in range(5):
            assert session.get(f"{url}/healthz", timeout=5).status_code == 200
    two = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(address(url), timeout=10) as sock:
        sock.sendall(two)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.count(b"HTTP/1.1 200") == 2, answer[:500]


def test_expect_100_continue_is_answered_before_the_body_is_sent(slow_server):
    payload = body(alert(xid(node="node9", job="909")))
    head = (
        f"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nExpect: 100-continue\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(address(slow_server), timeout=5) as sock:
        sock.sendall(head)
        started = time.monotonic()
        assert sock.recv(1024).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert time.monotonic() - started < 1.0  # curl waits 1 s for it before sending anyway
        sock.sendall(payload)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert b"HTTP/1.1 200" in answer, answer[:300]
