"""``GET /api/v1/sd/training``: Prometheus HTTP service discovery (``http_sd_configs``) of the progress endpoints
of running Slurm jobs (:mod:`app.clients.slurm_discovery`, convention in docs/slurm.md).

Readers only (:mod:`app.web.access`: the viewer or operator token as Prometheus's ``authorization``). The answer
is cached per process for ``slurm.discovery_cache_seconds`` so Prometheus servers polling every few seconds cost
one SSH exec per window. The SSH round trip never runs on a request thread: a stale cache starts one refresh on a
background thread and the request answers at once (the stale value, or 503 before the first value and after a
failed refresh, which is retried after its backoff). A running job
without a port is logged once per process (and again only after it has left the queue and come back), never per
request. Slurm unreachable or failing: 503 with the reason (Prometheus keeps the targets it had).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, current_app, jsonify

from app.clients.slurm_discovery import Discovered, discover
from app.domain.errors import BackendError, ConfigError, Unavailable
from app.web import error
from app.web.access import read_refusal

log = logging.getLogger(__name__)
bp = Blueprint("sd", __name__, url_prefix="/api/v1/sd")
CACHE_KEY = "nightshift.sd_cache"
# Every job id ever logged as portless is remembered at most this long a list (bounded; a job that left the
# queue is forgotten at the next refresh anyway).
MAX_REMEMBERED = 100_000
# Longest wait between two refreshes after failures (the backoff doubles from the cache's ttl).
MAX_BACKOFF = 60.0


def in_background(refresh: Callable[[], None]) -> None:
    """Run ``refresh`` on its own daemon thread (never a request's)."""
    threading.Thread(target=refresh, name="nightshift-sd-refresh", daemon=True).start()


class DiscoveryCache:
    """One :class:`Discovered` per ``ttl`` seconds, refreshed off the request threads: ``spawn`` runs each refresh
    (a background thread; tests run it when they choose), one at a time."""

    def __init__(
        self,
        ttl: float,
        fetch: Callable[[], Discovered],
        clock: Callable[[], float] = time.monotonic,
        spawn: Callable[[Callable[[], None]], None] = in_background,
    ):
        self.ttl = ttl
        self.fetch = fetch
        self.clock = clock
        self.spawn = spawn
        self._lock = threading.Lock()  # held for bookkeeping only, never across a fetch
        self._refreshing = False
        self._value: Discovered | None = None
        self._at = 0.0
        self._logged: set[str] = set()
        self._failure: BackendError | ConfigError | None = None
        self._failures = 0
        self._retry_at = 0.0

    def get(self) -> Discovered:
        """Answers at once, never running a fetch itself: the cached value while fresh. Stale, it starts a
        background refresh (unless one runs, or a failed one's backoff has not passed) and answers with the stale
        value; with the last refresh's error (Unavailable, say) when that refresh failed; Unavailable when there
        is no value yet. A failed refresh is retried after a backoff doubling per failure from ``ttl`` (at most
        :data:`MAX_BACKOFF` seconds), so a login node that accepts TCP and never speaks SSH costs one stuck
        background refresh per backoff and holds no request."""
        with self._lock:
            now = self.clock()
            if self._value is not None and now - self._at < self.ttl:
                return self._value
            start = not self._refreshing and now >= self._retry_at
            self._refreshing = self._refreshing or start
            value, failure = self._value, self._failure
        if start:
            self.spawn(self._refresh)
        if failure is not None:
            raise failure
        if value is not None:
            return value
        raise Unavailable("slurm discovery: the first refresh is still running; try again shortly")

    def _refresh(self) -> None:
        try:
            value = self.fetch()
        except (BackendError, ConfigError) as exc:
            with self._lock:
                self._failures += 1
                self._failure = exc
                self._retry_at = self.clock() + min(self.ttl * 2**self._failures, MAX_BACKOFF)
                self._refreshing = False
            log.warning("slurm discovery: refresh failed: %s", exc)
            return
        except BaseException:
            with self._lock:
                self._refreshing = False
            raise
        self._log_new(value)
        with self._lock:
            self._failure, self._failures = None, 0
            self._value, self._at = value, self.clock()
            self._refreshing = False

    def _log_new(self, found: Discovered) -> None:
        running = set(found.without_port) | set(found.ambiguous)
        self._logged &= running  # forget jobs that left, so a job id reused later is logged again
        for job in found.without_port:
            if job not in self._logged:
                log.info(
                    "slurm job %s runs without nightshift.progress_port=<port> in its comment: not discovered",
                    job,
                )
        for job in found.ambiguous:
            if job not in self._logged:
                log.warning("slurm job %s: its comment forges another squeue line; not discovered", job)
        if len(self._logged | running) <= MAX_REMEMBERED:
            self._logged |= running


def _cache() -> DiscoveryCache:
    cache = current_app.extensions.get(CACHE_KEY)
    if cache is None:
        services = current_app.extensions["nightshift"]
        clients = services.engine.deps.clients
        fresh = DiscoveryCache(
            services.settings.slurm.discovery_cache_seconds, lambda: discover(clients.slurm)
        )
        cache = current_app.extensions.setdefault(CACHE_KEY, fresh)  # two first requests: one cache wins
    return cache


@bp.before_request
def _readers_only() -> Any:
    return read_refusal()


@bp.get("/training")
def training() -> Response:
    if not current_app.extensions["nightshift"].settings.slurm.host:
        return error(404, "no Slurm backend configured (slurm.host): nothing to discover")
    try:
        found = _cache().get()
    except (BackendError, ConfigError) as exc:
        return error(503, f"slurm discovery failed: {exc}")
    return jsonify(found.groups)
