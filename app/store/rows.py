"""Typed rows at the store boundary: what a query returns, frozen. Built from the table's columns by
:func:`from_row` (a query's columns), given to the JSON views by :meth:`as_dict`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

from app.domain.culprits import Culprit
from app.domain.states import (
    AttemptOutcome,
    IncidentKind,
    IncidentOutcome,
    RepairState,
    State,
    StepStatus,
    UndoState,
)


class _Columns:
    """A row whose columns need no conversion: built from them as they are, given back by name."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return cls(**row)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass


@dataclass(frozen=True, kw_only=True)
class Incident:
    """One incident (table ``incidents``): a job's failure episode, a node's fault, or one (playbook, target).
    Transitions (:mod:`app.engine.transitions`) return the row as they wrote it; nothing changes one in place."""

    id: int  # 0: a draft that was never stored (``nightshift explain``)
    playbook: str
    target_key: str
    target: Mapping[str, Any]
    node: str | None = None
    job: str | None = None
    kind: IncidentKind = IncidentKind.TARGET
    culprits: tuple[Culprit, ...] = ()  # the column's type (app.store.schema.Culprits) reads them
    act_after: datetime | None = None
    tick_errors: int = 0
    job_status_tries: int = 0
    finalize_tries: int = 0
    delivered: Sequence[str] | None = None
    verify_from: datetime | None = None
    open_key: str | None = None  # None once closed
    serialize_key: str | None = None
    state: State | IncidentOutcome  # an outcome once closed
    outcome: IncidentOutcome | None = None
    reason: str = ""
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    alert_starts_at: datetime
    generator_url: str = ""
    diagnosis: Mapping[str, Any] | None = None
    attempt: int = 0
    acted: bool = False
    held_by_guard: bool = False
    alert_resolved: bool = False
    on_resolved_state: UndoState | None = None
    finalize_pending: bool = False
    verify_deadline: datetime | None = None
    annotation_id: int | None = None
    opened_at: datetime
    updated_at: datetime
    closed_at: datetime | None = None
    next_run_at: datetime | None = None
    claimed_by: str | None = None
    claim_expires_at: datetime | None = None
    poked: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Incident:
        state, outcome, undo = row["state"], row["outcome"], row["on_resolved_state"]
        return cls(
            **{
                **row,
                "kind": IncidentKind(row["kind"]),
                "state": State(state) if state in _STATES else IncidentOutcome(state),
                "outcome": IncidentOutcome(outcome) if outcome is not None else None,
                "on_resolved_state": UndoState(undo) if undo is not None else None,
            }
        )

    def as_dict(self) -> dict[str, Any]:
        """The row's columns by name, as the store holds them (the JSON views' shape)."""
        columns = {name: getattr(self, name) for name in _INCIDENT_FIELDS}
        return {**columns, "culprits": [c.to_json() for c in self.culprits]}


_STATES = frozenset(State)
_INCIDENT_FIELDS = tuple(field.name for field in dataclasses.fields(Incident))


@dataclass(frozen=True)
class Attempt:
    """One execution of a playbook's steps on a target (table ``attempts``): what budgets, backoff, cooldown and
    the blast radius count."""

    id: int
    incident_id: int
    number: int
    playbook: str
    target_key: str
    node: str | None
    destructive: bool
    started_at: datetime
    finished_at: datetime | None = None
    outcome: AttemptOutcome | None = None  # None: in progress

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Attempt:
        outcome = row["outcome"]
        return cls(**{**row, "outcome": AttemptOutcome(outcome) if outcome is not None else None})


@dataclass(frozen=True)
class AlertRow(_Columns):
    """One alert instance as received (table ``alerts``): Alertmanager's fingerprint plus its startsAt."""

    id: int
    fingerprint: str
    starts_at: datetime
    status: str  # firing | resolved (a resolved instance never fires again)
    ends_at: datetime | None
    alertname: str  # a short copy for display; ``labels`` keep it whole
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    generator_url: str
    receiver: str
    group_key: str
    first_received_at: datetime
    last_received_at: datetime
    notifications: int  # deliveries of it, repeats included


@dataclass(frozen=True)
class LedgerEntry(_Columns):
    """One row of the ledger (table ``ledger``): a decision, a command with its output, an observation.
    ``kind`` stays a string: the ledger is history, and a kind an older version wrote stays readable."""

    id: int
    ts: datetime
    incident_id: int | None
    kind: str  # app.domain.states.LedgerKind, for the rows this version writes
    message: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class StepRow(_Columns):
    """One planned step of an incident's attempt and phase (table ``steps``)."""

    id: int
    incident_id: int
    attempt: int
    phase: str  # collect | steps | on_resolved
    idx: int
    name: str
    action: str
    params: Mapping[str, Any]
    status: StepStatus
    summary: str = ""
    command: str = ""
    exit_code: int | None = None
    output: str = ""
    reason: str = ""
    retries: int = 0
    approval: bool = False  # `approval: required` in the playbook
    approved_by: str | None = None
    approved_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration: float | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StepRow:
        return cls(**{**row, "status": StepStatus(row["status"])})


@dataclass(frozen=True)
class Repair:
    """A node's way through repair (table ``node_repairs``; :mod:`app.domain.repair_policy` says what comes next)."""

    id: int
    node: str
    scheduler: str
    state: RepairState
    playbook: str | None = None  # whose node_repair section plans it; None: the scheduler's defaults
    incident_id: int | None = None  # the incident that asked for it
    reason: str = ""
    open_key: str | None = None
    taken_out_by_us: bool = False
    taken_out_at: datetime | None = None
    repairs: int = 1  # this node's repairs within the lemon window, this one included
    step: str | None = None  # take_out | repair:<i> | validate | return
    step_status: StepStatus | None = None
    retries: int = 0
    steps: tuple[Mapping[str, Any], ...] = ()  # finished steps: action, command, status, output
    validation: Mapping[str, Any] | None = None
    held_reason: str | None = None
    released_by: str | None = None
    deadline: datetime | None = None
    tick_errors: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    closed_at: datetime | None = None
    next_run_at: datetime | None = None
    claimed_by: str | None = None
    claim_expires_at: datetime | None = None
    poked: bool = False  # looked at again as soon as its claimer lets go (app.store.claims)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Repair:
        status = row["step_status"]
        return cls(
            **{
                **row,
                "state": RepairState(row["state"]),
                "step_status": StepStatus(status) if status is not None else None,
                "steps": tuple(row["steps"] or ()),
            }
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "steps": [dict(s) for s in self.steps]}
