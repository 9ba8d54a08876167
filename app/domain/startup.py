"""What a starting Nightshift says it is configured to do, and what not: one INFO line per item, so the first
screen of a new install answers "will it act?", "can it re-check?", "can anyone read?". Pure: the caller logs.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

from app.config import Settings
from app.domain import schedulers
from app.domain.permissions import Permissions


def startup_summary(
    settings: Settings, playbooks: int, permissions: Permissions, set_aside: int = 0
) -> list[str]:
    """The summary lines for ``settings`` with ``playbooks`` loaded and ``permissions`` granted; ``set_aside``:
    the playbooks read but not loaded, as they act on a scheduler outside ``settings.schedulers``."""
    granted = sorted({grant.action for grant in permissions.grants})
    if granted:
        mode = f"mode: active: {len(granted)} action(s) granted by {settings.permissions_file} ({', '.join(granted)})"
    else:
        mode = "mode: advisory: nothing is granted (permissions_file unset or empty): every change is 'would run'"
    if settings.guards.kill_switch:
        mode += "; guards.kill_switch is on: nothing acts"
    lines = [
        mode,
        f"playbooks: {playbooks} for {', '.join(settings.schedulers)} from {', '.join(settings.playbook_paths)}"
        + (f" ({set_aside} for other schedulers not loaded)" if set_aside else ""),
        f"store: {_without_password(settings.resolved_store_url)}",
        (
            f"prometheus: {settings.prometheus.url}"
            if settings.prometheus.url
            else "prometheus: unset (prometheus.url): re-checks and verification cannot run, so incidents "
            "whose playbook has one are held"
        ),
        *(
            f"{s.name}: "
            + (s.connection(settings) if s.name in settings.schedulers else "not acted on (schedulers)")
            for s in schedulers.SCHEDULERS.values()
        ),
        "retention: " + _retention(settings),
        "reads: " + _reads(settings),
        "webhook: "
        + (
            "UNAUTHENTICATED (webhook.auth_disabled: true)"
            if settings.webhook.auth_disabled
            else "bearer token"
            if settings.webhook.token_file
            else "basic auth"
        ),
    ]
    return lines


def credential_states(settings: Settings, readable: Callable[[str], bool]) -> dict[str, dict[str, str]]:
    """Per scheduler, what its credentials are before any use: ``{"state", "reason"}``
    (:data:`app.domain.schedulers.CREDENTIAL_STATES`); one the settings do not act on is ``unset``."""
    states = {}
    for name, scheduler in schedulers.SCHEDULERS.items():
        acted_on = name in settings.schedulers
        state, reason = (
            scheduler.credentials(settings, readable) if acted_on else ("unset", "not acted on (schedulers)")
        )
        states[name] = {"state": state, "reason": reason}
    return states


def _retention(settings: Settings) -> str:
    r = settings.retention
    if not r.enabled:
        return "off (retention.enabled: false): the store keeps everything"
    return f"closed incidents {r.incidents_days} days, alerts {r.alerts_days} days" + (
        f", exported to {r.export_dir} before deletion" if r.export_dir else ""
    )


def _reads(settings: Settings) -> str:
    access = settings.access
    if access.anonymous_read:
        return "OPEN to anyone (access.anonymous_read: true)"
    ways = [
        name
        for name, on in (
            ("viewer token", access.viewer_token_file),
            ("operator token", settings.operator_token_file),
            (f"proxy header {access.proxy_user_header}", access.proxy_user_header),
        )
        if on
    ]
    if not ways:
        return (
            "closed: no viewer token, operator token or proxy is set, so nobody can read the API or the UI "
            "(set access.viewer_token_file; `nightshift init` writes one)"
        )
    return "with " + ", ".join(ways)


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
