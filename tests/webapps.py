"""The real app under test, wired at our own seams (fake actions, fake clock, fake Prometheus) with its credentials:
the webhook's bearer and basic auth, the operator's and a viewer's tokens (:func:`webhook_settings`, :func:`make_app`,
:func:`reader_client`), and the app the hostile-input tests attack, every step whitelisted (:func:`build_app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Flask

from app import create_app
from app.actions.registry import ActionRegistry
from app.clients import Clients
from app.config import Settings
from app.metrics import Metrics
from tests.fakes import FakeClock, FakePrometheus, FakeSample, fake_actions
from tests.worlds import GRANTS, PLAYBOOK

TOKEN = "webhook-s3cret-token"
OPERATOR = "operator-s3cret-token"
VIEWER = "viewer-s3cret-token"
HOSTILE_TOKEN = "hostile-input-webhook-token"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def webhook_settings(tmp_path: Path) -> Settings:
    """Webhook bearer and basic credentials, an operator token and a viewer token, the test playbook."""
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    write(playbooks / "gpu.yaml", PLAYBOOK)
    s = Settings(data_dir=str(tmp_path / "var"), playbook_paths=[str(playbooks)])
    s.webhook.token_file = write(tmp_path / "token", TOKEN + "\n")
    s.webhook.basic_user = "alertmanager"
    s.webhook.basic_password_file = write(tmp_path / "password", "basic-pass")
    s.webhook.max_body_bytes = 64 * 1024
    s.operator_token_file = write(tmp_path / "operator", OPERATOR)
    s.access.viewer_token_file = write(tmp_path / "viewer", VIEWER)
    return s


def make_app(settings: Settings) -> Flask:
    return create_app(
        settings,
        clock=FakeClock(),
        registry=ActionRegistry(fake_actions().values()),
        clients=Clients(settings, prometheus=FakePrometheus()),
        metrics=Metrics(),
    )


def reader_client(app: Flask) -> Any:
    """A test client that reads with the viewer token unless a request sends its own Authorization."""
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {VIEWER}"
    return client


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def build_app(tmp_path: Path, *, store_url: str | None = None, **webhook: Any) -> Flask:
    """The real app (fake actions, fake clock, Prometheus answering every re-check), every step whitelisted."""
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "gpu.yaml").write_text(PLAYBOOK)
    grants = "".join(f"  - action: {name}\n" for name in GRANTS)
    (tmp_path / "permissions.yaml").write_text(
        f"apiVersion: nightshift/v1\nkind: Permissions\nallow:\n{grants}"
    )
    (tmp_path / "token").write_text(HOSTILE_TOKEN)
    settings = Settings(
        data_dir=str(tmp_path / "var"),
        playbook_paths=[str(tmp_path / "playbooks")],
        permissions_file=str(tmp_path / "permissions.yaml"),
        store_url=store_url,
    )
    settings.webhook.token_file = str(tmp_path / "token")
    (tmp_path / "viewer").write_text(VIEWER)
    settings.access.viewer_token_file = str(tmp_path / "viewer")
    settings.episodes.correlation_seconds = 0  # act at once: the episode window is not what these tests probe
    for key, value in webhook.items():
        setattr(settings.webhook, key, value)
    app = make_app(settings)
    app.extensions["nightshift"].engine.deps.clients.prometheus.default = [FakeSample({}, 1.0)]
    return app


def headers(token: str = HOSTILE_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
