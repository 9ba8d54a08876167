"""Grafana annotations (the legacy ``/api/annotations`` HTTP API) with a service-account bearer token.

Times travel as epoch **milliseconds**. Without a configured dashboard UID the annotation is an organisation
annotation, shown on every dashboard whose annotation query selects its tags (``nightshift``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import requests

from app.clients.http import bearer_session, json_body, send
from app.config import read_secret
from app.domain import errors
from app.domain.clock import epoch_ms

if TYPE_CHECKING:
    from app.config import Settings


class GrafanaClient:
    """Creates annotation regions and closes them when an incident ends."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        dashboard_uid: str | None = None,
        timeout: float = 5.0,
        session: requests.Session | None = None,
    ):
        self.url = url.rstrip("/")
        self.dashboard_uid = dashboard_uid
        self.timeout = timeout
        self._session = bearer_session(token, session)

    @classmethod
    def from_settings(cls, settings: Settings) -> GrafanaClient:
        """Build from ``settings.grafana``. Raises ConfigError when ``grafana.url`` is not set."""
        section = settings.grafana
        if not section.url:
            raise errors.ConfigError("grafana.url is not set")
        token = read_secret(section.token_file, "grafana.token_file")
        return cls(
            section.url, token=token, dashboard_uid=section.dashboard_uid, timeout=section.timeout_seconds
        )

    def create_annotation(
        self, *, text: str, tags: list[str], time: datetime, time_end: datetime | None = None
    ) -> int:
        """POST an annotation (a region when ``time_end`` is given); return its id.

        A lost answer raises :class:`~app.domain.errors.OutcomeUnknown`: the annotation may exist.
        """
        body: dict[str, Any] = {"time": epoch_ms(time), "text": text, "tags": list(tags)}
        if time_end is not None:
            body["timeEnd"] = epoch_ms(time_end)
        if self.dashboard_uid:
            body["dashboardUID"] = self.dashboard_uid
        answer = self._call("POST", "/api/annotations", body)
        annotation_id = answer.get("id") if isinstance(answer, Mapping) else None
        if not isinstance(annotation_id, int) or isinstance(annotation_id, bool):
            raise errors.BackendError(
                f"grafana: annotation created without an id in the answer: {answer!r:.200}"
            )
        return annotation_id

    def close_annotation(
        self,
        annotation_id: int,
        *,
        time_end: datetime,
        text: str | None = None,
        tags: list[str] | None = None,
    ) -> None:
        """PATCH the annotation's end (turning it into a region), and its text/tags only when given."""
        body: dict[str, Any] = {"timeEnd": epoch_ms(time_end)}
        if text:
            body["text"] = text
        if tags is not None:
            body["tags"] = list(tags)
        self._call("PATCH", f"/api/annotations/{int(annotation_id)}", body)

    def healthy(self) -> bool:
        """Whether ``/api/health`` answers 200 with its database ``ok``. False when unreachable or failing."""
        try:
            answer = self._call("GET", "/api/health", None)
        except errors.CredentialRejected:
            raise
        except errors.BackendError:
            return False
        return isinstance(answer, Mapping) and answer.get("database") == "ok"

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        response = send(
            self._session,
            method,
            self.url + path,
            what="grafana",
            timeout=self.timeout,
            mutating=method != "GET",
            json=body,
        )
        return json_body(response, "grafana")

    def close(self) -> None:
        self._session.close()
