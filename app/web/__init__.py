"""HTTP layer: blueprints for the webhook, the JSON API, health and metrics; one JSON error shape everywhere."""

from __future__ import annotations

from datetime import datetime
from typing import Any, overload

from flask import Flask, abort, jsonify, request
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter, Map

from app.domain.errors import StoreUnavailable

# Ids are SQL BIGINTs: a path id outside 1..2**63-1 matches no route (404), never reaches the store.
MAX_ID = 2**63 - 1


class IdConverter(IntegerConverter):
    """``<id:name>``: a positive integer that fits a signed 64-bit column."""

    def __init__(self, url_map: Map) -> None:
        super().__init__(url_map, min=1, max=MAX_ID)


class JSONProvider(DefaultJSONProvider):
    """ISO 8601 times instead of Flask's RFC 822 dates."""

    @staticmethod
    def default(o: Any) -> Any:
        if isinstance(o, datetime):
            return o.isoformat()
        return DefaultJSONProvider.default(o)


def error(status: int, message: str, **extra: Any):
    """The one error shape of every API response: ``{"status": "error", "message": ...}``."""
    response = jsonify({"status": "error", "message": message, **extra})
    response.status_code = status
    return response


def plain_text(value: str, limit: int) -> str:
    """Free text from a client, printable characters only (no controls, no bidirectional overrides), bounded."""
    return "".join(ch for ch in value if ch.isprintable())[:limit].strip()


def header_text(value: str, limit: int) -> str:
    """Free text from a request header, as :func:`plain_text`. WSGI hands header bytes over decoded as Latin-1
    (PEP 3333); clients send UTF-8, so the value is re-encoded and decoded as UTF-8 (bytes that are not UTF-8
    become U+FFFD) before controls and bidirectional overrides are stripped. A value with characters beyond
    Latin-1 did not come from WSGI bytes (a test client): it is taken as it is."""
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        return plain_text(value, limit)
    return plain_text(raw.decode("utf-8", errors="replace"), limit)


@overload
def int_arg(name: str, default: int, low: int, high: int) -> int: ...
@overload
def int_arg(name: str, default: None, low: int, high: int) -> int | None: ...
def int_arg(name: str, default: int | None, low: int, high: int) -> int | None:
    """An integer query parameter within ``low..high`` (400 naming the bounds otherwise); ``default`` if absent."""
    raw = request.args.get(name, "")
    if raw == "":
        return default
    if not (raw.isascii() and raw.lstrip("-").isdigit()) or len(raw) > 20:
        abort(400, f"{name} must be an integer between {low} and {high}")
    value = int(raw)
    if not low <= value <= high:
        abort(400, f"{name} must be between {low} and {high}, got {value}")
    return value


def register(app: Flask) -> None:
    from app.web import alerts, api, discovery, health, ui
    from app.web.access import ACCESS_KEY, ReadAccess
    from app.web.auth import LIMITER_KEY, AuthFailureLimiter

    services = app.extensions["nightshift"]
    app.json = JSONProvider(app)
    app.url_map.converters["id"] = IdConverter  # before the blueprints' rules are built
    # A path with "//" (a node name holding a slash, a client's typo) is not found, in the JSON error shape; merging
    # slashes would answer with an HTML redirect to another route's path.
    app.url_map.merge_slashes = False
    app.extensions[LIMITER_KEY] = AuthFailureLimiter.from_settings(services.settings.webhook)
    app.extensions[ACCESS_KEY] = ReadAccess.from_settings(services.settings, services.operator_token)
    app.register_blueprint(alerts.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(discovery.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(ui.bp)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        response = error(exc.code or 500, exc.description or exc.name)
        if exc.code == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="nightshift"'
        return response

    @app.errorhandler(StoreUnavailable)
    def _store_down(exc: StoreUnavailable):
        return error(503, str(exc))
