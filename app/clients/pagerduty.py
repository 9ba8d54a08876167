"""PagerDuty Events API v2: ``POST /v2/enqueue`` with a routing (integration) key, the paging channel.

The contract (developer.pagerduty.com, "Send an Alert Event" and "Events API v2 Overview"): a JSON body with
``routing_key`` (the 32-character integration key), ``event_action`` (``trigger``), ``dedup_key`` (at most 255
characters), ``payload`` {``summary`` (at most 1024), ``source``, ``severity`` (critical|error|warning|info),
``component``, ``group``, ``class``, ``custom_details``} and ``links``; at most 512 KB. Answers: ``202``
``{"status": "success", "message": "Event processed", "dedup_key": ...}``; ``400`` ``{"status": "invalid event",
"message": "Event object is invalid", "errors": [...]}`` (not to be retried); ``429`` throttled and ``5xx``
(retry later). The routing key is a secret: it is never part of a message, a plan or the ledger.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import requests

from app.clients.http import json_body, send
from app.config import read_secret
from app.domain import errors
from app.domain.paging import MAX_DEDUP_KEY, MAX_SUMMARY, SEVERITIES, Page

if TYPE_CHECKING:
    from app.config import Settings

# An event is at most 512 KB (developer.pagerduty.com, Events API v2, "Send an Alert Event"; the same docs as
# PagerDuty/developer-docs docs/events-API-v2/): notices are clipped to fit (app/domain/paging.py,
# app/domain/clipping.py).
MAX_BODY_BYTES = 512 * 1024
ROUTING_KEY_CHARS = 32


class PagerDutyClient:
    """Sends trigger events to one PagerDuty service integration."""

    def __init__(
        self,
        routing_key: str,
        *,
        url: str,
        client_url: str = "",
        timeout: float = 10.0,
        session: requests.Session | None = None,
    ):
        if len(routing_key) != ROUTING_KEY_CHARS:
            # PagerDuty answers 400 for this; saying it at start-up names the setting instead.
            raise errors.ConfigError(
                f"notify.pagerduty_routing_key_file: an Events v2 integration key has {ROUTING_KEY_CHARS} "
                f"characters, this one has {len(routing_key)}"
            )
        self.url = url
        self.client_url = client_url
        self.timeout = timeout
        self._routing_key = routing_key
        self._session = session or requests.Session()

    @classmethod
    def from_settings(cls, settings: Settings) -> PagerDutyClient:
        """Build from ``settings.notify``. ConfigError when no routing key file is set or it is unreadable."""
        section = settings.notify
        key = read_secret(section.pagerduty_routing_key_file, "notify.pagerduty_routing_key_file")
        if not key:
            raise errors.ConfigError("notify.pagerduty_routing_key_file is not set")
        return cls(
            key, url=section.pagerduty_url, client_url=settings.external_url, timeout=section.timeout_seconds
        )

    def body(self, page: Page) -> dict[str, Any]:
        """The ``trigger`` event for ``page``, checked against the API's limits."""
        if page.severity not in SEVERITIES:
            raise errors.BackendError(f"pagerduty: severity {page.severity!r} is not one of {SEVERITIES}")
        if not page.summary or len(page.summary) > MAX_SUMMARY or len(page.dedup_key) > MAX_DEDUP_KEY:
            raise errors.BackendError(
                "pagerduty: summary empty or over 1024 characters, or dedup_key over 255"
            )
        payload: dict[str, Any] = {
            "summary": page.summary,
            "source": page.source,
            "severity": page.severity,
            "class": page.event_class,
            "custom_details": dict(page.custom_details),
        }
        if page.component:
            payload["component"] = page.component
        if page.group:
            payload["group"] = page.group
        body: dict[str, Any] = {
            "routing_key": self._routing_key,
            "event_action": "trigger",
            "dedup_key": page.dedup_key,
            "payload": payload,
            "client": "Nightshift",
        }
        if self.client_url:
            body["client_url"] = self.client_url
        if page.links:
            body["links"] = [{"href": href, "text": text} for href, text in page.links]
        return body

    def trigger(self, page: Page) -> str:
        """Send the trigger event; return the ``dedup_key`` PagerDuty filed it under.

        400 → :class:`~app.domain.errors.BackendError` with PagerDuty's ``errors`` (never retried; an invalid routing
        key is :class:`~app.domain.errors.CredentialRejected`), 429 →
        :class:`~app.domain.errors.RateLimited`, 503 → :class:`~app.domain.errors.Unavailable`, a lost answer →
        :class:`~app.domain.errors.OutcomeUnknown` (a retry is harmless: same ``dedup_key``, same alert).
        """
        body = self.body(page)
        encoded = json.dumps(body, default=str).encode()
        if len(encoded) > MAX_BODY_BYTES:
            # Clipped details should never get here; if they do, the page still goes, without its details.
            size = len(encoded)
            body["payload"]["custom_details"] = {
                "text": str(page.custom_details.get("text", ""))[:4000],
                "clipped": f"custom details left out: the event was {size} bytes, over the 512 KB limit",
            }
            encoded = json.dumps(body, default=str).encode()
        try:
            response = send(
                self._session,
                "POST",
                self.url,
                what="pagerduty",
                timeout=self.timeout,
                mutating=True,
                data=encoded,
                headers={"Content-Type": "application/json"},
                allow_redirects=False,
            )
        except errors.BackendError as exc:
            raise _with_event_errors(exc) from None
        if response.status_code != 202:
            raise errors.BackendError(f"pagerduty: expected HTTP 202, got {response.status_code}")
        answer = json_body(response, "pagerduty")
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise errors.BackendError(f"pagerduty: unexpected answer {str(answer)[:200]}")
        return str(answer.get("dedup_key") or page.dedup_key)

    def close(self) -> None:
        self._session.close()


def _with_event_errors(exc: errors.BackendError) -> errors.BackendError:
    """A 400's message with PagerDuty's ``errors`` list, which says what was wrong with the event."""
    if type(exc) is not errors.BackendError or not exc.output:
        return exc
    try:
        answer = json.loads(exc.output)
    except ValueError:
        return exc
    problems = answer.get("errors") if isinstance(answer, dict) else None
    if not problems:
        return exc
    listed = "; ".join(str(p) for p in problems)[:300] if isinstance(problems, list) else str(problems)[:300]
    if "routing key" in listed.lower() or "routing_key" in listed.lower():
        # An unknown or malformed integration key: a credential problem, shown as such (never retried).
        return errors.CredentialRejected(f"{exc}: {listed}", output=exc.output)
    return errors.BackendError(f"{exc}: {listed}", output=exc.output)
