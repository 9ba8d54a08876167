"""``POST /api/v1/alerts``: Alertmanager's webhook. Validate, record durably, answer; the worker does the rest.

200 once every alert is in the store; 400 for a payload Alertmanager must not retry; 401 without credentials;
413 over the size limit; 429 for a client address that keeps failing authentication; 503 when the store is down
(Alertmanager retries 5xx).

Authenticated deliveries are never rate limited: Alertmanager drops a notification answered 4xx, so a limit would
lose alerts, and in an alert storm, when they matter most. Only failed authentication is limited, per client
address (:class:`AuthFailureLimiter`), which bounds online guessing of the token or basic password.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from flask import Blueprint, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState

from app.alertmanager import parse_notification
from app.config import WebhookSettings
from app.errors import PayloadError
from app.web import error

bp = Blueprint("alerts", __name__)
LIMITER_KEY = "nightshift.auth_failures"


class AuthFailureLimiter:
    """A token bucket per client address, spent only by failed authentication.

    Each address may fail ``burst`` times in a row; tokens come back at ``per_minute``. While an address has no
    token, :meth:`retry_after` says how long it must wait, and the webhook answers 429 without checking its
    credentials, so a guesser gets ``burst`` tries plus ``per_minute`` a minute. State is in memory, per gunicorn
    worker process (a brake on guessing, not a precise quota), bounded to the ``max_clients`` addresses that failed
    most recently: an address forgotten has a full bucket, which is what it would have once refilled.
    """

    def __init__(
        self,
        burst: int,
        per_minute: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = 10_000,
    ):
        self.burst = burst
        self.rate = per_minute / 60.0
        self.clock = clock
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address → (tokens, at)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: WebhookSettings) -> AuthFailureLimiter:
        return cls(settings.auth_failure_burst, settings.auth_failures_per_minute)

    @property
    def enabled(self) -> bool:
        return self.burst > 0 and self.rate > 0

    def _tokens(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate)

    def retry_after(self, client: str) -> float:
        """Seconds until ``client`` may try again; 0 when it may now."""
        if not self.enabled:
            return 0.0
        with self._lock:
            tokens = self._tokens(client, self.clock())
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def failed(self, client: str) -> None:
        """Spend one of ``client``'s tokens."""
        if not self.enabled:
            return
        with self._lock:
            now = self.clock()
            self._buckets[client] = (max(0.0, self._tokens(client, now) - 1), now)
            self._buckets.move_to_end(client)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)


@bp.record_once
def _create_limiter(state: BlueprintSetupState) -> None:
    settings = state.app.extensions["nightshift"].settings.webhook
    state.app.extensions[LIMITER_KEY] = AuthFailureLimiter.from_settings(settings)


@bp.post("/api/v1/alerts")
def receive():
    services = current_app.extensions["nightshift"]
    metrics = services.metrics
    limiter: AuthFailureLimiter = current_app.extensions[LIMITER_KEY]
    # The TCP peer, not X-Forwarded-For: a header would let a guesser pick a fresh address per try.
    client = request.remote_addr or "unknown"
    wait = limiter.retry_after(client)
    if wait:
        metrics.webhook_requests.labels("429").inc()
        response = error(
            429, f"too many failed authentication attempts from {client}; retry in {math.ceil(wait)}s"
        )
        response.headers["Retry-After"] = str(math.ceil(wait))
        return response
    if not services.webhook_auth.check(request.headers.get("Authorization")):
        limiter.failed(client)
        metrics.webhook_requests.labels("401").inc()
        response = error(401, "missing or invalid credentials (Authorization: Bearer <token> or Basic)")
        response.headers["WWW-Authenticate"] = 'Bearer realm="nightshift"'
        return response
    if request.mimetype not in ("application/json", ""):
        metrics.webhook_requests.labels("415").inc()
        return error(415, f"expected Content-Type application/json, got {request.mimetype}")
    body = request.get_data(cache=False)  # MAX_CONTENT_LENGTH turns an oversized body into 413
    try:
        notification = parse_notification(body, max_alerts=services.settings.webhook.max_alerts_per_payload)
    except PayloadError as exc:
        metrics.webhook_requests.labels("400").inc()
        return error(400, str(exc))
    result = services.engine.ingest(notification)
    metrics.webhook_requests.labels("200").inc()
    return jsonify(
        {
            "status": "ok",
            "alerts": result.alerts,
            "opened": result.opened,
            "attached": result.attached,
            "closed": result.closed,
            "unmatched": result.unmatched,
        }
    )
