"""Operator web UI: server-rendered pages (overview, incident, history, lemon nodes) and the operator's forms.

Reading needs a reader (:mod:`app.web.access`): a page asked for without one redirects to ``/login``. Acting
(pause/resume, approve a step, mark an incident handled) needs an operator login. Browsers send no bearer header
from a form, so ``/login`` takes the operator token (or the viewer token, for reading only) once, compares it in
constant time, and starts a server-side session: the signed cookie (HttpOnly, SameSite=Strict, Secure when
``external_url`` is https) names a session row in the store that expires after 12 hours and that logout revokes.
The cookie's signing key is derived from the tokens, so rotating one ends every session too. Every form carries the
session's CSRF token. Without an operator token the forms are hidden and their routes answer 403. Pages need no
JavaScript; Jinja autoescapes everything, and a Content-Security-Policy forbids scripts anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Callable
from functools import partial, wraps
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

from app.domain import schedulers
from app.domain.checkpoint_advice import NoAdvice
from app.domain.errors import StoreUnavailable
from app.domain.params import NODE_NAME
from app.engine import Engine, checkpoint_facts
from app.web import int_arg, plain_text, views
from app.web.access import (
    ACCESS_KEY,
    OPERATOR,
    SESSION_LIFETIME,
    current_session,
    end_session,
    read_access,
    read_refusal,
    start_session,
)
from app.web.auth import bearer, refuse_failure, same_secret

log = logging.getLogger(__name__)

bp = Blueprint(
    "ui", __name__, template_folder="templates", static_folder="static", static_url_path="/ui-static"
)

SESSION_KEY_CONTEXT = b"nightshift ui session key v2"
HISTORY_FILTERS = ("node", "job", "playbook", "outcome")
HISTORY_PAGE = 50
JOB_PAGE = 50  # incidents listed on a job's page, newest first
OPERATOR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@ -]{0,63}")
# Where a login may send the browser back to: a path on this site, never another host (no "//", no scheme).
LOCAL_PATH = re.compile(r"/(?![/\\])[A-Za-z0-9/_.?=&%-]*")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",  # for browsers that ignore CSP frame-ancestors
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


@bp.record_once
def _configure_sessions(state: BlueprintSetupState) -> None:
    """Session cookie settings, and a signing key derived from the tokens (none without a token)."""
    app = state.app
    services = app.extensions["nightshift"]
    access = app.extensions[ACCESS_KEY]
    tokens = "\0".join(token or "" for token in (access.operator_token, access.viewer_token))
    if access.login_enabled and not app.secret_key:
        app.secret_key = hmac.new(tokens.encode("utf-8"), SESSION_KEY_CONTEXT, hashlib.sha256).hexdigest()
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
    return (
        isinstance(expected, str)
        and bool(expected)
        and same_secret(request.form.get("csrf_token", ""), expected)
    )


def operator_form(view: Any) -> Any:
    """A form post that changes something: operator token configured (403), logged in (401) as an operator (a
    viewer: 403), CSRF token (403)."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _operator_token() is None:
            abort(403, "operator actions are disabled: set operator_token_file in the settings")
        login = current_session()
        if login is None:
            abort(401, "log in with the operator token first")
        if login["role"] != OPERATOR:
            abort(403, "logged in as a viewer, who may read but not act: log in with the operator token")
        if not _csrf_ok():
            abort(403, "missing or invalid CSRF token: reload the page and try again")
        return view(*args, **kwargs)

    wrapper.operator_only = True  # type: ignore[attr-defined]  # checks its own login: outside the read wall
    return wrapper


def _text(name: str, limit: int = 500) -> str:
    """A free-text form field, printable characters only, bounded."""
    return plain_text(request.form.get(name, ""), limit)


def _operator_name() -> str:
    login = current_session()
    return str(login["name"]) if login else ""


@bp.before_request
def _readers_only() -> Any:
    """Every page but the login (and the static files) needs a reader; a browser without one goes to log in."""
    view = current_app.view_functions.get(request.endpoint or "")
    if request.endpoint in ("ui.login", "ui.logout", "ui.static") or getattr(view, "operator_only", False):
        return None
    refusal = read_refusal()
    if refusal is None or bearer(request.headers.get("Authorization")) is not None:
        return refusal
    if request.method == "GET":
        return redirect(url_for(".login", next=request.full_path.rstrip("?")), 303)
    return refusal


@bp.context_processor
def _template_context() -> dict[str, Any]:
    login = current_session()
    return {
        "operator_enabled": _operator_token() is not None,
        "login_enabled": read_access().login_enabled,
        "operator": login["name"] if login and login["role"] == OPERATOR else None,
        "viewer": login["name"] if login and login["role"] != OPERATOR else None,
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


@bp.get("/incidents/<id:incident_id>")
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


@bp.get("/jobs/<job>")
def job(job: str):
    """One job: its state, the checkpoint interval advised for it (app/domain/checkpoint_advice.py) and its
    incidents."""
    engine = _engine()
    incidents = engine.incidents(job=job[:255], limit=JOB_PAGE)
    if not incidents:
        abort(404, f"no incident of job {job[:255]}")
    target = {key: str(value) for key, value in (incidents[0].get("target") or {}).items()}
    identity = checkpoint_facts.job_identity(
        target.get("scheduler", schedulers.DEFAULT.name), {**target, "job": job}
    )
    gpus = int_arg(
        "gpus_per_node", checkpoint_facts.DEFAULT_GPUS_PER_NODE, 1, checkpoint_facts.MAX_GPUS_PER_NODE
    )
    if isinstance(identity, str):
        advice = views.advice_view(None, f"no advice for this job: {identity}")
    else:
        found = checkpoint_facts.job_advice(engine.deps, *identity, gpus)
        advice = views.advice_view(
            *((None, found.reason) if isinstance(found, NoAdvice) else (found.as_dict(),))
        )
    status = engine.status()
    jobs = engine.job_incidents()
    state = next(
        (j for j in views.job_views(jobs["latest"], jobs["open"], status["credentials"]) if j.job == job),
        None,
    )
    return render_template(
        "job.html", job=job, state=state, advice=advice, gpus_per_node=gpus, incidents=incidents
    )


@bp.get("/history")
def history():
    engine = _engine()
    filters = {name: request.args.get(name, "").strip()[:255] for name in HISTORY_FILTERS}
    limit = int_arg("limit", HISTORY_PAGE, 1, 500) or HISTORY_PAGE
    before = int_arg("before", None, 1, 2**62)
    rows = engine.incidents(
        limit=limit + 1, before_id=before, **{name: value for name, value in filters.items() if value}
    )
    shown, next_before = views.page(rows, limit)
    active: dict[str, Any] = {name: value for name, value in filters.items() if value}
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
    days = int_arg("days", 7, 1, 365) or 7
    data = _engine().node_remediations(days)
    return render_template(
        "nodes.html",
        nodes=views.lemon_nodes(data["attempts"], data["incidents"]),
        repairs=[views.repair_view(row) for row in _engine().repairs.nodes()["nodes"]],
        days=days,
        since=data["since"],
    )


def _released(release: Callable[..., Any], done: str, page: str) -> Any:
    """An operator's release from a page's form: ``release(by=, note=)``; 404 for what is not there, the refusal
    (ValueError) or ``done`` flashed, then back to ``page``."""
    try:
        release(by=_operator_name(), note=_text("note"))
    except LookupError as exc:
        abort(404, str(exc))
    except ValueError as exc:
        flash(str(exc), "error")
    else:
        flash(done, "info")
    return redirect(url_for(page), 303)


@bp.post("/nodes/<node>/release")
@operator_form
def release_node(node: str):
    release = partial(_engine().repairs.release, node)
    return _released(release, f"Node {node} released: Nightshift returns what it took out.", ".nodes")


@bp.post("/nodes/hold")
@operator_form
def hold_node():
    node = _text("node", 253)
    if not re.fullmatch(NODE_NAME, node):
        abort(400, "node: not a node name")
    try:
        _engine().repairs.hold(node, by=_operator_name(), note=_text("note"))
    except ValueError as exc:
        flash(str(exc), "error")
    else:
        flash(f"Node {node} held: Nightshift will not repair or return it until released.", "info")
    return redirect(url_for(".nodes"), 303)


@bp.get("/fleet")
def fleet():
    fleet = _engine().fleet
    return render_template(
        "fleet.html", incidents=fleet.fleet_incidents(limit=100), topology=fleet.source.view()
    )


@bp.post("/fleet/<key>/release")
@operator_form
def release_fleet(key: str):
    done = f"Fleet incident {key} released: its held jobs restart, spread over the release jitter."
    return _released(partial(_engine().fleet.release, key), done, ".fleet")


# --- login --------------------------------------------------------------------------------------------------


def _local_next(value: str | None) -> str:
    return value if value and LOCAL_PATH.fullmatch(value) else url_for(".overview")


@bp.route("/login", methods=["GET", "POST"])
def login():
    access = read_access()
    if not access.login_enabled:
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
    role = access.token_role(request.form.get("token", ""))
    if role is None:
        throttled = refuse_failure(OPERATOR)
        if throttled is not None:
            return throttled
        log.warning("ui login refused for %r from %s: wrong token", name, request.remote_addr)
        return render_template("login.html", next_url=next_url, error="Wrong token.", name=name), 401
    start_session(name, role)  # a fresh session (and CSRF token) on every login: no fixation
    log.info("ui login: %s as %s from %s", name, role, request.remote_addr)
    flash(f"Logged in as {name} ({role}).", "info")
    return redirect(next_url, 303)


@bp.post("/logout")
def logout():
    if current_session() is None:
        abort(401, "not logged in")
    if not _csrf_ok():
        abort(403, "missing or invalid CSRF token: reload the page and try again")
    end_session()
    return redirect(url_for(".overview"), 303)


# --- operator actions ---------------------------------------------------------------------------------------


def _set_paused(paused: bool):
    value = _engine().set_paused(paused, _text("reason"), by=_operator_name())
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


@bp.post("/incidents/<id:incident_id>/steps/<id:step_id>/approve")
@operator_form
def approve(incident_id: int, step_id: int):
    try:
        _engine().approve_step(incident_id, step_id, by=_operator_name())
    except LookupError as exc:
        abort(404, str(exc))
    except ValueError as exc:  # approved meanwhile by someone else, or no longer waiting
        flash(str(exc), "error")
    else:
        flash(f"Step {step_id} approved: it runs on the worker's next look at the incident.", "info")
    return redirect(url_for(".incident", incident_id=incident_id), 303)


@bp.post("/incidents/<id:incident_id>/handled")
@operator_form
def handled(incident_id: int):
    try:
        _engine().mark_handled(incident_id, by=_operator_name(), note=_text("note"))
    except LookupError as exc:
        abort(404, str(exc))
    except ValueError as exc:
        flash(str(exc), "error")
    else:
        flash(f"Incident {incident_id} marked handled: Nightshift no longer acts on it.", "info")
    return redirect(url_for(".incident", incident_id=incident_id), 303)
