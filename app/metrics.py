"""Self-metrics, declared once, with bounded labels (never a fingerprint or incident id).

Under gunicorn, ``PROMETHEUS_MULTIPROC_DIR`` is set by ``nightshift serve`` before any worker imports
prometheus_client; ``/metrics`` then aggregates every worker's files with a registry built per request.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.domain.schedulers import CREDENTIAL_STATES, NAMES
from app.domain.states import REPAIR_SETTLED, IncidentOutcome, State

STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Created at zero up front: a counter series that first appears at 1 reads as increase() == 0 on dashboards.
OUTCOMES = tuple(IncidentOutcome)
ALERT_STATUSES = ("firing", "resolved")
# How node repairs settle (app.domain.states.REPAIR_SETTLED): the values of nightshift_node_repairs' one label.
REPAIR_OUTCOMES = tuple(sorted(str(state) for state in REPAIR_SETTLED))
OPEN_STATES = tuple(str(state) for state in State)  # nightshift_open_incidents' label values
BACKENDS = NAMES  # nightshift_backend_credentials' backend label: the schedulers
# The tables retention deletes from (app/store/retention.py): the values of nightshift_pruned_rows' one label.
PRUNED_TABLES = (
    "alerts",
    "inbox",
    "inbox_alerts",
    "job_exclusions",
    "incidents",
    "incident_alerts",
    "attempts",
    "steps",
    "ledger",
    "node_repairs",
)


class Metrics:
    """The metric families of one app. Tests pass their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.alerts_received = Counter(
            "nightshift_alerts_received", "Alerts received at the webhook, by status.", ["status"], registry=r
        )
        self.webhook_requests = Counter(
            "nightshift_webhook_requests", "Webhook requests, by HTTP status code.", ["code"], registry=r
        )
        self.alerts_truncated = Counter(
            "nightshift_alerts_truncated",
            "Alerts Alertmanager left out of the notifications it sent (its max_alerts: truncatedAlerts).",
            registry=r,
        )
        self.incidents_opened = Counter(
            "nightshift_incidents_opened", "Incidents opened, by playbook.", ["playbook"], registry=r
        )
        self.incidents = Counter(
            "nightshift_incidents",
            "Incidents closed, by outcome: closings only (opened: nightshift_incidents_opened_total; open now: "
            "nightshift_open_incidents).",
            ["outcome"],
            registry=r,
        )
        self.guard_verdicts = Counter(
            "nightshift_guard_verdicts",
            "Guard verdicts, by guard and decision.",
            ["guard", "decision"],
            registry=r,
        )
        self.step_duration = Histogram(
            "nightshift_step_duration_seconds",
            "Duration of executed steps, by action and status.",
            ["action", "status"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.steps = Counter(
            "nightshift_steps", "Steps recorded, by action and status.", ["action", "status"], registry=r
        )
        for outcome in OUTCOMES:
            self.incidents.labels(outcome)
        for status in ALERT_STATUSES:
            self.alerts_received.labels(status)
        self.node_repairs = self._counter(
            "nightshift_node_repairs",
            "Node repairs settled, by outcome (returned, held, advisory, released, not_ours).",
            "outcome",
            REPAIR_OUTCOMES,
        )
        self.pruned_rows = self._counter(
            "nightshift_pruned_rows",
            "Rows deleted by retention, by table (docs/reliability.md, Retention).",
            "table",
            PRUNED_TABLES,
        )
        self.paused = Gauge(
            "nightshift_paused",
            "1 while automation is paused (kill switch).",
            registry=r,
            multiprocess_mode="max",
        )

    def _counter(self, name: str, documentation: str, label: str, values: Iterable[str]) -> Counter:
        """A counter of one label whose every value exists at zero from the start."""
        counter = Counter(name, documentation, [label], registry=self.registry)
        for value in values:
            counter.labels(value)
        return counter

    def exposition(self, live: Sequence[Metric] = ()) -> bytes:
        """The text exposition: aggregated over gunicorn workers in multiprocess mode, else this registry.

        ``live`` families are read at scrape time (from the store), the same whichever worker answers."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = self.registry
        return generate_latest(registry) + generate_latest(_Fixed(live))


def inbox_families(stats: Mapping[str, Any], now: datetime) -> list[Metric]:
    """The inbox's depth and lag, from :func:`app.store.records.inbox_stats`."""
    oldest = stats["oldest_pending_at"]
    return [
        GaugeMetricFamily(
            "nightshift_inbox_pending", "Notifications accepted and not yet ingested.", value=stats["pending"]
        ),
        GaugeMetricFamily(
            "nightshift_inbox_set_aside",
            "Notifications whose ingestion failed (see `nightshift inbox`).",
            value=stats["failed"],
        ),
        GaugeMetricFamily(
            "nightshift_inbox_oldest_pending_age_seconds",
            "Age of the oldest notification waiting to be ingested; 0 when none waits.",
            value=(now - oldest).total_seconds() if oldest is not None else 0.0,
        ),
    ]


def vitals_families(
    *,
    version: str,
    store_up: bool,
    open_by_state: Mapping[str, int] | None = None,
    credentials: Mapping[str, Mapping[str, Any]] | None = None,
    last_tick: datetime | None = None,
) -> list[Metric]:
    """Build info, the store's reachability and, when it answered, open incidents by state, each backend's
    credential state and the worker's last tick (app/engine/vitals.py). Labels from closed sets only."""
    build = GaugeMetricFamily(
        "nightshift_build_info", "Always 1; the running version in its label.", labels=["version"]
    )
    build.add_metric([version], 1)
    families: list[Metric] = [
        build,
        GaugeMetricFamily(
            "nightshift_store_up",
            "1 when the store answered this scrape's reads, else 0.",
            value=int(store_up),
        ),
    ]
    if open_by_state is not None:
        open_now = GaugeMetricFamily(
            "nightshift_open_incidents", "Incidents open now, by state.", labels=["state"]
        )
        for state in OPEN_STATES:
            open_now.add_metric([state], open_by_state.get(state, 0))
        families.append(open_now)
    if credentials is not None:
        state_of = GaugeMetricFamily(
            "nightshift_backend_credentials",
            "1 for each backend's credential state (unset, configured, credential_error), else 0.",
            labels=["backend", "state"],
        )
        for backend in BACKENDS:
            current = (credentials.get(backend) or {}).get("state", "unset")
            for state in CREDENTIAL_STATES:
                state_of.add_metric([backend, state], int(current == state))
        families.append(state_of)
    if last_tick is not None:
        families.append(
            GaugeMetricFamily(
                "nightshift_worker_last_tick_timestamp_seconds",
                "When a worker last went round its loop (any worker, any replica), Unix time.",
                value=last_tick.timestamp(),
            )
        )
    return families


def repair_families(held: int) -> list[Metric]:
    """Nodes held for a person now (the list, with reasons: ``GET /api/v1/nodes``); no per-node label."""
    return [
        GaugeMetricFamily(
            "nightshift_nodes_held",
            "Nodes held out of service until a person releases them (validation failed, lemon rule, operator).",
            value=held,
        )
    ]


class _Fixed(Collector):
    def __init__(self, families: Sequence[Metric]):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
