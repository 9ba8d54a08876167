"""Processes for the simulated cluster, the demo and the tests: free ports, readiness polling, daemons by PID."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PORT_TRIES = 200
_ports = random.Random()  # its own generator: a test seeding `random` must not make two processes pick alike


def free_port() -> int:
    """A loopback port nothing is bound to now, for a daemon to listen on, from just below the kernel's ephemeral
    range. A port from that range (what binding port 0 gives) is also where every process's outgoing connections
    take their local ports, so one can take it before the daemon binds it (seen under load: slurmd "Unable to bind
    listen port (53199): Address already in use"). Falls back to port 0's answer when nothing below is free."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for _ in range(_PORT_TRIES if low > 2048 else 0):
        port = _ports.randrange(max(1024, low - 16384), low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> object:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # readiness probes fail in many ways while a daemon starts
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


class Daemon:
    """A background process in its own session, logging to a file, stopped by PID."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash would."""
        self.stop(signal.SIGKILL)
