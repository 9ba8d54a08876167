"""Who may read: the JSON API (``/api/v1/...`` except the webhook) and the UI pages need a reader.

A reader is any of, checked in this order:

- ``access.anonymous_read: true`` (set explicitly; everyone reads);
- ``Authorization: Bearer <token>`` with the viewer token or the operator token (a wrong token is a failed
  authentication in the ``viewer`` realm: 401, then 429 while the address keeps failing);
- a UI login (a session row in the store, see below) as operator or viewer;
- a user named in ``access.proxy_user_header`` by a client whose TCP address is in ``access.proxy_addresses``
  (an authenticating proxy such as oauth2-proxy; the header from any other address is ignored).

``/healthz``, ``/readyz``, ``/metrics`` and the webhook (its own credentials) stay outside this wall.

UI logins are server-side sessions: the signed cookie carries a random session id, the store keeps its SHA-256
with the name, role and expiry (:mod:`app.store.sessions`). Logout revokes the row, so a cookie (and CSRF token)
kept from before the logout is refused afterwards.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flask import current_app, g, request, session

from app.config import Settings, read_secret
from app.domain.errors import ConfigError
from app.store import sessions as session_records
from app.web.auth import bearer, refuse_failure, same_secret

ACCESS_KEY = "nightshift.read_access"
SESSION_LIFETIME = timedelta(hours=12)
OPERATOR, VIEWER = "operator", "viewer"
MAX_PROXY_USER = 100

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ReadAccess:
    """The read credentials configured: tokens (secrets, read once), anonymous reads, the trusted proxy."""

    operator_token: str | None
    viewer_token: str | None
    anonymous: bool
    proxy_header: str | None
    proxy_networks: tuple[Network, ...]

    @classmethod
    def from_settings(cls, settings: Settings, operator_token: str | None) -> ReadAccess:
        section = settings.access
        networks = []
        for text in section.proxy_addresses:
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise ConfigError(
                    f"access.proxy_addresses: {text!r} is not an IP address or network"
                ) from None
        return cls(
            operator_token=operator_token,
            viewer_token=read_secret(section.viewer_token_file, "access.viewer_token_file"),
            anonymous=section.anonymous_read,
            proxy_header=section.proxy_user_header,
            proxy_networks=tuple(networks),
        )

    @property
    def login_enabled(self) -> bool:
        return bool(self.operator_token or self.viewer_token)

    def token_role(self, credential: str) -> str | None:
        """``operator`` or ``viewer`` for a matching token; both compares run, in constant time."""
        operator = self.operator_token is not None and same_secret(credential, self.operator_token)
        viewer = self.viewer_token is not None and same_secret(credential, self.viewer_token)
        return OPERATOR if operator else VIEWER if viewer else None

    def proxy_user(self, remote_addr: str | None, header_value: str | None) -> str | None:
        """The proxy's user, when the header is configured, present and sent from a trusted address."""
        if not (self.proxy_networks and header_value and remote_addr):
            return None
        try:
            address = ipaddress.ip_address(remote_addr)
        except ValueError:
            return None
        if not any(address in network for network in self.proxy_networks):
            return None
        name = "".join(ch for ch in header_value if ch.isprintable())[:MAX_PROXY_USER].strip()
        return name or None


def read_access() -> ReadAccess:
    return current_app.extensions[ACCESS_KEY]


def _session_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("ascii")).hexdigest()


def _now() -> Any:
    return current_app.extensions["nightshift"].engine.deps.clock.now()


def start_session(name: str, role: str) -> None:
    """A fresh session (new id, new CSRF token) for ``name``: no fixation. Expired rows are purged meanwhile."""
    store = current_app.extensions["nightshift"].store
    session_id = secrets.token_urlsafe(32)
    now = _now()
    with store.transaction() as conn:
        session_records.purge_sessions(conn, now)
        session_records.insert_session(
            conn, _session_hash(session_id), name, role, now, now + SESSION_LIFETIME
        )
    session.clear()
    session.permanent = True
    session["sid"] = session_id
    session["csrf"] = secrets.token_urlsafe(32)
    g.nightshift_session = {"name": name, "role": role}


def end_session() -> None:
    """Revoke the session in the store (the cookie is worthless from now on) and clear the cookie."""
    session_id = session.get("sid")
    if isinstance(session_id, str):
        with current_app.extensions["nightshift"].store.transaction() as conn:
            session_records.revoke_session(conn, _session_hash(session_id), _now())
    session.clear()
    g.nightshift_session = None


def current_session() -> dict[str, Any] | None:
    """The live login of this request (``name``, ``role``), looked up once per request; None when logged out."""
    if "nightshift_session" in g:
        return g.nightshift_session
    found = None
    session_id = session.get("sid")
    if isinstance(session_id, str):
        with current_app.extensions["nightshift"].store.read() as conn:
            found = session_records.live_session(conn, _session_hash(session_id), _now())
        if found is None:
            session.pop("sid", None)  # revoked or expired: the cookie no longer names a login
    g.nightshift_session = found
    return found


def current_role() -> str | None:
    found = current_session()
    return str(found["role"]) if found else None


def read_refusal() -> Any:
    """None when this request may read; else the JSON 401 (or 429) that refuses it."""
    from app.web import error

    access = read_access()
    if access.anonymous:
        return None
    credential = bearer(request.headers.get("Authorization"))
    if credential is not None:
        if access.token_role(credential) is not None:
            return None
        return refuse_failure(VIEWER) or _unauthorized("invalid bearer token for reading")
    if current_session() is not None:
        return None
    if access.proxy_header and access.proxy_user(
        request.remote_addr, request.headers.get(access.proxy_header)
    ):
        return None
    if not (access.login_enabled or access.proxy_header):
        return error(
            401,
            "reading needs authentication and none is configured: set access.viewer_token_file or "
            "operator_token_file, access.proxy_user_header with access.proxy_addresses, or "
            "access.anonymous_read: true",
        )
    return _unauthorized(
        "reading needs authentication: Authorization: Bearer <viewer or operator token>, a UI login, "
        "or the authenticating proxy"
    )


def _unauthorized(message: str) -> Any:
    from app.web import error

    response = error(401, message)
    response.headers["WWW-Authenticate"] = 'Bearer realm="nightshift"'
    return response
