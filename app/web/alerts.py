"""``POST /api/v1/alerts``: Alertmanager's webhook. Validate, record durably, answer; the worker does the rest.

200 once the notification is committed to the store's inbox (the worker ingests its alerts a few milliseconds
later, :mod:`app.engine.inbox`); 400 for a payload Alertmanager must not retry; 401 without credentials;
413 over the size limit (``webhook.max_body_bytes``, with a Content-Length or chunked); 429 for a client address
that keeps failing authentication; 503 when the store is down, or with Retry-After when the inbox's backlog is past
``webhook.max_inbox_alerts`` (:mod:`app.engine.inbox`: repeats first, new alerts past twice the bound); Alertmanager
retries 5xx.

Authenticated deliveries are never rate limited, nor refused because of their address: credentials are checked
first, and Alertmanager drops a notification answered 4xx, so a limit would lose alerts, and in an alert storm,
when they matter most. Only failed authentication is limited, per client address
(:class:`app.web.auth.AuthFailureLimiter`).
"""

from __future__ import annotations

import logging

from flask import Blueprint, current_app, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from app.domain.alertmanager import parse_notification
from app.domain.errors import InboxFull, PayloadError
from app.web import error
from app.web.auth import refuse_failure

bp = Blueprint("alerts", __name__)
log = logging.getLogger(__name__)


@bp.post("/api/v1/alerts")
def receive():
    services = current_app.extensions["nightshift"]
    metrics = services.metrics
    if not services.webhook_auth.check(request.headers.get("Authorization")):
        throttled = refuse_failure("webhook")
        if throttled is not None:
            metrics.webhook_requests.labels("429").inc()
            return throttled
        metrics.webhook_requests.labels("401").inc()
        response = error(401, "missing or invalid credentials (Authorization: Bearer <token> or Basic)")
        response.headers["WWW-Authenticate"] = 'Bearer realm="nightshift"'
        return response
    if request.mimetype not in ("application/json", ""):
        metrics.webhook_requests.labels("415").inc()
        return error(415, f"expected Content-Type application/json, got {request.mimetype}")
    body = _body(services.settings.webhook.max_body_bytes)
    try:
        notification = parse_notification(body, max_alerts=services.settings.webhook.max_alerts_per_payload)
    except PayloadError as exc:
        metrics.webhook_requests.labels("400").inc()
        return error(400, str(exc))
    try:
        inbox_id = services.engine.accept(notification, body)
    except InboxFull as exc:
        metrics.webhook_requests.labels("503").inc()
        response = error(503, str(exc))
        response.headers["Retry-After"] = str(exc.retry_after)
        return response
    if notification.truncated_alerts:
        # The group was larger than Alertmanager's max_alerts: the alerts past it never reach Nightshift.
        metrics.alerts_truncated.inc(notification.truncated_alerts)
        log.warning(
            "webhook: Alertmanager left %d alert(s) of group %r out of its notification (max_alerts); group finer "
            "(alerts/README.md)",
            notification.truncated_alerts,
            notification.group_key,
        )
    log.debug(
        "webhook: %d alert(s) from receiver %r queued as inbox %d",
        len(notification.alerts),
        notification.receiver,
        inbox_id,
    )
    metrics.webhook_requests.labels("200").inc()
    return jsonify({"status": "ok", "alerts": len(notification.alerts), "inbox_id": inbox_id})


def _body(limit: int) -> bytes:
    """The request body, at most ``limit`` bytes: 413 over it, with a Content-Length or chunked.

    Werkzeug refuses a Content-Length over ``MAX_CONTENT_LENGTH`` itself, but cuts a chunked body at the limit
    without saying so; one byte more is read here to tell "exactly the limit" from "over it".
    """
    if request.content_length is not None or not request.environ.get("wsgi.input_terminated"):
        return request.get_data(cache=False)
    body = request.environ["wsgi.input"].read(limit + 1)
    if len(body) > limit:
        raise RequestEntityTooLarge(f"request body over the limit of {limit} bytes")
    return body
