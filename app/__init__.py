"""Nightshift: Alertmanager webhooks in, audited and guarded remediation out.

``create_app`` and :func:`build_engine` are the only places where things are wired; importing this package does
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, Unpack

if TYPE_CHECKING:
    from flask import Flask

    from app.actions.registry import ActionRegistry
    from app.clients import Clients
    from app.config import Settings
    from app.domain.clock import Clock
    from app.domain.permissions import Permissions
    from app.domain.playbooks import PlaybookSet
    from app.engine import Engine
    from app.metrics import Metrics
    from app.store import Store
    from app.web.auth import WebhookAuth
    from app.workloads import WorkloadResolver


@dataclass
class Services:
    """What the web layer and the worker thread use; lives in ``app.extensions["nightshift"]``."""

    settings: Settings
    store: Store
    engine: Engine
    metrics: Metrics
    webhook_auth: WebhookAuth
    operator_token: str | None


class Wiring(TypedDict, total=False):
    """What a caller may give :func:`build_engine` in place of what it builds from the settings (tests, the
    benchmarks' simulated clusters, ``explain``'s store that is never read). The diagnosis is not among them: the
    engine always diagnoses with the configured confidence floor."""

    clock: Clock
    clients: Clients
    registry: ActionRegistry
    metrics: Metrics
    store: Store
    playbooks: PlaybookSet
    permissions: Permissions
    workloads: WorkloadResolver | None  # None: no pod is looked up (a test's alerts name their jobs)


def build_engine(settings: Settings, **overrides: Unpack[Wiring]) -> Engine:
    """The engine of ``settings``: its store (schema created), playbooks (their windows checked against the
    retention), permissions, clients, metrics and the diagnosis with its confidence floor, each replaced by
    ``overrides`` where given (``playbooks`` and ``permissions``: as :func:`app.preflight.preflight` loaded them).
    The one way an engine is built: by the app, the worker, the CLI, the benchmarks and the tests."""
    from app.actions import default_registry
    from app.clients import Clients
    from app.domain.clock import SystemClock
    from app.domain.diagnosis import for_settings
    from app.domain.permissions import load_permissions
    from app.domain.playbooks import load_playbooks
    from app.domain.retention import check_windows
    from app.engine import Engine, EngineDeps
    from app.metrics import Metrics
    from app.store import Store
    from app.workloads import workload_resolver

    clock = overrides["clock"] if "clock" in overrides else SystemClock()
    registry = overrides["registry"] if "registry" in overrides else default_registry()
    if "store" in overrides:
        store = overrides["store"]
    else:
        store = Store.from_url(settings.resolved_store_url, clock, settings.store)
        store.create_schema()
    clients = overrides["clients"] if "clients" in overrides else Clients(settings)
    if "playbooks" in overrides:
        playbooks = overrides["playbooks"]
    else:
        playbooks = load_playbooks(settings.playbook_paths, registry, settings.schedulers)
        check_windows(settings, playbooks.playbooks)
    deps = EngineDeps(
        settings=settings,
        store=store,
        playbooks=playbooks,
        registry=registry,
        permissions=overrides["permissions"]
        if "permissions" in overrides
        else load_permissions(settings.permissions_file, registry),
        clients=clients,
        clock=clock,
        metrics=overrides["metrics"] if "metrics" in overrides else Metrics(),
        diagnose=for_settings(settings),
        workloads=overrides["workloads"]
        if "workloads" in overrides
        else workload_resolver(settings, clients),
    )
    return Engine(deps)


def create_app(settings: Settings | None = None, **wiring: Unpack[Wiring]) -> Flask:
    """The Flask app. ``wiring``: what :func:`build_engine` takes in place of what it builds (tests)."""
    from flask import Flask

    from app import web
    from app.config import load_settings
    from app.preflight import preflight

    settings = settings or load_settings()
    checked = preflight(settings, wiring.get("registry"))
    wiring["playbooks"], wiring["permissions"] = checked.playbooks, checked.permissions
    engine = build_engine(settings, **wiring)
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
