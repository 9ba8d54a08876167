"""Grafana actions: mark a moment on the dashboards (an organisation annotation tagged ``nightshift``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from app.actions.base import Action, ActionContext, Plan
from app.domain.errors import BackendError, ConfigError
from app.domain.outcome import Failed, Ok, Outcome, outcome_from_error
from app.domain.params import Param

# Grafana parses "key:value" tags into pairs; keep them to one printable token.
TAG = r"[A-Za-z0-9_.:/=@+#-]{1,100}"
BASE_TAG = "nightshift"


class GrafanaAnnotate(Action):
    """Create an annotation at the current time. Read-only: it changes no cluster state, only a dashboard."""

    name = "grafana.annotate"
    description = "Add a Grafana annotation tagged nightshift (and incident:<id>)"
    read_only = True
    params = {
        "text": Param(max_length=2000, prose=True, description="annotation text"),
        "tags": Param(kind="list", pattern=TAG, required=False, max_length=100, description="extra tags"),
        "incident": Param(
            kind="integer", required=False, description="incident id (default: the current one)"
        ),
    }

    def plan(self, params: Mapping[str, Any]) -> Plan:
        tags = annotation_tags(params.get("tags", ()), params.get("incident"))
        return Plan(summary="annotate Grafana dashboards", command=_command(params["text"], tags))

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        incident = params.get("incident", ctx.incident_id)
        tags = annotation_tags(params.get("tags", ()), incident)
        command = _command(params["text"], tags)
        try:
            annotation_id = ctx.clients.grafana.create_annotation(
                text=params["text"], tags=tags, time=ctx.clock.now()
            )
        except BackendError as exc:
            return outcome_from_error(exc, command=command)
        except ConfigError as exc:
            return Failed(reason=str(exc), command=command)
        return Ok(
            command=command, output=f"annotation {annotation_id}", data={"annotation_id": annotation_id}
        )


def annotation_tags(extra: Iterable[str], incident: int | None) -> list[str]:
    """``nightshift`` first, then ``extra`` in order without repeats, then ``incident:<id>`` when known."""
    tags = [BASE_TAG, *extra]
    if incident is not None:
        tags.append(f"incident:{incident}")
    return list(dict.fromkeys(tags))


def _command(text: str, tags: list[str]) -> str:
    return f"POST /api/annotations {json.dumps({'text': text, 'tags': tags})}"


ACTIONS = (GrafanaAnnotate(),)
