"""What an action's run produced, as values the engine decides on by type.

Every backend error is translated into one of these at the boundary (``app/clients`` raises the exceptions of
``app.domain.errors``; ``Action.run`` maps them with :func:`outcome_from_error`), so the engine never sees a third-party
exception type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.domain import errors
from app.domain.states import StepStatus

OUTPUT_TAIL_CHARS = 4000


def tail(text: str, limit: int = OUTPUT_TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``text``, marked when cut."""
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """Common record of one action run: what was executed and what came back."""

    command: str = ""
    output: str = ""
    exit_code: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> StepStatus:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class Ok(Outcome):
    """The action did what it said."""

    @property
    def status(self) -> StepStatus:
        return StepStatus.OK


@dataclass(frozen=True, kw_only=True)
class Failed(Outcome):
    """The action did not do it and trying again will not help."""

    reason: str

    @property
    def status(self) -> StepStatus:
        return StepStatus.FAILED


@dataclass(frozen=True, kw_only=True)
class Retry(Outcome):
    """Not now (a PodDisruptionBudget, a busy node): try again after ``after`` seconds."""

    reason: str
    after: float = 30.0

    @property
    def status(self) -> StepStatus:
        return StepStatus.RETRY


@dataclass(frozen=True, kw_only=True)
class Ambiguous(Outcome):
    """We do not know whether it happened (timeout mid-command): never retried automatically."""

    reason: str

    @property
    def status(self) -> StepStatus:
        return StepStatus.AMBIGUOUS


@dataclass(frozen=True, kw_only=True)
class CredentialError(Outcome):
    """The backend rejected our credentials; the backend is marked ``credential_error``."""

    reason: str

    @property
    def status(self) -> StepStatus:
        return StepStatus.CREDENTIAL_ERROR


def outcome_from_error(exc: errors.BackendError, *, command: str = "") -> Outcome:
    """Translate a backend exception into the outcome that says what happens next."""
    match exc:
        case errors.CredentialRejected():
            return CredentialError(reason=str(exc), command=command)
        case errors.RateLimited(retry_after=after):
            return Retry(reason=str(exc), after=after, command=command)
        case errors.OutcomeUnknown():
            return Ambiguous(reason=str(exc), command=command, output=exc.output)
        case errors.Unavailable():
            # Never reached the backend: nothing happened, so a later retry is safe.
            return Retry(reason=str(exc), after=exc.retry_after, command=command)
        case _:
            return Failed(reason=str(exc), command=command, output=getattr(exc, "output", ""))
