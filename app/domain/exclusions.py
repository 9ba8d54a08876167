"""Exclusions that shrink: which nodes Nightshift kept a job off are back in service. Pure: no I/O.

A job's exclusion list (Slurm ``ExcNodeList``, a Kubernetes ``kubernetes.io/hostname NotIn``) holds the culprits
of its recent episodes while they are out of service. On the job's next recovery, Nightshift drops from it every
node it added itself that is back in service (the playbook's ``return_nodes: "{{ incident.returned }}"``).

Ours and someone else's are told apart when the node is added: the recovery step records the nodes it added that
were *not* already on the job's list (``job_exclusions``, one row per job and node); a node already there was
excluded by someone else, and Nightshift never drops it. (A person who excludes by hand a node Nightshift had added
before cannot be told apart: it is dropped once back in service; drain it to keep every job off it.)

Back in service means both: the node's latest repair since it was excluded ended with the node in service (Nightshift
validated and returned it, or a person released it: ``returned``, ``released``), and the scheduler says so now
(Slurm: not drained or down; Kubernetes: schedulable and Ready). Anything else keeps it excluded: no repair (an
advisory one, or a straggler excluded without repair), a repair still open, held or someone else's, the scheduler
saying it is out, or the scheduler not answering.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from app.domain.states import RepairState

IN_SERVICE_AFTER_REPAIR = frozenset({RepairState.RETURNED, RepairState.RELEASED})


@dataclass(frozen=True)
class Excluded:
    """A node Nightshift added to a job's exclusion list, and what is known of it now."""

    node: str
    added_at: datetime
    repair: RepairState | None = None  # its latest repair requested since it was added (None: none)
    in_service: bool | None = None  # the scheduler's word (None: not asked, or no answer)


def back_in_service(node: Excluded) -> bool:
    """Whether the job may run on ``node`` again (see the module's rule)."""
    return node.repair in IN_SERVICE_AFTER_REPAIR and node.in_service is True


def returned(nodes: Iterable[Excluded]) -> tuple[str, ...]:
    """The nodes to drop from the job's exclusion list, sorted."""
    return tuple(sorted(n.node for n in nodes if back_in_service(n)))
