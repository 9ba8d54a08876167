"""Notifications: a Slack-compatible webhook and email, as playbook actions and as the engine's summary.

Slack incoming-webhook URLs are secrets (anyone holding one can post), so a URL taken from settings never
appears in a plan, a command or an error message: those show ``POST <notify webhook>``.

Label-derived text is escaped for each channel's markup: for the Slack-compatible webhook ``&``, ``<`` and ``>``
become entities (:func:`slack_escape`), so a label cannot write ``<!channel>`` or a disguised link
``<https://evil.example|Approve>``. In a playbook's ``text`` only the substituted values are escaped (the author's
own links stay links); the engine's summaries are escaped whole. Email headers: :mod:`app.clients.mail`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from app.actions.base import Action, ActionContext, Plan
from app.config import read_secret
from app.domain.clipping import ELLIPSIS, clip_data, clip_text
from app.domain.errors import BackendError, ConfigError
from app.domain.outcome import Failed, Ok, Outcome, outcome_from_error
from app.domain.paging import Notice, page_for
from app.domain.params import SAFE_TEXT, URL, Param

if TYPE_CHECKING:
    from app.clients import Clients
    from app.config import Settings

EMAIL = r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?"
CONFIGURED_WEBHOOK = "<notify webhook>"
MAX_TEXT = 4000
# Slack truncates a message's text past 40,000 characters (api.slack.com/changelog/2018-04-truncating-really-long-
# messages; the chat.postMessage reference gives the same limit for ``text``): the engine's notices are clipped to
# it, entities counted, so the cut is ours and ends with an ellipsis.
MAX_SLACK_TEXT = 40_000
# Mail has no protocol limit on a body, but servers do (Postfix's message_size_limit defaults to 10,240,000 bytes,
# Exchange Online's to 25 MB): a notice's body is clipped to 100,000 characters (at most 400 KB of UTF-8), far under
# them and still a long read; the subject to 250 characters (RFC 5322 lines: 998).
MAX_MAIL_TEXT = 100_000
MAX_MAIL_SUBJECT = 250


def slack_escape(text: str) -> str:
    """``text`` as Slack mrkdwn shows it literally: ``&``, ``<`` and ``>`` as entities (Slack's own rule)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class NotifyWebhook(Action):
    """POST ``{"text": ..., "nightshift": {"incident": id, "labels": {...}}}`` to a Slack-style webhook."""

    name = "notify.webhook"
    description = "Post a message to a Slack-compatible incoming webhook"
    read_only = True
    params = {
        "url": Param(
            pattern=URL,
            required=False,
            max_length=2000,
            literal=True,  # a URL taken from an alert's labels could send incident data anywhere
            description="default: notify.webhook_url; written out, never templated",
        ),
        "text": Param(
            max_length=MAX_TEXT, prose=True, escape=slack_escape, description="message text (Slack mrkdwn)"
        ),
    }

    def plan(self, params: Mapping[str, Any]) -> Plan:
        return Plan(
            summary="post a message to the webhook", command=f"POST {params.get('url', CONFIGURED_WEBHOOK)}"
        )

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        body = {
            "text": params["text"],
            "nightshift": {"incident": ctx.incident_id, "labels": dict(ctx.labels)},
        }
        return _deliver(
            self.plan(params).command,
            "webhook",
            lambda: _post(ctx.clients, params.get("url") or configured_webhook_url(ctx.settings), body),
        )


class NotifyEmail(Action):
    """Send a plain-text email through the configured SMTP server."""

    name = "notify.email"
    description = "Send an email (default recipients: notify.email_to)"
    read_only = True
    params = {
        "to": Param(
            kind="list", pattern=EMAIL, required=False, max_length=320, description="default: notify.email_to"
        ),
        "subject": Param(pattern=SAFE_TEXT, prose=True, description="subject line"),
        "text": Param(max_length=20_000, prose=True, description="message body"),
    }

    def plan(self, params: Mapping[str, Any]) -> Plan:
        recipients = ", ".join(params.get("to") or ["<notify.email_to>"])
        return Plan(summary="send an email", command=_mail_command(recipients, params["subject"]))

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        to = list(params.get("to") or ctx.settings.notify.email_to)
        command = _mail_command(", ".join(to), params["subject"])
        if not to:
            return Failed(reason="no recipients: notify.email_to is not set", command=command)
        return _deliver(command, "email", lambda: _mail(ctx.clients, to, params["subject"], params["text"]))


def slack_text(text: str, limit: int = MAX_SLACK_TEXT) -> str:
    """``text`` escaped (:func:`slack_escape`) and clipped to ``limit`` characters without cutting an entity."""
    escaped = slack_escape(text)
    if len(escaped) <= limit:
        return escaped
    cut = escaped[: limit - 1]
    entity = cut.rfind("&")
    if entity >= 0 and ";" not in cut[entity:]:
        cut = cut[:entity]
    return cut + ELLIPSIS


def send_notification(
    clients: Clients, settings: Settings, notice: Notice, skip: Collection[str] = ()
) -> list[Outcome]:
    """Send the notice's subject and text to every configured channel: one outcome per channel (webhook, email,
    then PagerDuty when :func:`app.domain.paging.page_for` says the notice needs a person), each clipped to its
    channel's limit. ``skip``: channels that already delivered this notice (a retried finalisation sends each once).

    Never raises: a missing secret, an unreachable server or a refusal is that channel's outcome. The webhook
    body carries ``data`` (made JSON-safe, labels clipped: :func:`app.domain.clipping.clip_data`) under ``nightshift``.
    No channel configured: an empty list.
    """
    section = settings.notify
    subject, text, data = notice.subject, notice.text, notice.data
    outcomes: list[Outcome] = []
    if (section.webhook_url or section.webhook_url_file) and "webhook" not in skip:
        body = {
            "text": slack_text(f"{subject}\n{text}"),
            "nightshift": json.loads(json.dumps(clip_data(data), default=str)),
        }
        outcomes.append(
            _deliver(
                f"POST {CONFIGURED_WEBHOOK}",
                "webhook",
                lambda: _post(clients, configured_webhook_url(settings), body),
            )
        )
    if section.smtp_host and section.email_to and "email" not in skip:
        to = list(section.email_to)
        mail_subject, mail_text = clip_text(subject, MAX_MAIL_SUBJECT), clip_text(text, MAX_MAIL_TEXT)
        outcomes.append(
            _deliver(
                _mail_command(", ".join(to), mail_subject),
                "email",
                lambda: _mail(clients, to, mail_subject, mail_text),
            )
        )
    paging = section.pagerduty_routing_key_file and "pagerduty" not in skip
    page = page_for(notice, settings.external_url) if paging else None
    if page is not None:
        outcomes.append(
            _deliver(
                f"POST <pagerduty events v2> trigger {page.dedup_key} ({page.severity})",
                "pagerduty",
                lambda: f"dedup_key {clients.pagerduty.trigger(page)}",
            )
        )
    return outcomes


def configured_webhook_url(settings: Settings) -> str:
    """``notify.webhook_url``, else the content of ``notify.webhook_url_file``; ConfigError when neither."""
    section = settings.notify
    url = section.webhook_url or read_secret(section.webhook_url_file, "notify.webhook_url_file")
    if not url:
        raise ConfigError("notify.webhook_url is not set")
    return url


def _post(clients: Clients, url: str, body: Mapping[str, Any]) -> str:
    return f"HTTP {clients.http.post_json(url, body)}"


def _mail(clients: Clients, to: list[str], subject: str, text: str) -> str:
    clients.mail.send(to, subject, text)
    return f"sent to {len(to)} recipient(s)"


def _mail_command(recipients: str, subject: str) -> str:
    return f"mail to {recipients}: {subject}"


def _deliver(command: str, channel: str, send: Callable[[], str]) -> Outcome:
    """Run one delivery; every error it raises becomes the outcome (``data.channel`` names the channel)."""
    try:
        output = send()
    except BackendError as exc:
        outcome = outcome_from_error(exc, command=command)
    except ConfigError as exc:
        outcome = Failed(reason=str(exc), command=command)
    else:
        return Ok(command=command, output=output, data={"channel": channel})
    return dataclasses.replace(outcome, data={"channel": channel})


ACTIONS = (NotifyWebhook(), NotifyEmail())
