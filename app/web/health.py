"""Liveness, readiness and self-metrics."""

from __future__ import annotations

from importlib import metadata

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST

from app.domain.errors import StoreUnavailable
from app.engine import vitals
from app.metrics import inbox_families, repair_families, vitals_families
from app.web import error

bp = Blueprint("health", __name__)


def _version() -> str:
    try:
        return metadata.version("nightshift")
    except metadata.PackageNotFoundError:  # run from a source tree without an install
        return "unknown"


VERSION = _version()


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
    """The process's counters, and what the store says now (app/engine/vitals.py): the inbox, held nodes, open
    incidents, credentials, the worker's last tick. A store that does not answer is ``nightshift_store_up 0``;
    the rest still answers."""
    services = current_app.extensions["nightshift"]
    deps = services.engine.deps
    try:
        found = vitals.read(deps)
    except StoreUnavailable:
        live = vitals_families(version=VERSION, store_up=False)
    else:
        live = [
            *vitals_families(
                version=VERSION,
                store_up=True,
                open_by_state=found.open_by_state,
                credentials=found.credentials,
                last_tick=found.last_tick,
            ),
            *inbox_families(found.inbox, deps.clock.now()),
            *repair_families(found.held_nodes),
        ]
    return Response(services.metrics.exposition(live), content_type=CONTENT_TYPE_LATEST)
