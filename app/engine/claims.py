"""One claim and lease for both lifecycles (incidents, node repairs): claim the most overdue row, tick it, release it.

The claim is a lease of ``worker.lease_seconds``; while a step runs, :func:`kept` renews it every third of the lease
on the injected clock, so a long step is never taken for a dead worker's and a dead worker's claim lapses within one
lease. A tick that raises is the caller's to count (``failed``: incidents and repairs both go to a person after
``worker.max_tick_errors`` in a row); a bug or an outage never kills the worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Generic, TypeVar

from sqlalchemy import Connection

from app.domain.errors import StoreUnavailable
from app.engine.deps import EngineDeps
from app.store.claims import Queue

log = logging.getLogger(__name__)

Row = TypeVar("Row")


class Schedule(Enum):
    """A tick's answer when its own transition wrote the row's next look."""

    WRITTEN = "written"


Next = datetime | None | Schedule  # when to look at the row again (None: not until something schedules it)


@dataclass(frozen=True)
class Claim:
    """A worker's hold on one row of a queue (a claimed row's id and ``claimed_by``)."""

    queue: Queue
    row_id: int
    worker: str


@dataclass(frozen=True)
class Lifecycle(Generic[Row]):
    """What :func:`work_once` needs of a lifecycle: its queue, how to read a claimed row, one tick, and what a
    failed tick does (count it, and hand the row to a person at the bound)."""

    queue: Queue
    load: Callable[[Connection, int], Row | None]
    tick: Callable[[Row], Next]
    failed: Callable[[Row, Exception], Next]


def lease(deps: EngineDeps) -> timedelta:
    return timedelta(seconds=deps.settings.worker.lease_seconds)


def work_once(deps: EngineDeps, lifecycle: Lifecycle[Row], worker: str) -> int | None:
    """Claim one due row, tick it, release it. Returns its id, or None when none is due."""
    queue = lifecycle.queue
    now = deps.clock.now()
    with deps.store.read() as conn:
        if not queue.any_due(conn, now):
            return None
    with deps.store.transaction() as conn:
        row_id = queue.claim_next(conn, worker, now, lease(deps))
        row = lifecycle.load(conn, row_id) if row_id is not None else None
    if row_id is None or row is None:
        return None
    try:
        following = lifecycle.tick(row)
    except Exception as exc:  # a bug or an outage must not kill the worker
        log.exception("%s %s: tick failed", queue.name, row_id)
        following = lifecycle.failed(row, exc)
    with deps.store.transaction() as conn:
        if isinstance(following, Schedule):
            queue.release(conn, row_id, worker, deps.clock.now())
        else:
            queue.release_to(conn, row_id, worker, following, deps.clock.now())
    return row_id


@contextmanager
def kept(deps: EngineDeps, claim: Claim) -> Iterator[None]:
    """Renew ``claim`` every third of the lease (at least every second) of the injected clock while the block runs."""
    stop = threading.Event()
    seconds = deps.settings.worker.lease_seconds

    def beat() -> None:
        while not deps.clock.wait(stop, max(1.0, seconds / 3)):
            until = deps.clock.now() + timedelta(seconds=seconds)
            try:
                with deps.store.transaction() as conn:
                    claim.queue.renew(conn, claim.row_id, claim.worker, until)
            except StoreUnavailable as exc:
                log.warning("%s %s: lease renewal failed: %s", claim.queue.name, claim.row_id, exc)

    heart = threading.Thread(target=beat, name=f"lease-{claim.queue.name}-{claim.row_id}", daemon=True)
    heart.start()
    try:
        yield
    finally:
        stop.set()
        heart.join(timeout=seconds)  # a renewal in flight is bounded by the store's own timeouts
