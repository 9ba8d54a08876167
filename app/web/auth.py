"""Credentials checks for the webhook (bearer or basic), the operator API (bearer) and readers (bearer, session or
a trusted proxy's user header). Constant-time compares.

Credentials are checked first, always: a request with valid credentials is never refused, whatever its address
did before. Only failures are throttled, per client address and per realm (``webhook``, ``operator``, ``viewer``),
so a client guessing the operator token does not slow down the Alertmanager that shares its address.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from flask import Response, current_app, request

from app.config import Settings, WebhookSettings, read_secret
from app.domain.errors import ConfigError

LIMITER_KEY = "nightshift.auth_failures"
# The token in examples/webhook.token: anyone who read the repository knows it.
EXAMPLE_TOKEN = "example-webhook-token-change-me"


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
        if token == EXAMPLE_TOKEN and not w.allow_example_token:
            raise ConfigError(
                f"webhook.token_file ({w.token_file}) holds the example token shipped in examples/webhook.token, "
                "which anyone can read: write a secret of your own (e.g. `openssl rand -hex 32`), or set "
                "webhook.allow_example_token: true for a local demo"
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


def bearer(header: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer <credential>`` header, else None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def same_secret(given: str, expected: str) -> bool:
    """Constant-time equality of two secrets."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class AuthFailureLimiter:
    """A token bucket per client (address and realm), spent only by failed authentication.

    Each client may fail ``burst`` times in a row; tokens come back at ``per_minute``. While a client has no
    token, a failed attempt is answered 429 with :meth:`retry_after` instead of 401. Valid credentials are checked
    before the bucket and always pass, so the limit costs a legitimate client sharing the address nothing; the
    price is that it no longer caps how fast a guesser may try: the length of the secrets does (docs/security.md
    asks for 32 random bytes). State is in memory, per gunicorn worker process, bounded to the ``max_clients``
    that failed most recently: a client forgotten has a full bucket, which is what it would have once refilled.
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


def _client(realm: str) -> str:
    # The TCP peer, not X-Forwarded-For: a header would let a guesser pick a fresh address per try.
    return f"{realm} {request.remote_addr or 'unknown'}"


def refuse_failure(realm: str) -> Response | None:
    """Count one failed authentication in ``realm``; 429 with Retry-After when the address has no try left."""
    from app.web import error

    limiter = current_app.extensions[LIMITER_KEY]
    client = _client(realm)
    wait = limiter.retry_after(client)
    if not wait:
        limiter.failed(client)
        return None
    response = error(
        429,
        f"too many failed authentication attempts from {request.remote_addr}; retry in {math.ceil(wait)}s",
    )
    response.headers["Retry-After"] = str(math.ceil(wait))
    return response


def check_operator_token(settings: Settings, webhook: WebhookAuth, operator_token: str | None) -> None:
    """Refuse at start an operator token that is the webhook's (the same file, a link to it, or the same value as
    the webhook token or basic password: whoever configures Alertmanager could then act), or the public example
    token. docs/reliability.md: the two must differ."""
    if operator_token is None:
        return
    if operator_token == EXAMPLE_TOKEN:
        raise ConfigError(
            f"operator_token_file ({settings.operator_token_file}) holds the example token shipped in "
            "examples/webhook.token: write a secret of your own"
        )
    same_file = _same_file(settings.operator_token_file, settings.webhook.token_file) or _same_file(
        settings.operator_token_file, settings.webhook.basic_password_file
    )
    if same_file or operator_token in (webhook.token, webhook.basic_password):
        raise ConfigError(
            "operator_token_file and webhook.token_file (or webhook.basic_password_file) must differ: "
            f"{settings.operator_token_file} gives the operator's power to whoever holds the webhook's secret"
        )


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
