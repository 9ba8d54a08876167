"""Credentials checks for the webhook (bearer or basic) and the operator API (bearer). Constant-time compares."""

from __future__ import annotations

import base64
import binascii
import hmac
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from flask import Response, current_app, request

from app.config import Settings, WebhookSettings, read_secret
from app.errors import ConfigError

LIMITER_KEY = "nightshift.auth_failures"


@dataclass(frozen=True)
class WebhookAuth:
    token: str | None
    basic_user: str | None
    basic_password: str | None
    disabled: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookAuth:
        w = settings.webhook
        token = read_secret(w.token_file, "webhook.token_file")
        password = read_secret(w.basic_password_file, "webhook.basic_password_file")
        if bool(w.basic_user) != bool(password):
            raise ConfigError("webhook: basic_user and basic_password_file must be set together")
        if not (token or password or w.auth_disabled):
            raise ConfigError(
                "webhook: no authentication configured; set webhook.token_file (bearer) or "
                "webhook.basic_user + webhook.basic_password_file, or webhook.auth_disabled: true explicitly"
            )
        return cls(token=token, basic_user=w.basic_user, basic_password=password, disabled=w.auth_disabled)

    def check(self, header: str | None) -> bool:
        if self.disabled and not (self.token or self.basic_password):
            return True
        if not header:
            return False
        scheme, _, value = header.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and self.token:
            return same_secret(value, self.token)
        if scheme.lower() == "basic" and self.basic_password and self.basic_user:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            # Evaluate both compares so that timing does not reveal which part was wrong.
            user_ok = same_secret(user, self.basic_user)
            password_ok = same_secret(password, self.basic_password)
            return user_ok and password_ok
        return False


def check_bearer(header: str | None, token: str) -> bool:
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and same_secret(value.strip(), token)


def same_secret(given: str, expected: str) -> bool:
    """Constant-time equality of two secrets."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


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


def _client() -> str:
    # The TCP peer, not X-Forwarded-For: a header would let a guesser pick a fresh address per try.
    return request.remote_addr or "unknown"


def refuse_if_throttled() -> Response | None:
    """429 with Retry-After for an address that failed authentication too often (webhook, operator API, login)."""
    from app.web import error

    wait = current_app.extensions[LIMITER_KEY].retry_after(_client())
    if not wait:
        return None
    response = error(
        429, f"too many failed authentication attempts from {_client()}; retry in {math.ceil(wait)}s"
    )
    response.headers["Retry-After"] = str(math.ceil(wait))
    return response


def record_auth_failure() -> None:
    current_app.extensions[LIMITER_KEY].failed(_client())
