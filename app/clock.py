"""Time, injectable: everything that reads the clock takes a :class:`Clock`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def epoch_ms(moment: datetime) -> int:
    """Epoch milliseconds, as Grafana wants them."""
    return int(moment.timestamp() * 1000)
