"""Where an HTTP/1.1 request ends, from its bytes alone; and the JSON error answer written outside Flask. Pure.

:func:`request_state` is what the buffering worker (:mod:`app.serving`) asks after each read from a client: is the
request head and its whole body here (``complete``), may more come (``incomplete``), or is it to be refused before
any thread sees it (``refuse``: 431 for a head over ``max_header`` bytes, 413 for a body over ``max_body`` bytes, by
its Content-Length or, chunked, by the bytes of the chunked encoding received). It frames; it does not validate:
a malformed head or chunk size is ``complete``, and gunicorn's parser answers it 400 with everything in hand.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from http import HTTPStatus

COMPLETE, INCOMPLETE, REFUSE = "complete", "incomplete", "refuse"
MAX_CHUNK_LINE = (
    1024  # a chunk-size line (with extensions) longer than this is malformed: gunicorn answers 400
)
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


@dataclass(frozen=True)
class Framing:
    """The verdict on the bytes received so far."""

    state: str  # complete | incomplete | refuse
    status: int = 0  # refuse: the HTTP status
    message: str = ""  # refuse: why, for the JSON error
    expect_continue: bool = False  # incomplete: the head is here and asks for "100 Continue" before the body


def request_state(data: bytes, max_header: int, max_body: int) -> Framing:
    """Whether ``data`` (from the start of a request) holds one complete request. See the module docstring."""
    crlf = data.find(b"\r\n\r\n")
    lf = data.find(b"\n\n")
    ends = [(at, size) for at, size in ((crlf, 4), (lf, 2)) if at != -1]
    if not ends:
        if len(data) > max_header:
            return Framing(REFUSE, 431, f"request line and headers exceed {max_header} bytes")
        return Framing(INCOMPLETE)
    at, size = min(ends)
    if at > max_header:
        return Framing(REFUSE, 431, f"request line and headers exceed {max_header} bytes")
    body = at + size
    length, chunked, expect = _body_framing(data[:at])
    if chunked:
        framing = _chunked_state(data, body, max_body)
    elif length is None:
        return Framing(COMPLETE)
    elif length > max_body:
        return Framing(REFUSE, 413, f"request body of {length} bytes exceeds the limit of {max_body}")
    else:
        framing = Framing(COMPLETE if len(data) - body >= length else INCOMPLETE)
    if framing.state == INCOMPLETE and expect:
        return Framing(INCOMPLETE, expect_continue=True)
    return framing


def _body_framing(head: bytes) -> tuple[int | None, bool, bool]:
    """(Content-Length if one valid value is given, whether Transfer-Encoding names chunked, whether an HTTP/1.1
    request says ``Expect: 100-continue``)."""
    length: int | None = None
    chunked = False
    lines = head.split(b"\n")
    expect = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name = name.strip().lower()
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"content-length" and value.strip().isdigit() and len(value.strip()) <= 19:
            length = int(value.strip())
        elif name == b"expect" and value.strip().lower() == b"100-continue":
            expect = lines[0].rstrip().endswith(b"HTTP/1.1")
    return length, chunked, expect


def _chunked_state(data: bytes, pos: int, max_body: int) -> Framing:
    """Walk the chunks from ``pos``: complete after the last chunk and the trailers' blank line."""
    start = pos
    while True:
        if pos - start > max_body:
            return Framing(REFUSE, 413, f"chunked request body exceeds the limit of {max_body} bytes")
        line_end = data.find(b"\r\n", pos)
        if line_end == -1:
            return Framing(COMPLETE if len(data) - pos > MAX_CHUNK_LINE else INCOMPLETE)
        size_text = data[pos:line_end].split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.fullmatch(size_text):
            return Framing(COMPLETE)  # malformed: gunicorn's parser says so
        size = int(size_text, 16)
        pos = line_end + 2
        if size == 0:
            if data[pos : pos + 2] == b"\r\n":
                return Framing(COMPLETE)
            return Framing(COMPLETE if data.find(b"\r\n\r\n", pos) != -1 else INCOMPLETE)
        if size > max_body:
            return Framing(REFUSE, 413, f"chunked request body exceeds the limit of {max_body} bytes")
        pos += size + 2
        if pos > len(data):
            return Framing(INCOMPLETE)


def json_error_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response carrying ``{"status": "error", "message": ...}``; the connection closes after it."""
    body = json.dumps({"status": "error", "message": message}).encode("utf-8")
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Error"
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
