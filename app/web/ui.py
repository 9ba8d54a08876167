"""Operator web UI: server-rendered pages (overview, incident, history, lemon nodes) and the operator's forms.

Reading needs no login, as with the JSON API. Acting (pause/resume, approve a step, mark an incident handled) needs
the operator token; browsers send no bearer header from a form, so ``/login`` takes the token once, compares it in
constant time, and sets a signed session cookie (HttpOnly, SameSite=Strict, Secure when ``external_url`` is https,
12 hours). The cookie's signing key is derived from the operator token, so rotating the token ends every session.
Every form carries the session's CSRF token. Without an operator token the forms are hidden and their routes answer
403. Pages need no JavaScript; Jinja autoescapes everything, and a Content-Security-Policy forbids scripts anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from datetime import timedelta
from functools import wraps
from typing import Any

from flask import (
    Blueprint,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.blueprints import BlueprintSetupState
from werkzeug.exceptions import HTTPException

from app.engine import Engine
from app.errors import StoreUnavailable
from app.web import views
from app.web.auth import record_auth_failure, refuse_if_throttled, same_secret

log = logging.getLogger(__name__)

bp = Blueprint(
    "ui", __name__, template_folder="templates", static_folder="static", static_url_path="/ui-static"
)

SESSION_KEY_CONTEXT = b"nightshift ui session key v1"
SESSION_LIFETIME = timedelta(hours=12)
HISTORY_FILTERS = ("node", "job", "playbook", "outcome")
HISTORY_PAGE = 50
OPERATOR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@ -]{0,63}")
# Where a login may send the browser back to: a path on this site, never another host (no "//", no scheme).
LOCAL_PATH = re.compile(r"/(?![/\\])[A-Za-z0-9/_.?=&%-]*")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


@bp.record_once
def _configure_sessions(state: BlueprintSetupState) -> None:
    """Session cookie settings, and a signing key derived from the operator token (none without a token)."""
    app = state.app
    services = app.extensions["nightshift"]
    if services.operator_token and not app.secret_key:
        app.secret_key = hmac.new(
            services.operator_token.encode("utf-8"), SESSION_KEY_CONTEXT, hashlib.sha256
        ).hexdigest()
    app.config.update(
        SESSION_COOKIE_NAME="nightshift_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_SECURE=services.settings.external_url.startswith("https://"),
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
    )


def _engine() -> Engine:
    return current_app.extensions["nightshift"].engine


def _operator_token() -> str | None:
    return current_app.extensions["nightshift"].operator_token


def _csrf_token() -> str:
    """The session's CSRF token, created on first use (a form is about to carry it)."""
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    return session["csrf"]


def _csrf_ok() -> bool:
    expected = session.get("csrf")
    return bool(expected) and same_secret(request.form.get("csrf_token", ""), expected)


def operator_form(view: Any) -> Any:
    """A form post that changes something: operator token configured (403), logged in (401), CSRF token (403)."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _operator_token() is None:
            abort(403, "operator actions are disabled: set operator_token_file in the settings")
        if not session.get("operator"):
            abort(401, "log in with the operator token first")
        if not _csrf_ok():
            abort(403, "missing or invalid CSRF token: reload the page and try again")
        return view(*args, **kwargs)

    return wrapper


def _text(name: str, limit: int = 500) -> str:
    """A free-text form field, printable characters only, bounded."""
    return "".join(ch for ch in request.form.get(name, "") if ch.isprintable())[:limit].strip()


def _int_arg(name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.args.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        abort(400, f"{name} must be an integer")
    if not low <= value <= high:
        abort(400, f"{name} must be between {low} and {high}")
    return value


@bp.context_processor
def _template_context() -> dict[str, Any]:
    enabled = _operator_token() is not None
    return {
        "operator_enabled": enabled,
        "operator": session.get("operator") if enabled else None,
        "csrf_token": _csrf_token,
    }


@bp.app_template_filter("utc")
def _utc_filter(value: Any) -> str:
    return views.utc(value)


@bp.after_request
def _security_headers(response: Any) -> Any:
    response.headers.update(SECURITY_HEADERS)
    if response.mimetype == "text/html":
        response.headers["Cache-Control"] = "no-store"  # pages carry CSRF tokens and operator state
    return response


@bp.errorhandler(HTTPException)
def _error_page(exc: HTTPException) -> Any:
    code = exc.code or 500
    return render_template("error.html", code=code, title=exc.name, message=exc.description), code


@bp.errorhandler(StoreUnavailable)
def _store_down(exc: StoreUnavailable) -> Any:
    return render_template("error.html", code=503, title="Store unavailable", message=str(exc)), 503


# --- pages --------------------------------------------------------------------------------------------------


@bp.get("/")
def overview():
    engine = _engine()
    status = engine.status()
    jobs = engine.job_incidents()
    return render_template(
        "overview.html",
        guard=views.guard_view(status, engine.blast_radius()),
        credentials=views.credential_views(status["credentials"]),
        jobs=views.job_views(jobs["latest"], jobs["open"], status["credentials"]),
        open_incidents=jobs["open"],
    )


@bp.get("/incidents/<int:incident_id>")
def incident(incident_id: int):
    engine = _engine()
    detail = engine.incident(incident_id)
    if detail is None:
        abort(404, f"incident {incident_id} not found")
    grafana = engine.deps.settings.grafana
    row = detail["incident"]
    link = views.grafana_link(
        grafana.url, grafana.dashboard_uid, row["opened_at"], row["closed_at"], engine.deps.clock.now()
    )
    return render_template("incident.html", view=views.incident_view(detail, link))


@bp.get("/history")
def history():
    engine = _engine()
    filters = {name: request.args.get(name, "").strip()[:255] for name in HISTORY_FILTERS}
    limit = _int_arg("limit", HISTORY_PAGE, 1, 500) or HISTORY_PAGE
    before = _int_arg("before", None, 1, 2**62)
    rows = engine.incidents(
        limit=limit + 1, before_id=before, **{name: value for name, value in filters.items() if value}
    )
    shown, next_before = views.page(rows, limit)
    active = {name: value for name, value in filters.items() if value}
    if limit != HISTORY_PAGE:
        active["limit"] = str(limit)
    return render_template(
        "history.html",
        incidents=shown,
        filters=filters,
        outcomes=views.OUTCOMES,
        playbooks=sorted(p.name for p in engine.deps.playbooks.playbooks),
        older_url=url_for(".history", **active, before=next_before) if next_before else None,
        newest_url=url_for(".history", **active) if before else None,
    )


@bp.get("/nodes")
def nodes():
    days = _int_arg("days", 7, 1, 365) or 7
    data = _engine().node_remediations(days)
    return render_template(
        "nodes.html",
        nodes=views.lemon_nodes(data["attempts"], data["incidents"]),
        days=days,
        since=data["since"],
    )


# --- login --------------------------------------------------------------------------------------------------


def _local_next(value: str | None) -> str:
    return value if value and LOCAL_PATH.fullmatch(value) else url_for(".overview")


@bp.route("/login", methods=["GET", "POST"])
def login():
    token = _operator_token()
    if token is None:
        return render_template("login.html", disabled=True), 403
    next_url = _local_next(request.values.get("next"))
    if request.method == "GET":
        return render_template("login.html", next_url=next_url)
    if not _csrf_ok():
        abort(403, "missing or invalid CSRF token: reload the login page and try again")
    name = request.form.get("operator", "").strip()
    if not OPERATOR_NAME.fullmatch(name):
        error = "Your name: 1 to 64 letters, digits, spaces or . _ @ -"
        return render_template("login.html", next_url=next_url, error=error, name=""), 400
    throttled = refuse_if_throttled()
    if throttled is not None:
        return throttled
    if not same_secret(request.form.get("token", ""), token):
        record_auth_failure()
        log.warning("ui login refused for %r from %s: wrong operator token", name, request.remote_addr)
        return render_template("login.html", next_url=next_url, error="Wrong operator token.", name=name), 401
    session.clear()  # a fresh session (and CSRF token) on every login: no fixation
    session.permanent = True
    session["operator"] = name
    session["csrf"] = secrets.token_urlsafe(32)
    log.info("ui login: %s from %s", name, request.remote_addr)
    flash(f"Logged in as {name}.", "info")
    return redirect(next_url, 303)


@bp.post("/logout")
@operator_form
def logout():
    session.clear()
    return redirect(url_for(".overview"), 303)


# --- operator actions ---------------------------------------------------------------------------------------


def _set_paused(paused: bool):
    value = _engine().set_paused(paused, _text("reason"), by=session["operator"])
    flash(f"Automation {'paused' if value['paused'] else 'resumed'}.", "info")
    return redirect(url_for(".overview"), 303)


@bp.post("/pause")
@operator_form
def pause():
    return _set_paused(True)


@bp.post("/resume")
@operator_form
def resume():
    return _set_paused(False)


@bp.post("/incidents/<int:incident_id>/steps/<int:step_id>/approve")
@operator_form
def approve(incident_id: int, step_id: int):
    try:
        _engine().approve_step(incident_id, step_id, by=session["operator"])
    except LookupError as exc:
        abort(404, str(exc))
    except ValueError as exc:  # approved meanwhile by someone else, or no longer waiting
        flash(str(exc), "error")
    else:
        flash(f"Step {step_id} approved: it runs on the worker's next look at the incident.", "info")
    return redirect(url_for(".incident", incident_id=incident_id), 303)


@bp.post("/incidents/<int:incident_id>/handled")
@operator_form
def handled(incident_id: int):
    try:
        _engine().mark_handled(incident_id, by=session["operator"], note=_text("note"))
    except LookupError as exc:
        abort(404, str(exc))
    except ValueError as exc:
        flash(str(exc), "error")
    else:
        flash(f"Incident {incident_id} marked handled: Nightshift no longer acts on it.", "info")
    return redirect(url_for(".incident", incident_id=incident_id), 303)
