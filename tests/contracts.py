"""Contract-faithful fakes for services that cannot run here (no Grafana server is installable; PagerDuty is
SaaS).

:class:`GrafanaFake` serves :class:`sim.grafana_standin.GrafanaAnnotations` (the legacy annotations API from
Grafana's docs and ``pkg/api/annotations.go``: bearer token, typed DTO binding, epoch milliseconds, PATCH of the
given fields only) to every ``requests`` call, through ``responses``. The demo's HTTP stand-in serves the same
class, so the contract exists once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

import responses

from sim.grafana_standin import GrafanaAnnotations


class GrafanaFake(GrafanaAnnotations):
    """The annotations of one Grafana organisation, answering ``responses`` callbacks."""

    def callback(self, request) -> tuple[int, dict[str, str], str]:
        status, body = self.handle(request.method, request.path_url, request.headers, request.body)
        return status, {"Content-Type": "application/json"}, json.dumps(body)


@contextmanager
def grafana_contract(url: str, token: str) -> Iterator[GrafanaFake]:
    """Serve the fake at ``url`` for every ``requests`` call made inside the block."""
    fake = GrafanaFake(token)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        for method in (responses.GET, responses.POST, responses.PATCH):
            mock.add_callback(method, re.compile(rf"{re.escape(url)}/api/.*"), callback=fake.callback)
        yield fake


class PagerDutyEventsFake:
    """PagerDuty's Events API v2 ``POST /v2/enqueue`` as its public contract states it (developer.pagerduty.com,
    "Send an Alert Event", "Events API v2 Overview", "Events API Rate Limits"): the body is a JSON object of at
    most 512 KB; ``routing_key`` has 32 characters and must name a known integration; ``event_action`` is
    ``trigger``, ``acknowledge`` or ``resolve``; a trigger needs ``payload.summary`` (1 to 1024 characters),
    ``payload.source`` and ``payload.severity`` (critical|error|warning|info); ``dedup_key`` has at most 255
    characters and an acknowledge or resolve needs one. Answers 202 ``{"status": "success", "message": "Event
    processed", "dedup_key": ...}`` (a generated key when none was sent), 400 ``{"status": "invalid event",
    "message": "Event object is invalid", "errors": [...]}``, 429 past ``rate_limit`` events a minute per key
    (about 120), and ``fail_with`` (a status) when set. ``alerts`` holds the open alert of each dedup key."""

    def __init__(self, routing_keys: tuple[str, ...], rate_limit: int = 120):
        self.routing_keys = set(routing_keys)
        self.rate_limit = rate_limit
        self.events: list[dict] = []  # every accepted event, in order
        self.alerts: dict[str, dict] = {}  # dedup_key -> the latest trigger's payload, while open
        self.fail_with: int | None = None
        self._accepted_per_key: dict[str, int] = {}

    def callback(self, request) -> tuple[int, dict[str, str], str]:
        status, body = self.handle(request.headers.get("Content-Type", ""), request.body)
        return status, {"Content-Type": "application/json"}, json.dumps(body)

    def handle(self, content_type: str, raw: bytes | str | None) -> tuple[int, dict]:
        if self.fail_with is not None:
            return self.fail_with, {"status": "error", "message": "Internal Server Error"}
        raw = raw.encode() if isinstance(raw, str) else (raw or b"")
        if len(raw) > 512 * 1024:
            return 400, _invalid("Event object is too large (over 512 KB)")
        if "application/json" not in content_type:
            return 400, _invalid("Content-Type must be application/json")
        try:
            event = json.loads(raw)
        except ValueError:
            return 400, _invalid("Could not parse the JSON body")
        problems = _event_problems(event)
        if problems:
            return 400, _invalid(*problems)
        key = event["routing_key"]
        if key not in self.routing_keys:
            return 400, _invalid("Invalid routing key")
        if self._accepted_per_key.get(key, 0) >= self.rate_limit:
            return 429, {
                "status": "throttle exceeded",
                "message": "Requests for this service are arriving too quickly",
            }
        self._accepted_per_key[key] = self._accepted_per_key.get(key, 0) + 1
        dedup = event.get("dedup_key") or f"generated-{len(self.events)}"
        self.events.append(event)
        if event["event_action"] == "trigger":
            self.alerts[dedup] = event["payload"]
        elif event["event_action"] == "resolve":
            self.alerts.pop(dedup, None)
        return 202, {"status": "success", "message": "Event processed", "dedup_key": dedup}


def _invalid(*errors: str) -> dict:
    return {"status": "invalid event", "message": "Event object is invalid", "errors": list(errors)}


def _event_problems(event: object) -> list[str]:
    if not isinstance(event, dict):
        return ["Event must be a JSON object"]
    problems = []
    if not isinstance(event.get("routing_key"), str) or len(event["routing_key"]) != 32:
        problems.append("Length of 'routing_key' is incorrect (should be 32 characters)")
    action = event.get("event_action")
    if action not in ("trigger", "acknowledge", "resolve"):
        problems.append("'event_action' is invalid (must be one of: trigger, acknowledge, resolve)")
    dedup = event.get("dedup_key")
    if dedup is not None and (not isinstance(dedup, str) or len(dedup) > 255):
        problems.append("'dedup_key' must be a string of at most 255 characters")
    if action in ("acknowledge", "resolve") and not dedup:
        problems.append("'dedup_key' is required for acknowledge and resolve events")
    if action == "trigger":
        payload = event.get("payload")
        if not isinstance(payload, dict):
            return [*problems, "'payload' is missing or not an object"]
        summary = payload.get("summary")
        if not isinstance(summary, str) or not 1 <= len(summary) <= 1024:
            problems.append("'payload.summary' must be 1 to 1024 characters")
        if not isinstance(payload.get("source"), str) or not payload["source"]:
            problems.append("'payload.source' is missing")
        if payload.get("severity") not in ("critical", "error", "warning", "info"):
            problems.append("'payload.severity' is invalid (must be one of: critical, error, warning, info)")
        if "custom_details" in payload and not isinstance(payload["custom_details"], dict):
            problems.append("'payload.custom_details' must be an object")
    for link in event.get("links") or []:
        if not isinstance(link, dict) or not isinstance(link.get("href"), str):
            problems.append("each of 'links' needs an 'href'")
    return problems


@contextmanager
def pagerduty_contract(url: str, routing_keys: tuple[str, ...]) -> Iterator[PagerDutyEventsFake]:
    """Serve the Events v2 fake at ``url`` (the enqueue endpoint) for every ``requests`` call inside the block."""
    fake = PagerDutyEventsFake(routing_keys)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add_callback(responses.POST, url, callback=fake.callback)
        yield fake
