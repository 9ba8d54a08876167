"""HTTP layer: blueprints for the webhook, the JSON API, health and metrics; one JSON error shape everywhere."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Flask, jsonify
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import HTTPException

from app.errors import StoreUnavailable


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


def register(app: Flask) -> None:
    from app.web import alerts, api, health, ui
    from app.web.auth import LIMITER_KEY, AuthFailureLimiter

    app.json = JSONProvider(app)
    app.extensions[LIMITER_KEY] = AuthFailureLimiter.from_settings(
        app.extensions["nightshift"].settings.webhook
    )
    app.register_blueprint(alerts.bp)
    app.register_blueprint(api.bp)
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
