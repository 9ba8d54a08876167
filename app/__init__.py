"""Nightshift: Alertmanager webhooks in, audited and guarded remediation out.

``create_app`` is the only place where things are wired; importing this package does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Flask

    from app.actions.registry import ActionRegistry
    from app.clients import Clients
    from app.clock import Clock
    from app.config import Settings
    from app.engine import Engine
    from app.metrics import Metrics
    from app.permissions import Permissions
    from app.playbooks import PlaybookSet
    from app.store import Store
    from app.web.auth import WebhookAuth


@dataclass
class Services:
    """What the web layer and the worker thread use; lives in ``app.extensions["nightshift"]``."""

    settings: Settings
    store: Store
    engine: Engine
    metrics: Metrics
    webhook_auth: WebhookAuth
    operator_token: str | None


def build_engine(
    settings: Settings,
    *,
    clock: Clock | None = None,
    clients: Clients | None = None,
    registry: ActionRegistry | None = None,
    metrics: Metrics | None = None,
    playbooks: PlaybookSet | None = None,
    permissions: Permissions | None = None,
) -> Engine:
    """Store, playbooks, permissions, clients and metrics wired into an engine (used by the app and the CLI).
    ``playbooks`` and ``permissions``: as :func:`app.preflight.preflight` loaded them (else loaded here)."""
    from app.actions import default_registry
    from app.clients import Clients
    from app.clock import SystemClock
    from app.diagnosis import for_settings
    from app.engine import Engine, EngineDeps
    from app.metrics import Metrics
    from app.permissions import load_permissions
    from app.playbooks import load_playbooks
    from app.retention import check_windows
    from app.store import Store
    from app.workloads import workload_resolver

    clock = clock or SystemClock()
    registry = registry or default_registry()
    store = Store.from_url(settings.resolved_store_url, clock, settings.store)
    store.create_schema()
    clients = clients or Clients(settings)
    if playbooks is None:
        playbooks = load_playbooks(settings.playbook_paths, registry, settings.schedulers)
        check_windows(settings, playbooks.playbooks)
    if permissions is None:
        permissions = load_permissions(settings.permissions_file, registry)
    deps = EngineDeps(
        settings=settings,
        store=store,
        playbooks=playbooks,
        registry=registry,
        permissions=permissions,
        clients=clients,
        clock=clock,
        metrics=metrics or Metrics(),
        diagnose=for_settings(settings),
        workloads=workload_resolver(settings, clients),
    )
    return Engine(deps)


def create_app(settings: Settings | None = None, **wiring: object) -> Flask:
    """The Flask app. ``wiring`` overrides clock, clients, registry or metrics (tests)."""
    from flask import Flask

    from app import web
    from app.config import load_settings
    from app.preflight import preflight

    settings = settings or load_settings()
    checked = preflight(settings, wiring.get("registry"))  # type: ignore[arg-type]
    engine = build_engine(
        settings,
        playbooks=checked.playbooks,
        permissions=checked.permissions,
        **wiring,  # type: ignore[arg-type]
    )
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.webhook.max_body_bytes
    app.extensions["nightshift"] = Services(
        settings=settings,
        store=engine.deps.store,
        engine=engine,
        metrics=engine.deps.metrics,
        webhook_auth=checked.webhook_auth,
        operator_token=checked.operator_token,
    )
    web.register(app)
    return app
