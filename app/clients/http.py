"""HTTP through ``requests``, with its errors translated once into :mod:`app.domain.errors`.

:func:`send` is the one place where Nightshift's HTTP clients (Prometheus, Grafana, outgoing webhooks) call
``requests``: it always passes a timeout and maps every failure by what it means for the caller:

* nothing reached the server (connection refused, DNS, connect timeout) → :class:`~app.domain.errors.Unavailable`
* the request left but no answer came back: a mutating request may have taken effect, so
  :class:`~app.domain.errors.OutcomeUnknown`; a read is safe to repeat, so :class:`~app.domain.errors.Unavailable`
* 401/403 → :class:`~app.domain.errors.CredentialRejected`, 404 → :class:`~app.domain.errors.NotFound`,
  409 → :class:`~app.domain.errors.Conflict`, 429 → :class:`~app.domain.errors.RateLimited` (``Retry-After`` honoured),
  any other 4xx/5xx → :class:`~app.domain.errors.BackendError` with the status and a short body excerpt.

Messages never contain the request URL: outgoing webhook URLs (Slack) are secrets, and ``requests`` and
``urllib3`` put the path in theirs, so only the underlying socket reason is kept.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import requests
import urllib3.exceptions

from app.domain import errors
from app.domain.outcome import tail

if TYPE_CHECKING:
    from app.config import Settings

DEFAULT_RETRY_AFTER = 30.0
EXCERPT_CHARS = 200


def bearer_session(token: str | None, session: requests.Session | None = None) -> requests.Session:
    """A session (``session`` or a new one) that sends ``Authorization: Bearer <token>`` when a token is given."""
    session = session or requests.Session()
    if token:
        session.headers["Authorization"] = f"Bearer {token}"
    return session


def send(
    session: requests.Session,
    method: str,
    url: str,
    *,
    what: str,
    timeout: float,
    mutating: bool,
    **kwargs: Any,
) -> requests.Response:
    """Make one request; return the 2xx/3xx response or raise the :mod:`app.domain.errors` exception that fits.

    ``what`` names the backend in messages ("grafana"); ``mutating`` says whether a lost answer leaves the
    outcome unknown. ``kwargs`` go to :meth:`requests.Session.request` (``json``, ``params``, ``headers``...).
    """
    try:
        response = session.request(method, url, timeout=timeout, **kwargs)
    except (
        requests.exceptions.InvalidURL,
        requests.exceptions.MissingSchema,
        requests.exceptions.InvalidSchema,
    ):
        raise errors.BackendError(f"{what}: invalid URL") from None
    except requests.exceptions.InvalidJSONError as exc:  # raised while preparing: nothing was sent
        raise errors.BackendError(f"{what}: request body is not JSON: {exc}") from None
    except requests.exceptions.ConnectTimeout as exc:
        raise errors.Unavailable(f"{what}: connect timed out after {timeout:g}s: {_reason(exc)}") from None
    except requests.exceptions.ConnectionError as exc:
        if _never_connected(exc) or not mutating:
            raise errors.Unavailable(f"{what}: cannot connect: {_reason(exc)}") from None
        raise errors.OutcomeUnknown(
            f"{what}: connection lost after sending {method}: {_reason(exc)}"
        ) from None
    except requests.exceptions.RequestException as exc:
        # ReadTimeout and broken responses: the request was sent, so only a read is safe to repeat.
        if mutating:
            raise errors.OutcomeUnknown(
                f"{what}: no answer to {method} within {timeout:g}s: {_reason(exc)}"
            ) from None
        raise errors.Unavailable(f"{what}: no answer within {timeout:g}s: {_reason(exc)}") from None
    check_status(response, what)
    return response


def check_status(response: requests.Response, what: str) -> None:
    """Raise the :mod:`app.domain.errors` exception for an HTTP error status; return for 1xx-3xx."""
    status = response.status_code
    if status < 400:
        return
    message = f"{what}: HTTP {status}: {excerpt(response)}"
    if status in (401, 403):
        raise errors.CredentialRejected(message)
    if status == 404:
        raise errors.NotFound(message)
    if status == 409:
        raise errors.Conflict(message)
    if status == 429:
        raise errors.RateLimited(message, retry_after=retry_after(response.headers.get("Retry-After")))
    if status == 503:  # the server says it did not handle the request: a later try is safe
        raise errors.Unavailable(
            message, retry_after=retry_after(response.headers.get("Retry-After")), output=tail(response.text)
        )
    raise errors.BackendError(message, output=tail(response.text))


def json_body(response: requests.Response, what: str) -> Any:
    """The decoded JSON body; a body that is not JSON is a :class:`~app.domain.errors.BackendError`."""
    try:
        return response.json()
    except ValueError:
        raise errors.BackendError(
            f"{what}: expected JSON, got HTTP {response.status_code}: {excerpt(response)}"
        ) from None


def excerpt(response: requests.Response) -> str:
    """A short, single-line description of an error body: the API's own message when it has one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        # Prometheus: {"status": "error", "errorType": ..., "error": ...}; Grafana: {"message": ...}
        if "error" in body:
            kind = body.get("errorType")
            text = f"{kind}: {body['error']}" if kind else str(body["error"])
        elif "message" in body:
            text = str(body["message"])
        else:
            text = json.dumps(body)
    else:
        text = response.text or response.reason or ""
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def retry_after(value: str | None, now: datetime | None = None) -> float:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or HTTP-date); a default when unusable."""
    if not value:
        return DEFAULT_RETRY_AFTER
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER
    if moment.tzinfo is None:  # RFC 9110 dates are GMT; "-0000" parses as naive
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - (now or datetime.now(UTC))).total_seconds())


def _never_connected(exc: requests.exceptions.ConnectionError) -> bool:
    """True when the failure happened while connecting (refused, DNS): the request never left."""
    cause = exc.args[0] if exc.args else None
    if isinstance(exc, requests.exceptions.SSLError):  # the handshake failed: no request was written
        return True
    # NameResolutionError is a NewConnectionError too.
    return isinstance(cause, urllib3.exceptions.MaxRetryError) and isinstance(
        cause.reason, urllib3.exceptions.NewConnectionError
    )


def _reason(exc: requests.exceptions.RequestException) -> str:
    """The socket-level reason, without the URL that ``MaxRetryError`` messages carry."""
    cause: object = exc.args[0] if exc.args else exc
    if isinstance(cause, urllib3.exceptions.MaxRetryError) and cause.reason is not None:
        cause = cause.reason
    text = str(cause)
    # urllib3 prefixes "HTTPConnection(host=..., port=...): "; the reason after it is what helps.
    text = re.sub(r"^\(?\S*HTTPS?Connection(?:Pool)?\([^)]*\):\s*", "", text)
    return text[:EXCERPT_CHARS]


class HttpPoster:
    """Posts JSON to arbitrary URLs (Slack-compatible webhooks and similar), with one timeout."""

    def __init__(self, *, timeout: float = 10.0, session: requests.Session | None = None):
        self.timeout = timeout
        self._session = session or requests.Session()
        # urllib3 logs each request line, URL path included, at DEBUG: a chat webhook's path is its secret.
        pool_log = logging.getLogger("urllib3.connectionpool")
        if pool_log.level < logging.INFO:
            pool_log.setLevel(logging.INFO)

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpPoster:
        return cls(timeout=settings.notify.timeout_seconds)

    def post_json(self, url: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> int:
        """POST ``body`` as JSON to ``url``; return the 2xx status. Raises :mod:`app.domain.errors` exceptions.

        Redirects are not followed (a redirected POST turns into a GET): a 3xx is a BackendError.
        """
        response = send(
            self._session,
            "POST",
            url,
            what="webhook",
            timeout=self.timeout,
            mutating=True,
            json=dict(body),
            headers=dict(headers or {}),
            allow_redirects=False,
        )
        if response.status_code >= 300:
            raise errors.BackendError(f"webhook: HTTP {response.status_code}: redirect not followed")
        return response.status_code

    def close(self) -> None:
        self._session.close()
