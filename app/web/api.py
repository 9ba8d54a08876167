"""JSON API: incidents and their ledger (read), pause/resume (operator token)."""

from __future__ import annotations

from functools import wraps
from typing import Any

from flask import Blueprint, current_app, jsonify, request

from app.web import error
from app.web.auth import check_bearer, record_auth_failure, refuse_if_throttled

bp = Blueprint("api", __name__, url_prefix="/api/v1")

FILTERS = ("state", "outcome", "playbook", "node", "job")


def operator_only(view: Any) -> Any:
    """Mutating endpoints need the operator token, distinct from the webhook's."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = current_app.extensions["nightshift"].operator_token
        if token is None:
            return error(403, "operator API disabled: set operator_token_file in the settings")
        throttled = refuse_if_throttled()
        if throttled is not None:
            return throttled
        if not check_bearer(request.headers.get("Authorization"), token):
            record_auth_failure()
            return error(401, "missing or invalid operator token")
        return view(*args, **kwargs)

    return wrapper


@bp.get("/incidents")
def list_incidents():
    engine = current_app.extensions["nightshift"].engine
    try:
        limit = min(int(request.args.get("limit", 100)), 1000)
        before = int(request.args["before"]) if "before" in request.args else None
    except ValueError:
        return error(400, "limit and before must be integers")
    filters = {name: request.args[name] for name in FILTERS if request.args.get(name)}
    rows = engine.incidents(
        limit=limit, before_id=before, open_only=request.args.get("open") == "1", **filters
    )
    return jsonify({"status": "ok", "incidents": rows})


@bp.get("/incidents/<int:incident_id>")
def get_incident(incident_id: int):
    detail = current_app.extensions["nightshift"].engine.incident(incident_id)
    if detail is None:
        return error(404, f"incident {incident_id} not found")
    return jsonify({"status": "ok", **detail})


@bp.get("/status")
def status():
    return jsonify({"status": "ok", **current_app.extensions["nightshift"].engine.status()})


def _reason() -> str:
    body = request.get_json(silent=True) or {}
    reason = body.get("reason", "") if isinstance(body, dict) else ""
    return str(reason)[:500]


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


@bp.post("/incidents/<int:incident_id>/steps/<int:step_id>/approve")
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


@bp.post("/incidents/<int:incident_id>/handled")
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


def _operator() -> str:
    """Who acted, as the operator says (free text, bounded); the token proved they may."""
    name = request.headers.get("X-Nightshift-Operator", "operator")
    return "".join(ch for ch in name if ch.isprintable())[:100] or "operator"
