"""Assertions on bounded waits, shared by the SQLite and PostgreSQL store tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from app.domain.errors import StoreUnavailable

MARGIN_S = 1.5  # what a bounded wait may overrun its timeout by on a loaded 2-core machine


@contextmanager
def store_unavailable_after(timeout_s: float, match: str = "store") -> Iterator[None]:
    """The block raises StoreUnavailable (message matching ``match``) once ``timeout_s`` has passed, not before,
    and not much later."""
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=match):
        yield
    elapsed = time.monotonic() - started
    assert timeout_s * 0.95 <= elapsed < timeout_s + MARGIN_S, (
        f"gave up after {elapsed:.2f} s, timeout {timeout_s} s"
    )
