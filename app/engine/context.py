"""What playbook templates may reference, built one way for incidents' steps and for node repairs' steps.

A value the diagnosis left empty (None) renders as ``""`` in both, never as ``"None"``; lists and mappings of the
diagnosis (its evidence) are not template values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.store.rows import Incident, Repair

Context = dict[str, Mapping[str, Any]]


def diagnosis_values(diagnosis: Mapping[str, Any] | None) -> dict[str, str]:
    """The diagnosis's scalar fields as template strings."""
    return {
        k: "" if v is None else str(v) for k, v in (diagnosis or {}).items() if not isinstance(v, list | dict)
    }


def template_context(
    inc: Incident, external_url: str, exclude: Sequence[str] = (), returned: Sequence[str] = ()
) -> Context:
    """An incident's steps: labels, annotations, target, diagnosis, incident. ``incident.culprits`` is the
    comma-separated list of nodes the recovery excludes ("" when none); ``incident.returned`` the nodes Nightshift
    excluded from the job before that are back in service (app/domain/exclusions.py), dropped from its exclusions."""
    incident_id = str(inc.id or "")  # "" for a draft never stored (nightshift explain)
    return {
        "labels": inc.labels,
        "annotations": inc.annotations,
        "target": inc.target,
        "diagnosis": diagnosis_values(inc.diagnosis),
        "incident": {
            "id": incident_id,
            "playbook": inc.playbook,
            "url": f"{external_url.rstrip('/')}/incidents/{incident_id}",
            "culprits": ",".join(exclude),
            "returned": ",".join(n for n in returned if n not in exclude),
        },
    }


def repair_context(repair: Repair, incident: Incident | None, node: Mapping[str, str]) -> Context:
    """A node repair's steps: ``node`` (name, repair id, scheduler, reason) and the requesting incident's labels,
    annotations, target and diagnosis (empty without one)."""
    return {
        "node": node,
        "labels": incident.labels if incident is not None else {},
        "annotations": incident.annotations if incident is not None else {},
        "target": incident.target if incident is not None else {},
        "diagnosis": diagnosis_values(incident.diagnosis if incident is not None else None),
        "incident": {"id": str(repair.incident_id or ""), "playbook": repair.playbook or ""},
    }
