"""Prometheus instant queries over the HTTP API (``/api/v1/query``), through :func:`app.clients.http.send`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import requests

from app.clients.http import bearer_session, json_body, send
from app.config import read_secret
from app.domain import errors

if TYPE_CHECKING:
    from app.config import Settings

# Past this many characters of PromQL the query travels as a POST form body: long GET URLs are cut by proxies.
MAX_GET_QUERY_CHARS = 1500


@dataclass(frozen=True)
class Sample:
    """One element of an instant-query result. A scalar result is one sample with no labels."""

    labels: dict[str, str]
    value: float
    timestamp: float

    def as_dict(self) -> dict[str, Any]:
        return {"labels": dict(self.labels), "value": self.value, "timestamp": self.timestamp}


class PrometheusClient:
    """Runs PromQL against one Prometheus server, optionally with a bearer token."""

    def __init__(
        self,
        url: str,
        *,
        bearer_token: str | None = None,
        timeout: float = 5.0,
        session: requests.Session | None = None,
    ):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = bearer_session(bearer_token, session)

    @classmethod
    def from_settings(cls, settings: Settings) -> PrometheusClient:
        """Build from ``settings.prometheus``. Raises ConfigError when ``prometheus.url`` is not set."""
        section = settings.prometheus
        if not section.url:
            raise errors.ConfigError("prometheus.url is not set")
        token = read_secret(section.bearer_token_file, "prometheus.bearer_token_file")
        return cls(section.url, bearer_token=token, timeout=section.timeout_seconds)

    def query(self, expr: str, at: datetime | None = None) -> list[Sample]:
        """Evaluate ``expr`` at ``at`` (timezone-aware; default: the server's now).

        Returns the samples of an instant vector, or one unlabelled sample for a scalar. A query Prometheus
        rejects (bad PromQL, execution error, timeout) raises :class:`~app.domain.errors.BackendError` with its
        ``errorType`` and ``error``; an unreachable server raises :class:`~app.domain.errors.Unavailable`.
        """
        form = {"query": expr}
        if at is not None:
            form["time"] = f"{at.timestamp():.3f}"
        if len(expr) > MAX_GET_QUERY_CHARS:
            response = self._send("POST", "/api/v1/query", data=form)
        else:
            response = self._send("GET", "/api/v1/query", params=form)
        return parse_query_response(json_body(response, "prometheus"))

    def ready(self) -> bool:
        """Whether ``/-/ready`` answers 200 (False when unreachable or failing; CredentialRejected raises)."""
        try:
            self._send("GET", "/-/ready")
        except errors.CredentialRejected:
            raise
        except errors.BackendError:
            return False
        return True

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        # Queries change nothing, so a lost answer is Unavailable (safe to repeat), never OutcomeUnknown.
        return send(
            self._session,
            method,
            self.url + path,
            what="prometheus",
            timeout=self.timeout,
            mutating=False,
            **kwargs,
        )

    def close(self) -> None:
        self._session.close()


def parse_query_response(body: Any) -> list[Sample]:
    """Samples from a decoded ``/api/v1/query`` body; BackendError for errors and unsupported results."""
    if not isinstance(body, Mapping) or body.get("status") not in ("success", "error"):
        raise errors.BackendError("prometheus: response is not an API envelope")
    if body["status"] == "error":
        raise errors.BackendError(f"prometheus: {body.get('errorType', 'error')}: {body.get('error', '')}")
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise errors.BackendError("prometheus: response has no data")
    kind, result = data.get("resultType"), data.get("result")
    if result is None:
        raise errors.BackendError("prometheus: response has no result")
    try:
        if kind == "vector":
            return [_sample(item["metric"], item["value"]) for item in result]
        if kind == "scalar":
            return [_sample({}, result)]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise errors.BackendError(f"prometheus: malformed {kind} result: {exc!r}") from None
    raise errors.BackendError(
        f"prometheus: result type {kind!r} is not supported; use an instant-vector expression"
    )


def _sample(metric: Mapping[str, str], point: list[Any]) -> Sample:
    timestamp, value = (
        point  # Prometheus sends [unix seconds, "value as string"]; "NaN"/"+Inf" parse as floats.
    )
    return Sample(
        labels={str(k): str(v) for k, v in metric.items()}, value=float(value), timestamp=float(timestamp)
    )
