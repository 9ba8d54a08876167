"""What the engine's parts share: the services wired by ``create_app`` (or by a test)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from app.actions.registry import ActionRegistry
from app.clients import Clients
from app.config import Settings
from app.domain.clock import Clock
from app.domain.permissions import Permissions
from app.domain.playbooks import Playbook, PlaybookSet
from app.metrics import Metrics
from app.store import Store, records
from app.workloads import Resolution, WorkloadResolver, with_workload


@dataclass
class EngineDeps:
    settings: Settings
    store: Store
    playbooks: PlaybookSet
    registry: ActionRegistry
    permissions: Permissions
    clients: Clients
    clock: Clock
    metrics: Metrics
    diagnose: Callable[..., Any]
    # Kubernetes: which job an alert's pod belongs to, looked up before ingestion (None: no Kubernetes here).
    workloads: WorkloadResolver | None = None

    def workload_of(self, labels: Mapping[str, str]) -> Resolution | None:
        return self.workloads.lookup(labels) if self.workloads is not None else None

    def pause_state(self, conn: Connection) -> tuple[bool, str]:
        """Whether automation is paused (settings kill switch or ``POST /api/v1/pause``), and why."""
        if self.settings.guards.kill_switch:
            return True, "kill_switch set in settings"
        pause = records.get_control(conn, "pause") or {}
        return bool(pause.get("paused")), str(pause.get("reason", ""))


@dataclass(frozen=True)
class Target:
    """A playbook's rendered target: what the incident acts on, and its idempotency key."""

    values: Mapping[str, str]
    key: str
    node: str | None
    job: str | None
    serialize_key: str | None


def render_target(
    playbook: Playbook,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    workload: Resolution | None = None,
) -> Target:
    """Raises :class:`app.domain.errors.ParamError` when a rendered target value fails its pattern. ``workload``: what
    the Kubernetes API says of the alert's pod (:mod:`app.workloads`), which names a Kubernetes target's job."""
    rendered = {
        name: value for name, value in playbook.render_target(labels, annotations).items() if value != ""
    }
    values = with_workload(rendered, workload)
    key = json.dumps(values, sort_keys=True, separators=(",", ":"))
    node = values.get("node")
    job = values.get("job")
    serialize_key = None
    if playbook.serialize == "node" and node:
        serialize_key = f"node:{node}"
    elif playbook.serialize == "job" and job:
        serialize_key = f"job:{job}"
    return Target(values=values, key=key, node=node, job=job, serialize_key=serialize_key)
