"""Time, injectable: everything that reads the clock takes a :class:`Clock`."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait until ``stop`` is set (True) or ``seconds`` of this clock have passed (False)."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(seconds)


def epoch_ms(moment: datetime) -> int:
    """Epoch milliseconds, as Grafana wants them."""
    return int(moment.timestamp() * 1000)
