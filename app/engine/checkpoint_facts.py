"""The facts of checkpoint-interval advice for one job, gathered from the store and Prometheus; the decision is
:func:`app.domain.checkpoint_advice.advise` (pure).

- **Failures**: the job incidents Nightshift acted on in the last :data:`WINDOW` (its own ledger of recoveries).
- **Node-seconds**: how long the fleet's training nodes ran in that window, from Prometheus: the number of
  ``training_step_total`` series (one per node endpoint) integrated over hourly samples.
- **The job**: its nodes (``training_step_total`` series of the job now), its GPUs (``gpus_per_node`` each), its
  checkpoint cost (time with ``training_checkpoint_in_progress`` = 1 over the checkpoints written in the last day)
  and its current interval (a day over the checkpoints written in it).

Every query is built from a template with :func:`app.domain.templates.render_promql`, so a label value is one escaped
string literal. A fact Prometheus cannot give is a :class:`~app.domain.checkpoint_advice.NoAdvice` saying which.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta

from app.config import ADVICE_WINDOW_SECONDS
from app.domain.checkpoint_advice import Advice, FailureRate, JobCheckpoints, NoAdvice, advise
from app.domain.errors import BackendError, ConfigError
from app.domain.schedulers import SCHEDULERS, Scheduler
from app.domain.templates import render_promql
from app.engine.deps import EngineDeps
from app.store import records

WINDOW = timedelta(seconds=ADVICE_WINDOW_SECONDS)  # retention keeps at least this (app/config.py)
# Bounds of an advice request (the API's query, the job page's).
MAX_GPUS_PER_NODE = 64
DEFAULT_GPUS_PER_NODE = 8


def job_identity(scheduler: str, values: Mapping[str, str]) -> tuple[Scheduler, dict[str, str]] | str:
    """The scheduler and the job the advice is for (its ``identity_params``: ``job``, and ``namespace`` on
    Kubernetes, from ``values``), or why the request names none."""
    found = SCHEDULERS.get(scheduler)
    if found is None:
        return f"scheduler: one of {', '.join(SCHEDULERS)}"
    identity = {}
    for key, param in found.identity_params.items():
        value = values.get(key, "")
        if not re.fullmatch(param.pattern or "", value):
            return f"{key}: a {param.description} is required"
        identity[key] = value
    return found, identity


# The fleet's training node-hours over the window (hourly samples of the number of node endpoints).
NODE_HOURS = "sum(sum_over_time(count(training_step_total)[30d:1h]))"
# One job's figures; %s is the scheduler's job selector (app/domain/schedulers.py ``job_selector``).
JOB_NODES = "count(training_step_total{%s})"
CHECKPOINT_SECONDS = (
    "max(sum_over_time(training_checkpoint_in_progress{%s}[1d:15s])) * 15"
    " / max(changes(training_last_checkpoint_timestamp_seconds{%s}[1d]))"
)
CHECKPOINTS_A_DAY = "max(changes(training_last_checkpoint_timestamp_seconds{%s}[1d]))"


def job_advice(
    deps: EngineDeps, scheduler: Scheduler, identity: Mapping[str, str], gpus_per_node: int
) -> Advice | NoAdvice:
    """The checkpoint-interval advice for the job ``identity`` names (the scheduler's ``identity`` keys)."""
    now = deps.clock.now()
    with deps.store.read() as conn:
        failures = records.job_failures_since(conn, now - WINDOW)
    selector = scheduler.job_selector
    context = {"target": dict(identity)}

    def query(template: str) -> float | None:
        expr = render_promql(template.replace("%s", selector), context)
        samples = deps.clients.prometheus.query(expr)
        return samples[0].value if samples else None

    try:
        node_hours, nodes, checkpoint = query(NODE_HOURS), query(JOB_NODES), query(CHECKPOINT_SECONDS)
        per_day = query(CHECKPOINTS_A_DAY)
    except (BackendError, ConfigError) as exc:
        return NoAdvice(f"Prometheus: {exc}")
    if node_hours is None or nodes is None or checkpoint is None:
        missing = [
            name
            for name, value in (
                ("fleet node-hours", node_hours),
                ("job nodes", nodes),
                ("checkpoint time", checkpoint),
            )
            if value is None
        ]
        return NoAdvice(f"Prometheus has no {', '.join(missing)} for this job (progress markers exported?)")
    job = JobCheckpoints(
        nodes=int(nodes),
        gpus=int(nodes) * gpus_per_node,
        checkpoint_seconds=checkpoint,
        interval_seconds=86_400 / per_day if per_day else None,
    )
    return advise(FailureRate(failures=failures, node_seconds=node_hours * 3600), job)
