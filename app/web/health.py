"""Liveness, readiness and self-metrics."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST

from app.errors import StoreUnavailable
from app.metrics import inbox_families, repair_families
from app.web import error

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    """Alive: the process answers HTTP. Never touches the store, so a store outage does not get the process
    restarted (readiness takes it out of the load balancer instead)."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    """Ready when the store takes a write (a small commit within the store's lock timeout; on SQLite, free disk
    space too): 503 with the reason otherwise. Backend credential health is reported, not gating: advisory mode
    needs none."""
    services = current_app.extensions["nightshift"]
    try:
        services.store.check_writable()
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
    services = current_app.extensions["nightshift"]
    try:
        live = inbox_families(services.engine.inbox_stats(), services.engine.deps.clock.now())
        live += repair_families(services.engine.repairs.held())
    except StoreUnavailable:
        live = []  # the process's own counters still answer; readyz reports the store
    return Response(services.metrics.exposition(live), content_type=CONTENT_TYPE_LATEST)
