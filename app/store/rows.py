"""Typed rows at the store boundary: what a query returns, frozen. Built from the table's columns by
:func:`from_row` (a query's columns), given to the JSON views by :meth:`as_dict`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.states import RepairState, StepStatus


@dataclass(frozen=True)
class StepRow:
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

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Repair:
    """A node's way through repair (table ``node_repairs``; :mod:`app.repair_policy` says what comes next)."""

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
