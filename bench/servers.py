"""The servers under test, started the same way: Nightshift (``nightshift serve``) and the bare-Flask floors.

All run under gunicorn with the options ``app/cli.py`` ``serve`` sets (gthread, same workers and threads, timeouts,
access log to stdout); each in its own session, logging under ``workdir``, stopped on exit.

- ``floor``: a bare Flask endpoint that parses the JSON (``bench/floor.py``), the framework floor;
- ``floor-durable``: the same, plus one SQLite commit of the body, as Nightshift's store makes it;
- ``nightshift-webhook``: ``nightshift serve`` with no incident worker anywhere: the webhook's own cost alone
  (notifications pile up in the inbox);
- ``nightshift``: ``nightshift serve`` as it starts by default, the incident worker a thread in the gunicorn
  worker;
- ``nightshift-split``: ``serve`` with ``embedded_worker: false`` beside a ``nightshift worker`` process on the
  same store.

Nightshift gets a fresh SQLite store in ``workdir``, the shipped ``playbooks/`` (advisory: no permissions file) and
a webhook token.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from tests.fixtures.procs import Daemon, free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
KINDS = ("floor", "floor-durable", "nightshift-webhook", "nightshift", "nightshift-split")
NIGHTSHIFT_KINDS = KINDS[2:]
TOKEN = "bench-webhook-token"


@dataclass
class Server:
    kind: str
    url: str  # base URL, no trailing slash
    token_file: Path
    daemon: Daemon
    worker: Daemon | None = None  # nightshift-split's `nightshift worker`

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by every process of the server: master, gunicorn workers, and
        the separate worker process if any."""
        roots = [self.daemon.proc.pid] + ([self.worker.proc.pid] if self.worker else [])
        return sum(cpu_seconds(pid) for root in roots for pid in [root, *children(root)])

    @property
    def webhook(self) -> str:
        return f"{self.url}/api/v1/alerts"

    def worker_pids(self) -> list[int]:
        """The gunicorn workers: the master's children."""
        return children(self.daemon.proc.pid)


@contextmanager
def serve(kind: str, workdir: Path, *, workers: int = 1, threads: int = 8) -> Iterator[Server]:
    """Start ``kind`` (one of :data:`KINDS`) on a free loopback port; yield once every worker is up."""
    workdir.mkdir(parents=True, exist_ok=True)
    token_file = workdir / "token"
    token_file.write_text(TOKEN)
    bind = f"127.0.0.1:{free_port()}"
    worker_argv: list[str] = []
    if kind in NIGHTSHIFT_KINDS:
        config = _nightshift_config(workdir, token_file, embedded_worker=kind == "nightshift")
        argv = [*_nightshift_argv("serve", config), "--bind", bind]
        argv += ["--workers", str(workers), "--threads", str(threads)]
        if kind == "nightshift-split":
            worker_argv = _nightshift_argv("worker", config)
    elif kind in ("floor", "floor-durable"):
        app = "bench.floor:create_app()"
        if kind == "floor-durable":
            app = f"bench.floor:create_durable_app({str(workdir)!r})"
        argv = [sys.executable, "-m", "gunicorn", "--bind", bind, "--workers", str(workers)]
        argv += ["--threads", str(threads), "--worker-class", "gthread", "--timeout", "60"]
        argv += ["--graceful-timeout", "30", "--access-logfile", "-", app]
    else:
        raise ValueError(f"unknown server kind {kind!r} (one of {', '.join(KINDS)})")
    daemon = Daemon(kind, argv, workdir, cwd=REPO)
    server = Server(kind, f"http://{bind}", token_file, daemon)
    try:
        if worker_argv:
            server.worker = Daemon(f"{kind}-worker", worker_argv, workdir, cwd=REPO)
        wait_until(
            lambda: requests.get(f"{server.url}/readyz", timeout=1).status_code == 200,
            60,
            f"{kind} to be ready (log: {daemon.log_path})",
        )
        wait_until(lambda: len(server.worker_pids()) == workers, 30, f"{workers} {kind} workers")
        yield server
        if server.worker is not None and not server.worker.alive():
            raise RuntimeError(
                f"the worker process of {kind} died during the run:\n{server.worker.log_tail()}"
            )
    finally:
        daemon.stop()
        if server.worker is not None:
            server.worker.stop()


def _nightshift_config(workdir: Path, token_file: Path, *, embedded_worker: bool) -> Path:
    settings = {
        "data_dir": str(workdir / "var"),
        "playbook_paths": [str(REPO / "playbooks")],
        "webhook": {"token_file": str(token_file)},
        "embedded_worker": embedded_worker,
    }
    config = workdir / "settings.yaml"
    config.write_text(yaml.safe_dump(settings))
    return config


def _nightshift_argv(command: str, config: Path) -> list[str]:
    return [sys.executable, "-m", "app.cli", command, "--config", str(config)]


def children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields and int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid`` has run; 0 once it has exited. The larger of two lower bounds: user + system clock ticks
    (/proc/<pid>/stat fields 14 and 15, every thread that ever ran, but sampled at each tick, so a process that runs
    in short bursts on a busy machine may be charged nothing) and the scheduler's exact count over its live threads
    (/proc/<pid>/task/*/schedstat, nanoseconds; the servers' threads live as long as they do)."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    if not fields:
        return 0.0
    ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    try:
        exact = (
            sum(int(p.read_text().split()[0]) for p in Path(f"/proc/{pid}/task").glob("*/schedstat")) / 1e9
        )
    except (OSError, ValueError, IndexError):
        exact = 0.0
    return max(ticks, exact)


def _stat_fields(stat: Path) -> list[str]:
    """The fields of a /proc/<pid>/stat from the 3rd (state) on; empty once the process has exited."""
    try:
        text = stat.read_text()
    except OSError:
        return []
    # The command name may hold spaces and parentheses: the fields after it start past the last ")".
    return text[text.rindex(")") + 2 :].split()


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 2)
    raise ValueError(f"no VmRSS for pid {pid}")
