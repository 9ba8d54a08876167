"""What ``nightshift serve`` refuses before it opens the store, in one function that ``nightshift check-config``
calls too: check-config passes exactly the settings that serve starts with (the Helm chart runs it first).

Reads the files the settings name (secrets, playbooks, permissions); touches no store, network or cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from app.actions import default_registry
from app.actions.registry import ActionRegistry
from app.config import Settings, local_files, read_secret
from app.domain.errors import ConfigError
from app.domain.permissions import Permissions, load_permissions
from app.domain.playbooks import PlaybookSet, load_playbooks
from app.domain.retention import check_windows
from app.web.access import ReadAccess
from app.web.auth import WebhookAuth, check_operator_token


@dataclass(frozen=True)
class Checked:
    """What the checks loaded, for the server to use as it is."""

    webhook_auth: WebhookAuth
    operator_token: str | None
    playbooks: PlaybookSet
    permissions: Permissions


def preflight(settings: Settings, registry: ActionRegistry | None = None) -> Checked:
    """ConfigError (``file:line`` where there is one) for the first thing that stops ``serve``: a file the settings
    name that this user cannot read, webhook authentication missing or the public example token, the operator
    token equal to the webhook's, read access misconfigured, a playbook or the permissions file invalid, a
    retention shorter than a guard's window."""
    for name, path in local_files(settings):
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{name}: {path}: cannot read it (missing, or not readable by this user)")
    webhook_auth = WebhookAuth.from_settings(settings)
    operator_token = read_secret(settings.operator_token_file, "operator_token_file")
    check_operator_token(settings, webhook_auth, operator_token)
    ReadAccess.from_settings(settings, operator_token)
    registry = registry or default_registry()
    playbooks = load_playbooks(settings.playbook_paths, registry, settings.schedulers)
    check_windows(settings, playbooks.playbooks)
    return Checked(
        webhook_auth=webhook_auth,
        operator_token=operator_token,
        playbooks=playbooks,
        permissions=load_permissions(settings.permissions_file, registry),
    )
