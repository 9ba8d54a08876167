"""Liveness, readiness and self-metrics."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST

from app.errors import StoreUnavailable
from app.web import error

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    """Ready when the store answers. Backend credential health is reported, not gating: advisory mode needs none."""
    services = current_app.extensions["nightshift"]
    try:
        services.store.ping()
        status = services.engine.status()
    except StoreUnavailable as exc:
        return error(503, str(exc))
    return jsonify(
        {
            "status": "ok",
            "store": "ok",
            "playbooks": status["playbooks"],
            "paused": status["paused"],
            "credentials": status["credentials"],
        }
    )


@bp.get("/metrics")
def metrics():
    return Response(
        current_app.extensions["nightshift"].metrics.exposition(), content_type=CONTENT_TYPE_LATEST
    )
