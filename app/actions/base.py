"""The action contract: a small class per action with a parameter schema, ``plan`` and ``run``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from app.domain.clock import Clock, SystemClock
from app.domain.outcome import Outcome
from app.domain.params import Param, validate_params
from app.domain.states import LedgerKind

if TYPE_CHECKING:
    from app.clients import Clients
    from app.config import Settings


@dataclass(frozen=True)
class Plan:
    """What an action would do, in words and as the exact command or API call."""

    summary: str
    command: str


@dataclass
class ActionContext:
    """What ``run`` may use: settings, backend clients, the clock, and the incident it acts for."""

    settings: Settings
    clients: Clients
    clock: Clock = field(default_factory=SystemClock)
    incident_id: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # Called with (kind, message, data) for intermediate facts worth ledgering (e.g. each poll of a long action).
    record: Callable[[LedgerKind, str, Mapping[str, Any]], None] = lambda kind, message, data: None


class Action(ABC):
    """One remediation or information step.

    ``read_only`` actions (logs, queries, notifications) need no grant in the permissions whitelist.
    ``return_to_service`` actions (resume, uncordon) are never held back by the blast-radius guard.
    ``takes_out`` actions (drain, cordon, reboot) take their ``node`` parameter out of service: the blast-radius
    guard counts those nodes, and nothing else.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    params: ClassVar[Mapping[str, Param]] = {}
    read_only: ClassVar[bool] = False
    return_to_service: ClassVar[bool] = False
    takes_out: ClassVar[bool] = False
    # Which target field scopes this action in permissions.yaml (node, namespace, partition...).
    scope_keys: ClassVar[tuple[str, ...]] = ()

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Rendered parameters, checked and typed. Raises :class:`app.domain.errors.ParamError`."""
        return validate_params(self.name, self.params, raw)

    @abstractmethod
    def plan(self, params: Mapping[str, Any]) -> Plan:
        """Describe what ``run`` would do with validated ``params``; touches nothing."""

    @abstractmethod
    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        """Do it. Never raises for backend trouble: every failure is an :class:`app.domain.outcome.Outcome`."""
