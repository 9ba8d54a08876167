"""Planted secrets never show up in logs (every logger at DEBUG, and a real `nightshift serve`'s output) nor in the
ledger (the store, and `nightshift export`), while every one of them is really used: the webhook token and basic
password authenticate, the operator token pauses, the webhook URL from its file is posted to (and, moved to a
closed port, fails), the SMTP password is offered to a real SMTP server (which refuses it).

SSH host-key verification (RejectPolicy) is proven against the real sshd in tests/integration/test_ssh_client.py
(test_unknown_host_key_is_refused, test_changed_host_key_is_refused).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from app.config import load_settings
from app.store import records
from tests.fixtures.procs import free_port, wait_until
from tests.fixtures.serve import (
    HookSink,
    running_hook_sink,
    start_serve,
    wait_ready,
    write_settings,
)
from tests.payloads import alert, body, xid
from tests.webapps import make_app
from tests.worlds import PLAYBOOK

# A real playbook for the real server: its read-only step posts to the configured (secret) webhook URL.
NOTICE_PLAYBOOK = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: xid-notice, description: "tell the on-call channel"}
match: ['alertname="GpuXidError"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}"}
steps:
  - action: notify.webhook
    with: {text: "Xid on {{ target.node }}"}
"""
SECRETS = {
    "webhook_token": "wh-tok-7Qm2XbZ9pL4s",
    "basic_password": "basic-pw-Vn3Jr8Kd1Tq6",
    "operator_token": "op-tok-Hs5Wc0Ye2Ga9",
    "webhook_url_path": "T0NIGHT/B0SHIFT/xoxb-Ur4Lk7Pe1Zn3",
    "smtp_password": "smtp-pw-Fd6Mb2Qs8Xw4",
}


@dataclass
class SmtpAuthLog:
    """A real SMTP server that refuses every login, remembering the passwords it was offered."""

    port: int
    offered: list[str] = field(default_factory=list)

    def authenticate(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        if isinstance(data, LoginPassword):
            self.offered.append(data.password.decode())
        return AuthResult(success=False, handled=False)  # aiosmtpd answers 535 itself


@pytest.fixture
def smtp() -> Iterator[SmtpAuthLog]:
    log = SmtpAuthLog(free_port())

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            return "250 accepted"

    controller = Controller(
        Handler(), hostname="127.0.0.1", port=log.port, authenticator=log.authenticate, auth_require_tls=False
    )
    controller.start()
    yield log
    controller.stop()


@pytest.fixture
def hook_sink() -> Iterator[HookSink]:
    with running_hook_sink() as sink:
        yield sink


def plant(directory: Path, sink: HookSink, smtp: SmtpAuthLog) -> dict[str, Any]:
    """Secret files under ``directory``; the settings (as a settings-file mapping) that name them."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "webhook_token": SECRETS["webhook_token"],
        "basic_password": SECRETS["basic_password"],
        "operator_token": SECRETS["operator_token"],
        "webhook_url": sink.url("/services/" + SECRETS["webhook_url_path"]),
        "smtp_password": SECRETS["smtp_password"],
    }
    for name, value in files.items():
        (directory / name).write_text(value + "\n")
    return {
        "operator_token_file": str(directory / "operator_token"),
        "webhook": {
            "token_file": str(directory / "webhook_token"),
            "basic_user": "alertmanager",
            "basic_password_file": str(directory / "basic_password"),
        },
        "notify": {
            "webhook_url_file": str(directory / "webhook_url"),
            "smtp_host": "127.0.0.1",
            "smtp_port": smtp.port,
            "smtp_user": "nightshift",
            "smtp_password_file": str(directory / "smtp_password"),
            "email_to": ["oncall@example.com"],
            "timeout_seconds": 5,
        },
    }


def assert_no_secret(text: str, where: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name} leaked into {where}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def basic() -> dict[str, str]:
    pair = base64.b64encode(f"alertmanager:{SECRETS['basic_password']}".encode()).decode()
    return {"Authorization": f"Basic {pair}", "Content-Type": "application/json"}


def test_secrets_stay_out_of_logs_responses_and_the_ledger(tmp_path, hook_sink, smtp, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, urllib3 and the mail client included
    planted = plant(tmp_path / "secrets", hook_sink, smtp)
    settings = write_settings(tmp_path / "app", PLAYBOOK, episodes={"correlation_seconds": 0}, **planted)
    app = make_app(load_settings(settings, env={}))  # job incidents act (and notify) at once
    client = app.test_client()
    engine = app.extensions["nightshift"].engine
    responses = [
        client.post("/api/v1/alerts", data=body(alert(xid())), headers=bearer(SECRETS["webhook_token"])),
        client.post("/api/v1/alerts", data=body(alert(xid(node="node2", job="22"))), headers=basic()),
        client.post("/api/v1/alerts", data=body(alert(xid())), headers=bearer("wrong-token")),
        client.post("/api/v1/pause", json={"reason": "x"}, headers=bearer(SECRETS["webhook_token"])),
        client.post("/api/v1/pause", json={"reason": "drill"}, headers=bearer(SECRETS["operator_token"])),
        client.post("/api/v1/resume", headers=bearer(SECRETS["operator_token"])),
        client.post("/api/v1/incidents/99/handled", headers=bearer(SECRETS["operator_token"])),
    ]
    assert [r.status_code for r in responses] == [200, 200, 401, 401, 200, 200, 404]
    engine.run_until_idle()  # advisory (nothing whitelisted): each outcome is announced by webhook and email
    # The webhook URL moves to a closed port: the next notification fails, and its error is ledgered.
    Path(planted["notify"]["webhook_url_file"]).write_text(
        f"http://127.0.0.1:{free_port()}/services/{SECRETS['webhook_url_path']}"
    )
    client.post("/api/v1/alerts", data=body(alert(xid(node="node3", job="33"))), headers=basic())
    engine.run_until_idle()

    with app.extensions["nightshift"].store.transaction() as conn:
        ledger = [json.dumps(row.as_dict(), default=str) for row in records.iter_ledger(conn)]
    notifications = [row for row in ledger if '"kind": "notification"' in row]
    # Every secret was used: the sink got the posts, the SMTP server was offered the password, and both
    # failures (closed webhook port, refused login) reached the ledger.
    assert hook_sink.bodies("/services/" + SECRETS["webhook_url_path"])
    assert SECRETS["smtp_password"] in smtp.offered
    assert any("Connection refused" in row for row in notifications)
    assert any("login refused: 535" in row for row in notifications)
    assert_no_secret("\n".join(ledger), "the ledger")
    ours = [r for r in caplog.records if not r.name.startswith("mail.log")]  # not the test SMTP server's
    assert_no_secret("\n".join(logging.Formatter().format(r) for r in ours), "the logs")
    for response in responses:
        assert_no_secret(response.get_data(as_text=True), "an HTTP response")


@pytest.mark.integration
def test_secrets_stay_out_of_a_real_servers_output_and_the_export(tmp_path, hook_sink, smtp):
    planted = plant(tmp_path / "secrets", hook_sink, smtp)
    # Job incidents act at once (no correlation window): the notices this test reads go out within its wait.
    config = write_settings(
        tmp_path / "serve", NOTICE_PLAYBOOK, episodes={"correlation_seconds": 0}, **planted
    )
    serve = start_serve(config, "serve", workers=2, threads=2, env={"NIGHTSHIFT_LOG_LEVEL": "DEBUG"})
    try:
        wait_ready(serve)
        url = serve.url
        answers = [
            requests.post(
                f"{url}/api/v1/alerts",
                data=body(alert(xid())),
                headers=bearer(SECRETS["webhook_token"]),
                timeout=10,
            ),
            requests.post(
                f"{url}/api/v1/alerts", data=body(alert(xid(node="n2", job="2"))), headers=basic(), timeout=10
            ),
            requests.post(
                f"{url}/api/v1/pause",
                json={"reason": "d"},
                headers=bearer(SECRETS["operator_token"]),
                timeout=10,
            ),
            requests.post(f"{url}/api/v1/resume", headers=bearer(SECRETS["operator_token"]), timeout=10),
        ]
        assert [a.status_code for a in answers] == [200, 200, 200, 200]
        # Per incident: the playbook's notify.webhook step and the outcome summary, both to the secret URL.
        secret_path = "/services/" + SECRETS["webhook_url_path"]
        wait_until(lambda: len(hook_sink.bodies(secret_path)) >= 4, 30, "four webhook posts")
        wait_until(lambda: len(smtp.offered) >= 2, 30, "SMTP logins")
    finally:
        serve.daemon.stop()
    exported = subprocess.run(
        [sys.executable, "-m", "app.cli", "export", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NIGHTSHIFT_LOG_LEVEL": "DEBUG"},
        check=True,
    )
    assert '"kind": "notification"' in exported.stdout and "login refused" in exported.stdout
    assert_no_secret(exported.stdout + exported.stderr, "nightshift export")
    log = serve.daemon.log_path.read_text()
    assert "DEBUG" in log and "POST /api/v1/alerts" in log
    assert_no_secret(log, "the server's output")
