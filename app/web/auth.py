"""Credentials checks for the webhook (bearer or basic) and the operator API (bearer). Constant-time compares."""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass

from app.config import Settings, read_secret
from app.errors import ConfigError


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
