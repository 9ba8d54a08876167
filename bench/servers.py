"""The two servers under test, started the same way: Nightshift (``nightshift serve``) and the bare-Flask floor.

Both run under gunicorn with the options ``app/cli.py`` ``serve`` sets (gthread, same workers and threads, timeouts,
access log to stdout); each in its own session, logging under ``workdir``, stopped on exit.
Nightshift gets a fresh SQLite store in ``workdir``, the shipped ``playbooks/`` (advisory: no permissions file)
and a webhook token; its embedded worker thread runs as in production.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from tests.fixtures.procs import Daemon, free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
KINDS = ("floor", "nightshift")
TOKEN = "bench-webhook-token"


@dataclass
class Server:
    kind: str
    url: str  # base URL, no trailing slash
    token_file: Path
    daemon: Daemon

    @property
    def webhook(self) -> str:
        return f"{self.url}/api/v1/alerts"

    def worker_pids(self) -> list[int]:
        """The gunicorn workers: the master's children."""
        return children(self.daemon.proc.pid)


@contextmanager
def serve(kind: str, workdir: Path, *, workers: int = 1, threads: int = 8) -> Iterator[Server]:
    """Start ``kind`` (floor | nightshift) on a free loopback port; yield once every worker is up."""
    workdir.mkdir(parents=True, exist_ok=True)
    token_file = workdir / "token"
    token_file.write_text(TOKEN)
    bind = f"127.0.0.1:{free_port()}"
    if kind == "nightshift":
        argv = [*_nightshift_argv(workdir, token_file), "--bind", bind]
        argv += ["--workers", str(workers), "--threads", str(threads)]
    elif kind == "floor":
        argv = [sys.executable, "-m", "gunicorn", "--bind", bind, "--workers", str(workers)]
        argv += ["--threads", str(threads), "--worker-class", "gthread", "--timeout", "60"]
        argv += ["--graceful-timeout", "30", "--access-logfile", "-", "bench.floor:create_app()"]
    else:
        raise ValueError(f"unknown server kind {kind!r} (one of {', '.join(KINDS)})")
    daemon = Daemon(kind, argv, workdir, cwd=REPO)
    server = Server(kind, f"http://{bind}", token_file, daemon)
    try:
        wait_until(
            lambda: requests.get(f"{server.url}/readyz", timeout=1).status_code == 200,
            60,
            f"{kind} to be ready (log: {daemon.log_path})",
        )
        wait_until(lambda: len(server.worker_pids()) == workers, 30, f"{workers} {kind} workers")
        yield server
    finally:
        daemon.stop()


def _nightshift_argv(workdir: Path, token_file: Path) -> list[str]:
    settings = {
        "data_dir": str(workdir / "var"),
        "playbook_paths": [str(REPO / "playbooks")],
        "webhook": {"token_file": str(token_file)},
    }
    config = workdir / "settings.yaml"
    config.write_text(yaml.safe_dump(settings))
    return [sys.executable, "-m", "app.cli", "serve", "--config", str(config)]


def children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process exited while we looked
            continue
        # The command name may hold spaces and parentheses: the fields after it start past the last ")".
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 2)
    raise ValueError(f"no VmRSS for pid {pid}")
