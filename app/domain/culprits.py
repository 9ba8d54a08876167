"""A culprit: a node named as the cause of an incident's failure, and by whom. Pure: no I/O.

A job incident names its culprits as its alerts and its diagnosis point at them
(:func:`app.domain.episodes.add_culprit`) and confirms them against the job's allocation
(:func:`app.domain.episodes.confirm`); a node incident's one culprit is its node, with the repair it was handed to
(``repair_id``). The store keeps them as a JSON list in ``incidents.culprits`` (:meth:`Culprit.to_json`,
:meth:`Culprit.from_json`; :class:`app.store.schema.Culprits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Culprit:
    """One node named as a cause of an incident's failure."""

    node: str
    source: str  # what named it: an alert ("GpuXidError on node2"), "diagnosis", "lost peer"; "alert": a node incident
    reason: str  # what that source says of it ("xid=79 gpu=3", the diagnosis' summary)
    playbook: str | None = None  # the node-scoped playbook that named it (its node_repair plans the repair)
    confirmed: bool | None = None  # in the job's allocation; None: not checked yet; False: evidence only
    repair_id: int | None = None  # a node incident's: the repair its node was handed to

    def to_json(self) -> dict[str, Any]:
        """The column's form, key for key what earlier versions wrote: a job incident's culprit
        ``{node, source, reason, playbook, confirmed}``, a node incident's ``{node, source, reason, confirmed,
        repair_id}`` (no playbook key when it names none)."""
        row: dict[str, Any] = {"node": self.node, "source": self.source, "reason": self.reason}
        if self.playbook is not None or self.repair_id is None:
            row["playbook"] = self.playbook
        row["confirmed"] = self.confirmed
        if self.repair_id is not None:
            row["repair_id"] = self.repair_id
        return row

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Culprit:
        """A culprit as any version stored it: a key it did not write takes its default (versions before the
        playbook named culprits wrote ``{node, source, reason, confirmed}``), a key this one does not know is
        ignored. ``node`` is required: every version wrote it."""
        return cls(
            node=row["node"],
            source=row.get("source", ""),
            reason=row.get("reason", ""),
            playbook=row.get("playbook"),
            confirmed=row.get("confirmed"),
            repair_id=row.get("repair_id"),
        )
