"""Notifications: HttpPoster against a Slack-style webhook fake, Mailer against a real SMTP server on loopback
(aiosmtpd), the notify.webhook / notify.email actions and the engine's send_notification.

The webhook fake follows Slack's incoming-webhook contract: JSON body with a non-empty ``text`` (else 400
``no_text``; not JSON → 400 ``invalid_payload``), answer 200 ``ok`` as text/plain.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.header import decode_header, make_header
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import responses
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.actions.base import ActionContext
from app.actions.notify import NotifyEmail, NotifyWebhook, send_notification
from app.clients import Clients
from app.clients.http import HttpPoster
from app.clients.mail import Mailer
from app.config import NotifySettings, Settings
from app.domain import errors
from app.domain.errors import ParamError
from app.domain.paging import Notice
from app.domain.states import NoticeKind
from tests.fixtures.procs import free_port

HOOK = "https://hooks.slack.test/services/T0000/B0000/SECRETxSECRETxSECRET"
SECRET_PART = "SECRETxSECRETxSECRET"


class SlackFake:
    """An incoming webhook: records accepted payloads."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def __call__(self, request) -> tuple[int, dict[str, str], str]:
        try:
            payload = json.loads(request.body)
        except (TypeError, ValueError):
            return 400, {"Content-Type": "text/plain"}, "invalid_payload"
        if request.headers.get("Content-Type") != "application/json" or not isinstance(payload, dict):
            return 400, {"Content-Type": "text/plain"}, "invalid_payload"
        if not isinstance(payload.get("text"), str) or not payload["text"]:
            return 400, {"Content-Type": "text/plain"}, "no_text"
        self.payloads.append(payload)
        return 200, {"Content-Type": "text/plain"}, "ok"


@pytest.fixture
def slack() -> Iterator[SlackFake]:
    fake = SlackFake()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add_callback(responses.POST, HOOK, callback=fake)
        yield fake


# --- a real SMTP server ---


@dataclass
class Mailbox:
    """What the SMTP server accepted, and how it should behave."""

    messages: list[tuple[str, list[str], Message]] = field(default_factory=list)
    refuse: dict[str, str] = field(default_factory=dict)  # recipient → SMTP reply
    data_delay: float = 0.0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        await asyncio.sleep(self.data_delay)
        self.messages.append(
            (envelope.mail_from, list(envelope.rcpt_tos), message_from_bytes(envelope.content))
        )
        return "250 Message accepted for delivery"


def _authenticate(server, session, envelope, mechanism, auth_data) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (b"bot", b"s3cret")
    return AuthResult(success=ok, handled=False)  # handled=False: aiosmtpd answers 535 itself


@dataclass
class SmtpServer:
    host: str
    port: int
    mailbox: Mailbox


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    mailbox = Mailbox()
    controller = Controller(
        mailbox, hostname="127.0.0.1", port=free_port(), authenticator=_authenticate, auth_require_tls=False
    )
    controller.start()
    yield SmtpServer("127.0.0.1", controller.port, mailbox)
    controller.stop()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cert, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            False,
        )
        .sign(key, hashes.SHA256())
    )
    base = tmp_path_factory.mktemp("tls")
    (base / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (base / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return base / "cert.pem", base / "key.pem"


@pytest.fixture
def smtp_tls_server(tls_files: tuple[Path, Path]) -> Iterator[SmtpServer]:
    """SMTP with STARTTLS; AUTH only after TLS (aiosmtpd's default, as on real submission servers)."""
    cert, key = tls_files
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    mailbox = Mailbox()
    controller = Controller(
        mailbox,
        hostname="127.0.0.1",
        port=free_port(),
        authenticator=_authenticate,
        tls_context=context,
        require_starttls=True,
    )
    controller.start()
    yield SmtpServer("127.0.0.1", controller.port, mailbox)
    controller.stop()


# --- HttpPoster ---


def test_post_json_returns_status(slack: SlackFake) -> None:
    assert HttpPoster(timeout=2).post_json(HOOK, {"text": "hello"}, headers={"X-Trace": "1"}) == 200
    assert slack.payloads == [{"text": "hello"}]


def test_post_json_refused_payload_is_backend_error(slack: SlackFake) -> None:
    with pytest.raises(errors.BackendError, match="webhook: HTTP 400: no_text"):
        HttpPoster().post_json(HOOK, {"blocks": []})


def test_redirect_is_not_followed() -> None:
    with responses.RequestsMock() as mock:
        mock.post(HOOK, status=302, headers={"Location": "https://elsewhere.test/"})
        with pytest.raises(errors.BackendError, match="HTTP 302: redirect not followed"):
            HttpPoster().post_json(HOOK, {"text": "x"})


def test_errors_never_show_the_webhook_url() -> None:
    secret_url = f"http://127.0.0.1:{free_port()}/services/T0000/B0000/{SECRET_PART}"
    with pytest.raises(errors.Unavailable) as caught:
        HttpPoster(timeout=1).post_json(secret_url, {"text": "x"})
    assert "Connection refused" in str(caught.value)
    assert SECRET_PART not in str(caught.value)
    with pytest.raises(errors.BackendError) as caught:
        HttpPoster().post_json(f"ftp://x/{SECRET_PART}", {"text": "x"})
    assert str(caught.value) == "webhook: invalid URL"


def test_timeout_after_post_is_outcome_unknown() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/services/{SECRET_PART}"
        with pytest.raises(errors.OutcomeUnknown) as caught:
            HttpPoster(timeout=0.3).post_json(url, {"text": "x"})
    assert SECRET_PART not in str(caught.value)


def test_from_settings_timeout() -> None:
    assert HttpPoster.from_settings(Settings(notify=NotifySettings(timeout_seconds=4))).timeout == 4


# --- Mailer ---


def test_mail_is_delivered(smtp_server: SmtpServer) -> None:
    mailer = Mailer(smtp_server.host, port=smtp_server.port, sender="nightshift@example.org", timeout=5)
    mailer.send(
        ["ops@example.org", "oncall@example.org"], "Incident 7\r\nBcc: evil@x.test", "node1 drained.\n"
    )
    (sender, recipients, message), *_ = smtp_server.mailbox.messages
    assert sender == "nightshift@example.org"
    assert recipients == ["ops@example.org", "oncall@example.org"]
    assert message["Subject"] == "Incident 7 Bcc: evil@x.test"  # the line break is folded, no header injected
    assert message["Bcc"] is None
    assert message["To"] == "ops@example.org, oncall@example.org"
    assert message["Message-ID"].endswith("@example.org>")
    assert message.get_payload(decode=True).splitlines() == [b"node1 drained."]


def test_login_accepted_and_refused(smtp_server: SmtpServer) -> None:
    Mailer(smtp_server.host, port=smtp_server.port, user="bot", password="s3cret", timeout=5).send(
        ["a@b.test"], "s", "t"
    )
    assert len(smtp_server.mailbox.messages) == 1
    with pytest.raises(errors.CredentialRejected, match="login refused: 535"):
        Mailer(smtp_server.host, port=smtp_server.port, user="bot", password="wrong", timeout=5).send(
            ["a@b.test"], "s", "t"
        )
    assert len(smtp_server.mailbox.messages) == 1


def test_starttls_then_login(smtp_tls_server: SmtpServer, tls_files: tuple[Path, Path]) -> None:
    trusted = ssl.create_default_context(cafile=str(tls_files[0]))
    mailer = Mailer(
        smtp_tls_server.host,
        port=smtp_tls_server.port,
        starttls=True,
        user="bot",
        password="s3cret",
        timeout=5,
        tls_context=trusted,
    )
    mailer.send(["a@b.test"], "over tls", "body")
    assert [m[2]["Subject"] for m in smtp_tls_server.mailbox.messages] == ["over tls"]


def test_starttls_with_untrusted_certificate_sends_nothing(smtp_tls_server: SmtpServer) -> None:
    mailer = Mailer(smtp_tls_server.host, port=smtp_tls_server.port, starttls=True, timeout=5)
    with pytest.raises(errors.Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
        mailer.send(["a@b.test"], "s", "t")
    assert not smtp_tls_server.mailbox.messages


def test_starttls_required_but_not_offered(smtp_server: SmtpServer) -> None:
    with pytest.raises(errors.BackendError, match="STARTTLS extension not supported"):
        Mailer(smtp_server.host, port=smtp_server.port, starttls=True, timeout=5).send(["a@b.test"], "s", "t")
    assert not smtp_server.mailbox.messages


def test_recipients_refused(smtp_server: SmtpServer) -> None:
    smtp_server.mailbox.refuse = {
        "gone@b.test": "550 5.1.1 no such user",
        "full@b.test": "452 4.2.2 mailbox full",
    }
    mailer = Mailer(smtp_server.host, port=smtp_server.port, timeout=5)
    with pytest.raises(errors.BackendError, match=r"every recipient was refused: gone@b.test \(550\)"):
        mailer.send(["gone@b.test"], "s", "t")
    with pytest.raises(
        errors.BackendError, match=r"delivered, but these recipients were refused: full@b.test \(452\)"
    ):
        mailer.send(["ok@b.test", "full@b.test"], "s", "t")
    assert [m[1] for m in smtp_server.mailbox.messages] == [["ok@b.test"]]


def test_connection_refused_is_unavailable() -> None:
    with pytest.raises(errors.Unavailable, match="cannot connect"):
        Mailer("127.0.0.1", port=free_port(), timeout=2).send(["a@b.test"], "s", "t")


def test_no_greeting_is_unavailable() -> None:
    # A listening socket that never accepts: TCP connects, the 220 greeting never comes.
    with (
        socket.create_server(("127.0.0.1", 0)) as silent,
        pytest.raises(errors.Unavailable, match="timed out"),
    ):
        Mailer("127.0.0.1", port=silent.getsockname()[1], timeout=0.3).send(["a@b.test"], "s", "t")


def test_timeout_during_data_is_outcome_unknown(smtp_server: SmtpServer) -> None:
    smtp_server.mailbox.data_delay = 2.0
    with pytest.raises(errors.OutcomeUnknown, match="connection lost while sending"):
        Mailer(smtp_server.host, port=smtp_server.port, timeout=0.5).send(["a@b.test"], "s", "t")


def test_header_injection_in_sender_is_refused(smtp_server: SmtpServer) -> None:
    mailer = Mailer(smtp_server.host, port=smtp_server.port, sender="a@b.test\nBcc: evil@x.test")
    with pytest.raises(errors.BackendError, match="cannot build the message"):
        mailer.send(["a@b.test"], "s", "t")
    assert not smtp_server.mailbox.messages


def test_mailer_from_settings(tmp_path) -> None:
    with pytest.raises(errors.ConfigError, match=r"^notify\.smtp_host is not set$"):
        Mailer.from_settings(Settings())
    secret = tmp_path / "smtp-password"
    secret.write_text("s3cret\n")
    mailer = Mailer.from_settings(
        Settings(
            notify=NotifySettings(
                smtp_host="mx", smtp_port=587, smtp_user="bot", smtp_password_file=str(secret)
            )
        )
    )
    assert (mailer.host, mailer.port, mailer.user, mailer.password) == ("mx", 587, "bot", "s3cret")


# --- actions and send_notification ---


def _ctx(notify: NotifySettings, **kwargs: Any) -> ActionContext:
    settings = Settings(notify=notify)
    return ActionContext(settings=settings, clients=Clients(settings), **kwargs)


WEBHOOK = NotifyWebhook()
EMAIL = NotifyEmail()


def test_webhook_action_posts_slack_body_with_context(slack: SlackFake) -> None:
    ctx = _ctx(NotifySettings(), incident_id=7, labels={"alertname": "GpuXidError", "Hostname": "node1"})
    outcome = WEBHOOK.run(WEBHOOK.validate({"url": HOOK, "text": "node1 drained"}), ctx)
    assert (outcome.status, outcome.command, outcome.output) == ("ok", f"POST {HOOK}", "HTTP 200")
    assert slack.payloads == [
        {
            "text": "node1 drained",
            "nightshift": {"incident": 7, "labels": {"alertname": "GpuXidError", "Hostname": "node1"}},
        }
    ]


def test_webhook_action_secret_url_never_in_command(slack: SlackFake, tmp_path) -> None:
    secret = tmp_path / "hook"
    secret.write_text(HOOK + "\n")
    ctx = _ctx(NotifySettings(webhook_url_file=str(secret)))
    params = WEBHOOK.validate({"text": "hi"})
    assert WEBHOOK.plan(params).command == "POST <notify webhook>"
    outcome = WEBHOOK.run(params, ctx)
    assert (outcome.status, outcome.command) == ("ok", "POST <notify webhook>")
    assert len(slack.payloads) == 1


@pytest.mark.parametrize(
    ("status", "outcome_status"),
    [(404, "failed"), (429, "retry"), (500, "failed"), (403, "credential_error")],
)
def test_webhook_action_maps_failures(status: int, outcome_status: str) -> None:
    with responses.RequestsMock() as mock:
        mock.post(HOOK, status=status, body="no_service")
        outcome = WEBHOOK.run(WEBHOOK.validate({"text": "x"}), _ctx(NotifySettings(webhook_url=HOOK)))
    assert outcome.status == outcome_status
    assert SECRET_PART not in outcome.command + outcome.reason


def test_webhook_action_unconfigured_or_unreachable() -> None:
    outcome = WEBHOOK.run(WEBHOOK.validate({"text": "x"}), _ctx(NotifySettings()))
    assert (outcome.status, outcome.reason) == ("failed", "notify.webhook_url is not set")
    down = f"http://127.0.0.1:{free_port()}/hook"
    assert WEBHOOK.run(WEBHOOK.validate({"text": "x", "url": down}), _ctx(NotifySettings())).status == "retry"


def test_webhook_action_schema() -> None:
    assert WEBHOOK.read_only
    with pytest.raises(ParamError, match="longer than 4000"):
        WEBHOOK.validate({"text": "x" * 4001})
    with pytest.raises(ParamError, match="url"):
        WEBHOOK.validate({"text": "x", "url": "http://a.test/ $(id)"})
    with pytest.raises(ParamError, match="text"):
        WEBHOOK.validate({"url": HOOK})


def test_email_action_defaults_to_configured_recipients(smtp_server: SmtpServer) -> None:
    ctx = _ctx(
        NotifySettings(smtp_host=smtp_server.host, smtp_port=smtp_server.port, email_to=["ops@b.test"])
    )
    params = EMAIL.validate({"subject": "Incident 7: node1 drained", "text": "details"})
    assert EMAIL.plan(params).command == "mail to <notify.email_to>: Incident 7: node1 drained"
    outcome = EMAIL.run(params, ctx)
    assert (outcome.status, outcome.command) == ("ok", "mail to ops@b.test: Incident 7: node1 drained")
    assert [m[1] for m in smtp_server.mailbox.messages] == [["ops@b.test"]]
    outcome = EMAIL.run(EMAIL.validate({"to": ["lead@b.test"], "subject": "s", "text": "t"}), ctx)
    assert outcome.status == "ok"
    assert smtp_server.mailbox.messages[-1][1] == ["lead@b.test"]


def test_email_action_without_recipients_or_server() -> None:
    outcome = EMAIL.run(EMAIL.validate({"subject": "s", "text": "t"}), _ctx(NotifySettings(smtp_host="mx")))
    assert (outcome.status, outcome.reason) == ("failed", "no recipients: notify.email_to is not set")
    outcome = EMAIL.run(
        EMAIL.validate({"subject": "s", "text": "t"}), _ctx(NotifySettings(email_to=["a@b.test"]))
    )
    assert (outcome.status, outcome.reason) == ("failed", "notify.smtp_host is not set")


def test_email_action_schema() -> None:
    assert EMAIL.read_only
    with pytest.raises(ParamError, match="subject"):
        EMAIL.validate({"subject": "$(reboot)", "text": "t"})
    with pytest.raises(ParamError, match=r"to\[0\]"):
        EMAIL.validate({"to": ["a@b.test\nBcc: x@y.test"], "subject": "s", "text": "t"})


def test_send_notification_to_every_channel(slack: SlackFake, smtp_server: SmtpServer) -> None:
    settings = Settings(
        notify=NotifySettings(
            webhook_url=HOOK, smtp_host=smtp_server.host, smtp_port=smtp_server.port, email_to=["ops@b.test"]
        )
    )
    data = {
        "incident": 7,
        "opened_at": dt.datetime(2026, 12, 2, tzinfo=dt.UTC),
        "labels": {"Hostname": "node1"},
    }
    outcomes = send_notification(
        Clients(settings),
        settings,
        Notice(NoticeKind.OUTCOME, "Incident 7 recovered", "job 42 is training", data),
    )
    assert [(o.status, o.data["channel"]) for o in outcomes] == [("ok", "webhook"), ("ok", "email")]
    assert slack.payloads == [
        {
            "text": "Incident 7 recovered\njob 42 is training",
            "nightshift": {
                "incident": 7,
                "opened_at": "2026-12-02 00:00:00+00:00",
                "labels": {"Hostname": "node1"},
            },
        }
    ]
    assert smtp_server.mailbox.messages[0][2]["Subject"] == "Incident 7 recovered"


def test_send_notification_never_raises(smtp_server: SmtpServer, tmp_path) -> None:
    settings = Settings(
        notify=NotifySettings(
            webhook_url_file=str(tmp_path / "missing"),
            smtp_host=smtp_server.host,
            smtp_port=smtp_server.port,
            email_to=["ops@b.test"],
        )
    )
    outcomes = send_notification(Clients(settings), settings, Notice(NoticeKind.OUTCOME, "s", "t", {}))
    assert [(o.status, o.data["channel"]) for o in outcomes] == [("failed", "webhook"), ("ok", "email")]
    assert "notify.webhook_url_file: cannot read secret file" in outcomes[0].reason

    down = Settings(
        notify=NotifySettings(
            webhook_url=HOOK.replace("https://hooks.slack.test", f"http://127.0.0.1:{free_port()}")
        )
    )
    [outcome] = send_notification(Clients(down), down, Notice(NoticeKind.OUTCOME, "s", "t", {}))
    assert (outcome.status, outcome.command) == ("retry", "POST <notify webhook>")
    assert SECRET_PART not in outcome.reason


def test_send_notification_without_channels() -> None:
    settings = Settings(notify=NotifySettings(email_to=["ops@b.test"]))  # recipients but no SMTP host
    assert send_notification(Clients(settings), settings, Notice(NoticeKind.OUTCOME, "s", "t", {})) == []


# --- every channel clipped to its limit, each sent once (issue 22 item 2) --------------------------------

BIG_LABELS = {f"label_{i:03d}": "<&>" * 933 for i in range(190)}  # 190 labels of 2,799 characters to escape
BIG_TEXTS = {
    "plain": "x" * 900_000,
    "markup": "<&>" * 300_000,  # escaping triples it
    "entities_at_the_cut": "a" * 39_990 + "&" * 100,
    "non_ascii": "山\u202e" * 450_000,
}


@pytest.mark.parametrize("text", BIG_TEXTS.values(), ids=BIG_TEXTS.keys())
def test_a_huge_notice_is_clipped_for_chat_and_mail(slack: SlackFake, smtp_server: SmtpServer, text) -> None:
    settings = Settings(
        notify=NotifySettings(
            webhook_url=HOOK, smtp_host=smtp_server.host, smtp_port=smtp_server.port, email_to=["ops@b.test"]
        )
    )
    data = {"incident": 7, "outcome": "failed", "labels": BIG_LABELS}
    outcomes = send_notification(
        Clients(settings), settings, Notice(NoticeKind.OUTCOME, "S" * 5000, text, data)
    )
    assert [(o.status, o.data["channel"]) for o in outcomes] == [("ok", "webhook"), ("ok", "email")]
    (payload,) = slack.payloads
    assert len(payload["text"]) <= 40_000
    assert "&" not in payload["text"][-8:] or payload["text"][-8:].count(";") >= payload["text"][-8:].count(
        "&"
    )
    assert len(json.dumps(payload)) < 256 * 1024
    message = smtp_server.mailbox.messages[0][2]
    content = message.get_payload(decode=True).decode(message.get_content_charset() or "utf-8")
    subject = str(make_header(decode_header(message["Subject"])))
    assert len(content.rstrip("\r\n")) <= 100_000 and len(subject) <= 250


def test_channels_that_delivered_are_skipped(slack: SlackFake, smtp_server: SmtpServer) -> None:
    settings = Settings(
        notify=NotifySettings(
            webhook_url=HOOK, smtp_host=smtp_server.host, smtp_port=smtp_server.port, email_to=["ops@b.test"]
        )
    )
    notice = Notice(NoticeKind.OUTCOME, "s", "t", {"incident": 1})
    outcomes = send_notification(Clients(settings), settings, notice, skip={"webhook"})
    assert [o.data["channel"] for o in outcomes] == ["email"] and slack.payloads == []


def test_a_retried_finalisation_sends_each_channel_once_and_ledgers_the_failures_reason(tmp_path) -> None:
    from tests.payloads import alert, xid
    from tests.worlds import make_world

    w = make_world(tmp_path)
    settings = w.engine.deps.settings
    settings.notify.smtp_host, settings.notify.smtp_port = "127.0.0.1", free_port()  # nothing listens: fails
    settings.notify.email_to = ["ops@b.test"]
    (incident_id,) = w.send(alert(xid())).opened
    for _ in range(8):  # past every finalisation retry
        w.run()
        w.clock.advance(seconds=settings.guards.defer_seconds + 1)
    outcome_notices = [text for _, text in w.notifications if text.startswith("[nightshift] advisory")]
    assert len(outcome_notices) == 1, outcome_notices
    emails = [r for r in w.ledger(incident_id, "notification") if r["data"].get("channel") == "email"]
    assert len(emails) >= 2 and all(r["data"]["status"] != "ok" and r["data"]["reason"] for r in emails)
