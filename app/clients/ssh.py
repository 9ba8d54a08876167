"""Run commands on a remote host over SSH (paramiko): argv in, :class:`CommandResult` out.

Contract:
- A command is an argv list, turned into one remote command line with :func:`shlex.join`, so no element is
  ever interpreted by the remote shell. With ``login_shell`` the line is wrapped as ``bash -lc <quoted line>``
  so the remote login environment applies (profile, sshd ``SetEnv``); paramiko's ``environment=`` is dropped
  silently by servers without ``AcceptEnv``, so it is not used.
- Host keys are checked against ``known_hosts_file`` (or ``~/.ssh/known_hosts``) with a rejecting policy: an
  unknown or changed host key is :class:`~app.domain.errors.CredentialRejected` ("host key verification failed"),
  never auto-added.
- Errors: authentication refused → :class:`~app.domain.errors.CredentialRejected`; host unreachable, connection
  refused, protocol or banner trouble before the command was sent → :class:`~app.domain.errors.Unavailable` (nothing
  ran); the command was sent but no exit status came back in time, or the connection died mid-command →
  :class:`~app.domain.errors.OutcomeUnknown` (it may have run). A non-zero exit is not an error here: it is in the
  result.
- One connection per host is kept for every command (one TCP and auth handshake per runner; keepalives every
  30 s; :meth:`SshRunner.connect` opens it ahead of the first command) and reopened when it has died: a channel
  that cannot be opened on a dead connection is retried once on a new one (nothing ran yet). Opening it is
  serialised by a lock; commands of several threads run as separate channels of that connection (OpenSSH
  allows ``MaxSessions``, default 10, at once), and :meth:`SshRunner.run_all` runs the independent commands
  of one step at once the same way. TCP_NODELAY is set: each command then costs one round trip plus the
  remote process, not a delayed-ACK wait.
"""

from __future__ import annotations

import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import paramiko

from app.domain.errors import ConfigError, CredentialRejected, OutcomeUnknown, Unavailable

if TYPE_CHECKING:
    from app.config import Settings

# Bytes kept per stream: the tail, so a chatty command cannot exhaust memory.
MAX_STREAM_BYTES = 1 << 20
# Commands run at once by run_all: below OpenSSH's default MaxSessions (10), leaving room for other threads.
MAX_PARALLEL = 6
# Longest wait between checks of a running command (events usually wake it up sooner).
_WAIT_INTERVAL = 0.05
_READ_CHUNK = 32768
_KEEPALIVE_SECONDS = 30


@dataclass(frozen=True)
class CommandResult:
    """One finished remote command. ``command`` is the exact line the server was given."""

    argv: tuple[str, ...]
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def output(self) -> str:
        """stdout then stderr, for the ledger."""
        return self.stdout + self.stderr


class _UnknownHostKey(paramiko.SSHException):
    """The server's host key is not in known_hosts (raised by :class:`_RejectUnknownHost`)."""


class _RejectUnknownHost(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, with an exception type of our own so the refusal is told apart from other
    protocol errors."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        raise _UnknownHostKey(f"{hostname} presented a {key.get_name()} host key not found in known_hosts")


class SshRunner:
    """Commands on one host as one user. Build with :meth:`from_settings`; call :meth:`close` when done."""

    def __init__(
        self,
        host: str,
        *,
        port: int = 22,
        user: str = "root",
        key_file: str | None = None,
        use_agent: bool = False,
        known_hosts_file: str | None = None,
        connect_timeout: float = 10.0,
        command_timeout: float = 60.0,
        login_shell: bool = True,
    ):
        self.host = host
        self.port = port
        self.user = user
        self._key_file = key_file
        self._use_agent = use_agent
        self._known_hosts_file = known_hosts_file
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._login_shell = login_shell
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, node: str | None = None) -> SshRunner:
        """A runner for ``settings.slurm``: its host, or with ``node`` that node itself (``slurm.node_ssh_host``
        with ``{node}`` replaced). Raises :class:`ConfigError` when no host is configured."""
        cfg = settings.slurm
        host = cfg.node_ssh_host.replace("{node}", node) if node is not None else cfg.host
        if not host:
            raise ConfigError("slurm.host is not set: no SSH target for Slurm commands")
        return cls(
            host,
            port=cfg.port,
            user=cfg.user,
            key_file=cfg.key_file,
            use_agent=cfg.use_agent,
            known_hosts_file=cfg.known_hosts_file,
            connect_timeout=cfg.connect_timeout_seconds,
            command_timeout=cfg.command_timeout_seconds,
            login_shell=cfg.login_shell,
        )

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def command_line(self, argv: Sequence[str]) -> str:
        """The exact remote command line for ``argv``: every element quoted."""
        if not argv:
            raise ValueError("empty argv")
        line = shlex.join(argv)
        return f"bash -lc {shlex.quote(line)}" if self._login_shell else line

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        """Run ``argv`` remotely; wait up to ``timeout`` seconds (default: the configured command timeout)."""
        command = self.command_line(argv)
        stdout, stderr, exit_code, duration = self._exec(command, timeout)
        return _result(argv, command, (stdout, stderr, exit_code), duration)

    def _exec(self, command: str, timeout: float | None) -> tuple[bytes, bytes, int, float]:
        """Run the remote ``command`` line on a new channel: (stdout, stderr, exit code, seconds)."""
        limit = self._command_timeout if timeout is None else timeout
        started = time.monotonic()
        channel = self._start(command)
        try:
            stdout, stderr, exit_code = self._collect(channel, command, started + limit, limit)
        finally:
            channel.close()
        return stdout, stderr, exit_code, time.monotonic() - started

    def _start(self, command: str) -> paramiko.Channel:
        """A new channel running ``command``; :class:`Unavailable` when it could not start, :class:`OutcomeUnknown`
        when the connection was lost once the request was sent (paramiko raises the transport's ``EOFError``)."""
        channel = self._open_channel()
        try:
            channel.exec_command(command)
        except (paramiko.SSHException, OSError) as exc:
            channel.close()
            # The server refused or never acknowledged the exec request: the command did not start.
            raise Unavailable(f"ssh {self.target}: could not start command: {exc}") from None
        except EOFError:
            channel.close()
            # The connection ended between the request and its answer: sshd may have started the command.
            raise OutcomeUnknown(
                f"ssh {self.target}: connection lost while starting, it may have run: {command}"
            ) from None
        return channel

    def run_all(self, argvs: Sequence[Sequence[str]], timeout: float | None = None) -> list[CommandResult]:
        """Run independent commands at once, each on its own channel of the one connection (a single round
        trip for all of them), and wait for every one; a result per command, in order. Pass only commands that
        do not depend on each other: they may run in any order. At most :data:`MAX_PARALLEL` (OpenSSH's
        ``MaxSessions`` is 10 per connection). Errors as :meth:`run`; if one command cannot start, the ones
        already started are still collected before the error is raised, so nothing is left running unseen.
        """
        if len(argvs) > MAX_PARALLEL:
            raise ValueError(f"at most {MAX_PARALLEL} commands at once, got {len(argvs)}")
        limit = self._command_timeout if timeout is None else timeout
        started = time.monotonic()
        commands = [self.command_line(argv) for argv in argvs]
        channels: list[paramiko.Channel] = []
        failure: Unavailable | None = None
        try:
            for command in commands:
                try:
                    channels.append(self._start(command))
                except Unavailable as exc:
                    failure = exc
                    break
            outputs = [
                self._collect(channel, command, started + limit, limit)
                for channel, command in zip(channels, commands, strict=False)
            ]
        finally:
            for channel in channels:
                channel.close()
        if failure is not None:
            raise failure
        duration = time.monotonic() - started
        return [
            _result(argv, command, output, duration)
            for argv, command, output in zip(argvs, commands, outputs, strict=True)
        ]

    def check(self) -> None:
        """Connect, authenticate and run ``true``; raises like :meth:`run` when access is broken."""
        result = self.run(["true"], timeout=self._connect_timeout)
        if result.exit_code != 0:
            raise Unavailable(f"ssh {self.target}: `true` exited {result.exit_code}: {result.stderr.strip()}")

    def close(self) -> None:
        """Drop the connection; the next command opens a new one."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def connect(self) -> None:
        """Open the connection now (a warm-up, so the first command of an incident pays no handshake); raises
        like :meth:`run`. Later commands reuse it, and reconnect when it has died."""
        self._transport()

    def _open_channel(self) -> paramiko.Channel:
        """A session channel on the live connection. A connection that turns out dead when the channel is
        opened (nothing has run yet) is dropped and opened again, once."""
        for attempt in (1, 2):
            transport = self._transport()
            try:
                return transport.open_session(timeout=self._connect_timeout)
            except paramiko.ChannelException as exc:
                # The server refused this channel (MaxSessions reached): the connection itself is fine.
                raise Unavailable(f"ssh {self.target}: could not open a session: {exc}") from None
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop(transport)
                if attempt == 2:
                    raise Unavailable(f"ssh {self.target}: could not open a session: {exc}") from None
        raise AssertionError("unreachable")  # the loop returns or raises

    def _drop(self, transport: paramiko.Transport) -> None:
        """Forget the connection ``transport`` belongs to, unless another thread already replaced it."""
        with self._lock:
            if self._client is not None and self._client.get_transport() is transport:
                self._client.close()
                self._client = None

    def _transport(self) -> paramiko.Transport:
        """The live transport, connecting (again) when there is none or it has died."""
        with self._lock:
            transport = self._client.get_transport() if self._client is not None else None
            if transport is not None and transport.is_active():
                return transport
            if self._client is not None:
                self._client.close()
                self._client = None
            self._client = self._connect()
            transport = self._client.get_transport()
            assert transport is not None  # connect() succeeded, so it has one
            transport.set_keepalive(_KEEPALIVE_SECONDS)
            # Without TCP_NODELAY every channel open waits out the peer's delayed ACK (40 ms on Linux): Nagle
            # holds our small request until the previous packet is acknowledged. Measured: 40 ms -> 0.4 ms.
            if isinstance(transport.sock, socket.socket):  # a TCP connection (it is: we connect by address)
                transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return transport

    def _connect(self) -> paramiko.SSHClient:
        if self._key_file and not os.access(self._key_file, os.R_OK):
            raise CredentialRejected(f"ssh {self.target}: private key file {self._key_file} is not readable")
        client = paramiko.SSHClient()
        try:
            if self._known_hosts_file:
                client.load_host_keys(self._known_hosts_file)
            else:
                client.load_system_host_keys()
        except OSError as exc:
            raise CredentialRejected(
                f"ssh {self.target}: host key verification failed: cannot read known_hosts "
                f"{self._known_hosts_file}: {exc.strerror}"
            ) from None
        client.set_missing_host_key_policy(_RejectUnknownHost())
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                key_filename=self._key_file,
                allow_agent=self._use_agent,
                look_for_keys=False,
                timeout=self._connect_timeout,
                banner_timeout=self._connect_timeout,
                auth_timeout=self._connect_timeout,
                channel_timeout=self._connect_timeout,
            )
        except (_UnknownHostKey, paramiko.BadHostKeyException) as exc:
            client.close()
            raise CredentialRejected(f"ssh {self.target}: host key verification failed: {exc}") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise CredentialRejected(f"ssh {self.target}: authentication failed: {exc}") from None
        except paramiko.SSHException as exc:
            client.close()
            if "No authentication methods available" in str(exc):
                raise CredentialRejected(f"ssh {self.target}: no key or agent configured") from None
            raise Unavailable(f"ssh {self.target}: {exc}") from None
        except (OSError, EOFError) as exc:  # NoValidConnectionsError, timeouts, DNS failures are all OSErrors
            client.close()
            raise Unavailable(f"ssh {self.target}: cannot connect: {exc}") from None
        return client

    def _collect(
        self, channel: paramiko.Channel, command: str, deadline: float, limit: float
    ) -> tuple[bytes, bytes, int]:
        """Drain stdout/stderr until both the exit status and the end of output arrived, or ``deadline``.

        sshd may send the exit status before the last output (it drains the command's pipes after the
        command exited), so the end of output (channel EOF) is awaited as well.
        """
        out, err = bytearray(), bytearray()
        wakeup = channel.fileno()  # readable when output or EOF arrives

        def drain() -> None:
            while channel.recv_ready():
                _append_bounded(out, channel.recv(_READ_CHUNK))
            while channel.recv_stderr_ready():
                _append_bounded(err, channel.recv_stderr(_READ_CHUNK))

        while True:
            drain()
            if channel.closed or (channel.exit_status_ready() and channel.eof_received):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OutcomeUnknown(
                    f"ssh {self.target}: no exit status after {limit:g}s, it may have run: {command}",
                    output=_decode(out) + _decode(err),
                )
            # The cap guards against a wake-up that neither the pipe nor the status event signals.
            wait = min(_WAIT_INTERVAL, remaining)
            if channel.eof_received:
                channel.status_event.wait(wait)
            else:
                select.select([wakeup], [], [], wait)
        drain()
        exit_code = channel.recv_exit_status()
        if exit_code == -1:
            # Closed without an exit status: the connection died, or the command was killed by a signal.
            raise OutcomeUnknown(
                f"ssh {self.target}: no exit status (connection lost or command killed), "
                f"it may have run: {command}",
                output=_decode(out) + _decode(err),
            )
        return bytes(out), bytes(err), exit_code


def _result(
    argv: Sequence[str], command: str, output: tuple[bytes, bytes, int], duration: float
) -> CommandResult:
    stdout, stderr, exit_code = output
    return CommandResult(
        argv=tuple(argv),
        command=command,
        exit_code=exit_code,
        stdout=_decode(stdout),
        stderr=_decode(stderr),
        duration=duration,
    )


def _append_bounded(buffer: bytearray, data: bytes) -> None:
    buffer.extend(data)
    if len(buffer) > MAX_STREAM_BYTES:
        del buffer[: len(buffer) - MAX_STREAM_BYTES]


def _decode(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")
