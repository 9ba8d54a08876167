"""The exception tree of Nightshift. ``app/clients`` translates third-party errors into these, once."""

from __future__ import annotations


class NightshiftError(Exception):
    """Base of every error Nightshift raises on purpose."""


class ConfigError(NightshiftError):
    """Settings, permissions or playbooks are invalid; the message says where."""


class PayloadError(NightshiftError):
    """An Alertmanager payload is malformed (HTTP 400)."""


class StoreUnavailable(NightshiftError):
    """The store cannot be reached (HTTP 503, so Alertmanager retries)."""


class InboxFull(NightshiftError):
    """The inbox holds more alerts than ``webhook.max_inbox_alerts`` (HTTP 503 with Retry-After: retried later)."""

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class ParamError(NightshiftError):
    """A rendered step parameter failed its action's schema; never passed on to a backend."""

    def __init__(self, action: str, param: str, message: str):
        super().__init__(f"{action}: parameter {param!r}: {message}")
        self.action = action
        self.param = param


class BackendError(NightshiftError):
    """A backend (Slurm, Kubernetes, Prometheus, Grafana, SMTP...) call did not succeed."""

    def __init__(self, message: str, *, output: str = ""):
        super().__init__(message)
        self.output = output


class Unavailable(BackendError):
    """The backend could not be reached at all: nothing was done."""

    def __init__(self, message: str, *, retry_after: float = 30.0, output: str = ""):
        super().__init__(message, output=output)
        self.retry_after = retry_after


class CredentialRejected(BackendError):
    """The backend refused our credentials (SSH auth failure, HTTP 401/403 on a token)."""


class NotFound(BackendError):
    """The object the step names does not exist."""


class Conflict(BackendError):
    """A concurrent change won (HTTP 409) and retries were exhausted."""


class RateLimited(BackendError):
    """The backend asked us to come back later (HTTP 429, PodDisruptionBudget)."""

    def __init__(self, message: str, *, retry_after: float = 30.0, output: str = ""):
        super().__init__(message, output=output)
        self.retry_after = retry_after


class CommandFailed(BackendError):
    """A remote command ran and exited non-zero."""

    def __init__(self, message: str, *, exit_code: int, output: str = ""):
        super().__init__(message, output=output)
        self.exit_code = exit_code


class OutcomeUnknown(BackendError):
    """The call may or may not have taken effect (timeout after sending)."""
