"""JSON API: incidents and their ledger, node repairs, fleet incidents (read: any reader, :mod:`app.web.access`),
pause/resume, approve, handled, a node's release/hold and a fleet incident's release (the operator token).

Bounds: ``limit`` 1..1000 (default 100), ``before`` and path ids 1..2**63-1 (a path id outside is 404), filter
values at most 255 characters, ``reason`` 500 printable characters, the operator's name 100; the checkpoint
advice's ``gpus_per_node`` 1..64 and its job names by the scheduler's patterns; a fleet incident's key
(``storage_io``, ``switch:leaf1``) at most 240 characters of ``[a-z_]`` then ``:`` and a domain name.
"""

from __future__ import annotations

import re
from functools import wraps
from typing import Any

from flask import Blueprint, abort, current_app, jsonify, request

from app.domain import schedulers
from app.domain.checkpoint_advice import NoAdvice
from app.domain.params import NODE_NAME
from app.domain.states import IncidentOutcome, State
from app.engine import checkpoint_facts
from app.web import MAX_ID, error, header_text, int_arg, plain_text
from app.web.access import VIEWER, read_access, read_refusal
from app.web.auth import bearer, refuse_failure, same_secret

bp = Blueprint("api", __name__, url_prefix="/api/v1")

FILTERS = ("state", "outcome", "playbook", "node", "job")
FLEET_KEY = re.compile(r"[a-z_]{1,40}(?::[A-Za-z0-9._-]{1,200})?")
MAX_LIMIT = 1000
MAX_FILTER = 255


@bp.before_request
def _readers_only():
    """Reads need a reader; the operator's endpoints check the operator token themselves."""
    view = current_app.view_functions.get(request.endpoint or "")
    return None if getattr(view, "operator_only", False) else read_refusal()


def operator_only(view: Any) -> Any:
    """Mutating endpoints need the operator token, distinct from the webhook's."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = current_app.extensions["nightshift"].operator_token
        if token is None:
            return error(403, "operator API disabled: set operator_token_file in the settings")
        credential = bearer(request.headers.get("Authorization"))
        if credential is not None and read_access().token_role(credential) == VIEWER:
            # Valid credentials, the wrong role: 403 (not an authentication failure, never throttled).
            return error(403, "the viewer token may read but not act: this endpoint needs the operator token")
        if credential is None or not same_secret(credential, token):
            return refuse_failure("operator") or error(401, "missing or invalid operator token")
        return view(*args, **kwargs)

    wrapper.operator_only = True  # type: ignore[attr-defined]
    return wrapper


@bp.get("/incidents")
def list_incidents():
    engine = current_app.extensions["nightshift"].engine
    limit = int_arg("limit", 100, 1, MAX_LIMIT)
    before = int_arg("before", None, 1, MAX_ID)
    filters = {name: request.args[name] for name in FILTERS if request.args.get(name)}
    for name, value in filters.items():
        if len(value) > MAX_FILTER:
            abort(400, f"{name}: longer than {MAX_FILTER} characters")
    # A closed incident's state is its outcome.
    for name, vocabulary in (("state", (*State, *IncidentOutcome)), ("outcome", tuple(IncidentOutcome))):
        known = [member.value for member in vocabulary]
        if name in filters and filters[name] not in known:
            abort(400, f"{name}: unknown {name} {filters[name]!r} (known: {', '.join(known)})")
    rows = engine.incidents(
        limit=limit, before_id=before, open_only=request.args.get("open") == "1", **filters
    )
    return jsonify({"status": "ok", "incidents": rows})


@bp.get("/incidents/<id:incident_id>")
def get_incident(incident_id: int):
    detail = current_app.extensions["nightshift"].engine.incident(incident_id)
    if detail is None:
        return error(404, f"incident {incident_id} not found")
    return jsonify({"status": "ok", **detail})


@bp.get("/checkpoint-advice")
def checkpoint_advice():
    """The checkpoint interval that minimises a job's expected lost time (app/domain/checkpoint_advice.py), from the
    failures Nightshift measured and the job's progress markers. ``scheduler`` (slurm | kubernetes), ``job`` (a
    Slurm job id, or the ``train_job`` on Kubernetes), ``namespace`` (Kubernetes), ``gpus_per_node`` 1..64
    (default 8)."""
    found = checkpoint_facts.job_identity(
        request.args.get("scheduler", schedulers.DEFAULT.name), request.args
    )
    if isinstance(found, str):
        return error(400, found)
    scheduler, identity = found
    gpus_per_node = int_arg(
        "gpus_per_node", checkpoint_facts.DEFAULT_GPUS_PER_NODE, 1, checkpoint_facts.MAX_GPUS_PER_NODE
    )
    deps = current_app.extensions["nightshift"].engine.deps
    advice = checkpoint_facts.job_advice(deps, scheduler, identity, gpus_per_node)
    if isinstance(advice, NoAdvice):
        return jsonify(
            {"status": "ok", "scheduler": scheduler.name, **identity, "advice": None, "reason": advice.reason}
        )
    return jsonify({"status": "ok", "scheduler": scheduler.name, **identity, "advice": advice.as_dict()})


@bp.get("/status")
def status():
    return jsonify({"status": "ok", **current_app.extensions["nightshift"].engine.status()})


def _reason() -> str:
    body = request.get_json(silent=True) or {}
    reason = body.get("reason", "") if isinstance(body, dict) else ""
    return plain_text(str(reason), 500)


@bp.post("/pause")
@operator_only
def pause():
    value = current_app.extensions["nightshift"].engine.set_paused(True, _reason(), by=_operator())
    return jsonify({"status": "ok", **value})


@bp.post("/resume")
@operator_only
def resume():
    value = current_app.extensions["nightshift"].engine.set_paused(False, _reason(), by=_operator())
    return jsonify({"status": "ok", **value})


@bp.post("/incidents/<id:incident_id>/steps/<id:step_id>/approve")
@operator_only
def approve(incident_id: int, step_id: int):
    engine = current_app.extensions["nightshift"].engine
    try:
        incident = engine.approve_step(incident_id, step_id, by=_operator())
    except LookupError as exc:
        return error(404, str(exc))
    except ValueError as exc:
        return error(409, str(exc))
    return jsonify({"status": "ok", "incident": incident})


@bp.post("/incidents/<id:incident_id>/handled")
@operator_only
def handled(incident_id: int):
    engine = current_app.extensions["nightshift"].engine
    try:
        detail = engine.mark_handled(incident_id, by=_operator(), note=_reason())
    except LookupError as exc:
        return error(404, str(exc))
    except ValueError as exc:
        return error(409, str(exc))
    return jsonify({"status": "ok", **detail})


@bp.get("/nodes")
def list_nodes():
    """Every node's latest repair, and the nodes held for a person with why."""
    limit = int_arg("limit", 200, 1, MAX_LIMIT)
    return jsonify({"status": "ok", **current_app.extensions["nightshift"].engine.repairs.nodes(limit)})


@bp.get("/nodes/<node>")
def get_node(node: str):
    repairs = current_app.extensions["nightshift"].engine.repairs.node(_node_name(node))
    if repairs["current"] is None:
        return error(404, f"node {node} has no repair")
    return jsonify({"status": "ok", **repairs})


@bp.post("/nodes/<node>/release")
@operator_only
def release_node(node: str):
    """A held node back to the worker: what we took out is returned to service (resume/uncordon)."""
    engine = current_app.extensions["nightshift"].engine
    try:
        detail = engine.repairs.release(_node_name(node), by=_operator(), note=_reason())
    except LookupError as exc:
        return error(404, str(exc))
    except ValueError as exc:
        return error(409, str(exc))
    return jsonify({"status": "ok", **detail})


@bp.post("/nodes/<node>/hold")
@operator_only
def hold_node(node: str):
    """Hold a node: its repair stops where it is, or (none open) no later request repairs or returns it.
    Body: ``{"reason": ..., "scheduler": <one of app.domain.schedulers.NAMES>}`` (scheduler: for a node with no repair
    yet; default :func:`app.engine.scheduler_backends.hold_default`)."""
    engine = current_app.extensions["nightshift"].engine
    body = request.get_json(silent=True) or {}
    scheduler = body.get("scheduler") if isinstance(body, dict) else None
    if scheduler is not None and scheduler not in schedulers.NAMES:
        return error(400, f"scheduler: one of {', '.join(schedulers.NAMES)}")
    try:
        detail = engine.repairs.hold(_node_name(node), by=_operator(), note=_reason(), scheduler=scheduler)
    except ValueError as exc:
        return error(409, str(exc))
    return jsonify({"status": "ok", **detail})


@bp.get("/fleet")
def list_fleet():
    """The newest ``limit`` fleet incidents (one shared cause for many jobs; a cause's current one and its earlier
    ones), newest first: why, how the cause is checked, whether it cleared, and up to ``limit`` of its job incidents
    each (state and why); and the topology in use (its sources, size, when it was read, why a read was refused)."""
    limit = int_arg("limit", 100, 1, MAX_LIMIT)
    fleet = current_app.extensions["nightshift"].engine.fleet
    return jsonify({"status": "ok", "fleet": fleet.fleet_incidents(limit), "topology": fleet.source.view()})


@bp.post("/fleet/<key>/release")
@operator_only
def release_fleet(key: str):
    """A person says the shared cause is over: the held jobs restart (after their jitter). Body: ``{"reason"}``."""
    if not FLEET_KEY.fullmatch(key):
        return error(400, f"key: {key[:100]!r} is not a fleet incident key")
    fleet = current_app.extensions["nightshift"].engine.fleet
    try:
        record = fleet.release(key, by=_operator(), note=_reason())
    except LookupError as exc:
        return error(404, str(exc))
    except ValueError as exc:
        return error(409, str(exc))
    return jsonify({"status": "ok", "fleet": record.as_json()})


def _node_name(node: str) -> str:
    """A node name as in a playbook target (``app.domain.params.NODE_NAME``, at most 253 characters), else 400."""
    if not re.fullmatch(NODE_NAME, node):
        abort(400, f"node: {node[:100]!r} is not a node name")
    return node


def _operator() -> str:
    """Who acted, as the operator says (free text, bounded); the token proved they may."""
    return header_text(request.headers.get("X-Nightshift-Operator", "operator"), 100) or "operator"
