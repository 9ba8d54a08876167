"""app.domain.framing: where a request ends, from its bytes, and the front's refusals (the buffering worker's
decisions)."""

from __future__ import annotations

import json

import pytest

from app.domain.framing import COMPLETE, INCOMPLETE, REFUSE, json_error_response, request_state

HEAD = b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\n"


def state(data: bytes, max_header: int = 1024, max_body: int = 100) -> tuple[str, int]:
    framing = request_state(data, max_header, max_body)
    return framing.state, framing.status


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", (INCOMPLETE, 0)),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", (COMPLETE, 0)),
        (b"GET /healthz HTTP/1.1\nHost: x\n\n", (COMPLETE, 0)),  # bare LF: gunicorn judges it
        (HEAD + b"Content-Length: 5\r\n\r\n{}", (INCOMPLETE, 0)),
        (HEAD + b'Content-Length: 5\r\n\r\n{"a"}', (COMPLETE, 0)),
        (HEAD + b"content-length: 101\r\n\r\n", (REFUSE, 413)),  # refused before the body is read
        (
            HEAD + b"Content-Length: 99999999999999999999999\r\n\r\n",
            (COMPLETE, 0),
        ),  # malformed: gunicorn's 400
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", (INCOMPLETE, 0)),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", (COMPLETE, 0)),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", (COMPLETE, 0)),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n", (INCOMPLETE, 0)),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", (COMPLETE, 0)),  # malformed: gunicorn's 400
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n65\r\n", (REFUSE, 413)),  # one chunk over the limit
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"a\r\n0123456789\r\n" * 8, (REFUSE, 413)),  # summed
        (b"GET / HTTP/1.1\r\nX: " + b"p" * 2000, (REFUSE, 431)),
        (b"GET / HTTP/1.1\r\nX: " + b"p" * 2000 + b"\r\n\r\n", (REFUSE, 431)),
    ],
)
def test_request_state(data, expected):
    assert state(data) == expected


def test_every_prefix_of_a_complete_request_is_incomplete():
    whole = HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    assert state(whole) == (COMPLETE, 0)
    for cut in range(1, len(whole)):
        assert state(whole[:cut]) == (INCOMPLETE, 0), whole[:cut]


def test_json_error_response_is_a_whole_http_answer_in_the_error_shape():
    answer = json_error_response(431, "too big")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"Content-Type: application/json" in head and b"Connection: close" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body) == {"status": "error", "message": "too big"}


def test_a_head_asking_for_100_continue_is_flagged_until_its_body_is_in():
    head = HEAD + b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    assert request_state(head, 1024, 100).expect_continue
    assert not request_state(head + b"hello", 1024, 100).expect_continue  # complete: nothing to ask for
    old = head.replace(b"HTTP/1.1", b"HTTP/1.0")
    assert not request_state(old, 1024, 100).expect_continue  # HTTP/1.0 ignores the expectation
