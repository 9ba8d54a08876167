"""Prometheus actions: an instant query whose result must (or must not) be empty."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.actions.base import Action, ActionContext, Plan
from app.domain.errors import BackendError, ConfigError
from app.domain.outcome import Failed, Ok, Outcome, outcome_from_error, tail
from app.domain.params import Param


class PrometheusQuery(Action):
    """Evaluate PromQL now: ``expect: any`` holds when it returns samples, ``expect: none`` when it does not.

    The query travels as an HTTP parameter, never through a shell, so it has no pattern beyond its length.
    A query Prometheus rejects is Failed (retrying bad PromQL cannot help); an unreachable server is a Retry.
    """

    name = "prometheus.query"
    description = "Run a PromQL instant query and check whether it returns samples"
    read_only = True
    params = {
        "query": Param(
            max_length=2000, promql=True, description="PromQL instant-vector or scalar expression"
        ),
        "expect": Param(
            required=False,
            default="any",
            choices=("any", "none"),
            description="any: samples expected; none: empty",
        ),
    }

    def plan(self, params: Mapping[str, Any]) -> Plan:
        wanted = "some samples" if params["expect"] == "any" else "no samples"
        return Plan(summary=f"query Prometheus, expecting {wanted}", command=params["query"])

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        command = params["query"]
        try:
            samples = ctx.clients.prometheus.query(command)
        except BackendError as exc:
            return outcome_from_error(exc, command=command)
        except ConfigError as exc:
            return Failed(reason=str(exc), command=command)
        data = {"samples": [sample.as_dict() for sample in samples]}
        output = tail("\n".join(f"{_series(s.labels)} {s.value:g}" for s in samples))
        if (params["expect"] == "any") == bool(samples):
            return Ok(command=command, output=output, data=data)
        reason = "query returned no samples" if not samples else f"query returned {len(samples)} sample(s)"
        return Failed(reason=reason, command=command, output=output, data=data)


def _series(labels: Mapping[str, str]) -> str:
    """Prometheus' own notation for a series, for the ledger: ``name{a="b"}``."""
    name = labels.get("__name__", "")
    pairs = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{pairs}}}"


ACTIONS = (PrometheusQuery(),)
