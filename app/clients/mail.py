"""Plain-text email through SMTP (``smtplib``), with its errors translated into :mod:`app.domain.errors`.

Until the message is handed over nothing has been delivered, so failures there are
:class:`~app.domain.errors.Unavailable` (or :class:`~app.domain.errors.CredentialRejected` for a refused login); a
connection lost or a timeout while the message is transferred may or may not have delivered it
(:class:`~app.domain.errors.OutcomeUnknown`).
"""

from __future__ import annotations

import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import TYPE_CHECKING

from app.config import read_secret
from app.domain import errors

if TYPE_CHECKING:
    from app.config import Settings


class Mailer:
    """Sends one message per call over a fresh SMTP connection (notifications are rare; nothing to pool)."""

    def __init__(
        self,
        host: str,
        *,
        port: int = 25,
        sender: str = "nightshift@localhost",
        starttls: bool = False,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
        tls_context: ssl.SSLContext | None = None,
    ):
        self.host = host
        self.port = port
        self.sender = sender
        self.starttls = starttls
        self.user = user
        self.password = password
        self.timeout = timeout
        self._tls_context = tls_context

    @classmethod
    def from_settings(cls, settings: Settings) -> Mailer:
        """Build from ``settings.notify``. Raises ConfigError when ``notify.smtp_host`` is not set."""
        section = settings.notify
        if not section.smtp_host:
            raise errors.ConfigError("notify.smtp_host is not set")
        return cls(
            section.smtp_host,
            port=section.smtp_port,
            sender=section.email_from,
            starttls=section.smtp_starttls,
            user=section.smtp_user,
            password=read_secret(section.smtp_password_file, "notify.smtp_password_file"),
            timeout=section.timeout_seconds,
        )

    def send(self, to: list[str], subject: str, body: str) -> None:
        """Send a plain-text message to every address in ``to``. Raises :mod:`app.domain.errors` exceptions."""
        if not to:
            raise errors.BackendError("smtp: no recipients")
        message = self._message(to, subject, body)
        where = f"smtp {self.host}:{self.port}"
        smtp = self._connect(where)
        try:
            self._send(smtp, message, to, where)
        finally:
            try:
                smtp.quit()
            except (smtplib.SMTPException, OSError):
                smtp.close()  # the message is already accepted (or the error raised); only the goodbye failed

    def _message(self, to: list[str], subject: str, body: str) -> EmailMessage:
        message = EmailMessage()
        try:
            message["From"] = self.sender
            message["To"] = ", ".join(to)
            message["Subject"] = header_text(subject)
            message["Date"] = formatdate(localtime=False, usegmt=True)
            message["Message-ID"] = make_msgid(domain=self.sender.rpartition("@")[2] or None)
        except ValueError as exc:  # a line break in a configured address: header injection refused
            raise errors.BackendError(f"smtp: cannot build the message: {exc}") from None
        message.set_content(body)
        return message

    def _connect(self, where: str) -> smtplib.SMTP:
        """An open, greeted, optionally encrypted and logged-in session. Nothing has been sent yet."""
        try:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        except (OSError, smtplib.SMTPException) as exc:
            raise errors.Unavailable(f"{where}: cannot connect: {_describe(exc)}") from None
        try:
            smtp.ehlo_or_helo_if_needed()
            if self.starttls:
                smtp.starttls(context=self._tls_context or ssl.create_default_context())
                smtp.ehlo()
            if self.user:
                smtp.login(self.user, self.password or "")
        except smtplib.SMTPAuthenticationError as exc:
            smtp.close()
            raise errors.CredentialRejected(f"{where}: login refused: {_describe(exc)}") from None
        except smtplib.SMTPNotSupportedError as exc:
            smtp.close()
            raise errors.BackendError(f"{where}: {_describe(exc)}") from None
        except (OSError, smtplib.SMTPException) as exc:
            smtp.close()
            raise errors.Unavailable(f"{where}: session setup failed: {_describe(exc)}") from None
        return smtp

    def _send(self, smtp: smtplib.SMTP, message: EmailMessage, to: list[str], where: str) -> None:
        try:
            refused = smtp.send_message(message, from_addr=self.sender, to_addrs=to)
        except smtplib.SMTPRecipientsRefused as exc:
            raise errors.BackendError(
                f"{where}: every recipient was refused: {_refusals(exc.recipients)}"
            ) from None
        except smtplib.SMTPResponseException as exc:
            if 400 <= exc.smtp_code < 500:  # transient refusal before acceptance: safe to try again later
                raise errors.Unavailable(f"{where}: temporarily refused: {_describe(exc)}") from None
            raise errors.BackendError(f"{where}: refused: {_describe(exc)}") from None
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            raise errors.OutcomeUnknown(f"{where}: connection lost while sending: {_describe(exc)}") from None
        # Some recipients got it: a failure to report, not to retry (the others would get it twice).
        if refused:
            raise errors.BackendError(
                f"{where}: delivered, but these recipients were refused: {_refusals(refused)}"
            )


def header_text(text: str) -> str:
    """A subject from label-derived text: one line, printable characters only (no bidirectional overrides), and no
    RFC 2047 encoded word: Python's email package decodes ``=?utf-8?b?...?=`` written in a header value, so a label
    could otherwise put any text in the subject. ``=?`` becomes ``= ?``."""
    line = " ".join("".join(ch for ch in text if ch.isprintable() or ch.isspace()).split())
    return line.replace("=?", "= ?")


def _refusals(refused: dict[str, tuple[int, bytes]]) -> str:
    return ", ".join(f"{address} ({code})" for address, (code, _) in refused.items())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, smtplib.SMTPResponseException):
        error = (
            exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else exc.smtp_error
        )
        return f"{exc.smtp_code} {error}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
