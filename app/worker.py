"""The worker loop: claim due incidents and advance them, in a thread (``serve``) or a process (``worker``)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from app.domain.errors import StoreUnavailable
from app.engine import Engine, vitals

log = logging.getLogger(__name__)


def worker_id(kind: str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{kind}:{threading.get_ident()}"


def run_worker(engine: Engine, stop: threading.Event, poll_seconds: float, kind: str = "thread") -> None:
    """Loop until ``stop`` is set. Store outages back off and retry; nothing else escapes a tick.

    An idle worker looks again every ``poll_seconds``, or at once when a webhook accepts a notification
    (``engine.wakeup``: this process's, or any on the host when this process listens, as ``nightshift worker`` does).
    """
    me = worker_id(kind)
    log.info("worker %s started", me)
    # The SSH connection to Slurm opens in the background: a slow or unreachable host never delays the loop.
    threading.Thread(target=engine.deps.clients.warm_up, name="nightshift-ssh-warm-up", daemon=True).start()
    backoff = poll_seconds
    next_beat = 0.0  # monotonic: the heartbeat is due at once
    while not stop.is_set():
        engine.wakeup.clear()  # before looking, so that a notification accepted meanwhile cuts the wait short
        try:
            if time.monotonic() >= next_beat:
                vitals.beat(engine.deps, me)  # nightshift_worker_last_tick_timestamp_seconds
                next_beat = time.monotonic() + vitals.HEARTBEAT_SECONDS
            engine.deps.store.checkpoint()
            if engine.work_once(me):
                backoff = poll_seconds
                continue
        except StoreUnavailable as exc:
            backoff = min(backoff * 2, 30.0)
            log.warning("worker %s: %s; retrying in %.0fs", me, exc, backoff)
            stop.wait(backoff)
            continue
        engine.wakeup.wait(poll_seconds)
    log.info("worker %s stopped", me)


def start_worker_thread(engine: Engine, poll_seconds: float) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(
        target=run_worker, args=(engine, stop, poll_seconds), name="nightshift-worker", daemon=True
    )
    thread.start()
    return thread, stop
