"""Several real `nightshift serve` replicas on one PostgreSQL, as Alertmanager HA sees them: the same alert group
POSTed concurrently to every replica, many times, yields exactly one incident per (playbook, target) and one
execution of each step, counted by a real HTTP sink that the step (``notify.webhook``) posts to.

``running_hook_sink``, ``write_settings`` and ``start_serve`` are shared with the crash-safety and secrets tests.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from sqlalchemy import func, select

from app.store import Store, records
from app.store.schema import alerts, incidents, steps
from tests.fixtures.procs import Daemon, free_port, wait_until
from tests.fixtures.reader import api_get, viewer_access
from tests.payloads import alert, body, xid

pytestmark = pytest.mark.integration

TOKEN = "replica-webhook-token"
NOTIFY_PLAYBOOK = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {{name: gpu-xid-notify, description: "Xid: tell the on-call channel (read-only, needs no grant)"}}
match: ['alertname="GpuXidError"']
target: {{scheduler: slurm, node: "{{{{ labels.Hostname }}}}", job: "{{{{ labels.slurm_job_id }}}}"}}
serialize: node
steps:
  - action: notify.webhook
    with: {{url: "{url}", text: "Xid on {{{{ target.node }}}} (job {{{{ target.job }}}})"}}
"""


@dataclass
class HookSink:
    """A real HTTP receiver for webhook POSTs, recorded per path. ``hold`` makes the first POST to a path wait
    (a slow receiver) until ``release`` is set."""

    server: ThreadingHTTPServer
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    hold: set[str] = field(default_factory=set)
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def bodies(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [payload for where, payload in self.received if where == path]

    def record(self, path: str, payload: dict[str, Any]) -> bool:
        """Record one POST; True when the caller must hold its answer."""
        with self.lock:
            first = all(where != path for where, _ in self.received)
            self.received.append((path, payload))
        return first and path in self.hold


@contextmanager
def running_hook_sink() -> Iterator[HookSink]:
    """A :class:`HookSink` serving on a free port until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            if sink.record(self.path, json.loads(self.rfile.read(length))):
                sink.held.set()
                sink.release.wait(60)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    server.daemon_threads = True
    sink = HookSink(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        sink.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def hook_sink() -> Iterator[HookSink]:
    with running_hook_sink() as sink:
        yield sink


@dataclass
class Serve:
    """One `nightshift serve` process group (gunicorn master and workers)."""

    url: str
    daemon: Daemon

    def post_alerts(self, data: bytes, token: str = TOKEN) -> requests.Response:
        return requests.post(
            f"{self.url}/api/v1/alerts",
            data=data,
            timeout=30,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )

    def incident(self, incident_id: int) -> dict[str, Any]:
        return api_get(self.url, f"/api/v1/incidents/{incident_id}").json()


def only_incident(url: str, timeout: float = 30) -> int:
    """Wait for the server at ``url`` to hold exactly one incident, and return its id (the webhook only queues
    what was posted: the worker opens the incident)."""

    def one() -> int | None:
        listed = api_get(url, "/api/v1/incidents").json()["incidents"]
        assert len(listed) <= 1, listed
        return listed[0]["id"] if listed else None

    return wait_until(one, timeout, "the worker to open the incident")  # type: ignore[return-value]


def write_settings(directory: Path, playbook: str, **settings: Any) -> Path:
    """A settings file with the playbook and a webhook token under ``directory``; ``settings`` override."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "playbooks").mkdir(exist_ok=True)
    (directory / "playbooks" / "playbook.yaml").write_text(playbook)
    (directory / "webhook-token").write_text(TOKEN)
    config: dict[str, Any] = {
        "data_dir": str(directory / "var"),
        "playbook_paths": [str(directory / "playbooks")],
        "webhook": {"token_file": str(directory / "webhook-token")},
        "access": viewer_access(directory),
        "worker": {"poll_seconds": 0.1},
    }
    for key, value in settings.items():
        if isinstance(value, dict):
            config.setdefault(key, {}).update(value)
        else:
            config[key] = value
    path = directory / "settings.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_serve(
    config: Path, name: str, *, workers: int = 2, threads: int = 4, env: dict[str, str] | None = None
) -> Serve:
    """Start `nightshift serve` with ``config`` on a free port; its output goes to ``<name>.log`` beside it."""
    port = free_port()
    argv = [sys.executable, "-m", "app.cli", "serve", "--config", str(config), "--bind", f"127.0.0.1:{port}"]
    argv += ["--workers", str(workers), "--threads", str(threads)]
    return Serve(f"http://127.0.0.1:{port}", Daemon(name, argv, config.parent, env=env))


def wait_ready(serve: Serve, timeout: float = 60) -> None:
    def ready() -> bool:
        assert serve.daemon.alive(), f"nightshift serve exited:\n{serve.daemon.log_tail()}"
        return requests.get(f"{serve.url}/readyz", timeout=2).status_code == 200

    wait_until(ready, timeout, f"{serve.daemon.name} to be ready (log: {serve.daemon.log_path})")


@pytest.fixture
def replicas(tmp_path, postgres_url, hook_sink) -> Iterator[list[Serve]]:
    """Three replicas (2 gunicorn workers each, each with a worker thread) sharing one PostgreSQL store."""
    playbook = NOTIFY_PLAYBOOK.format(url=hook_sink.url("/step"))
    started = []
    try:
        for n in range(3):
            config = write_settings(
                tmp_path / f"replica{n}",
                playbook,
                store_url=postgres_url,
                notify={"webhook_url": hook_sink.url("/summary")},
            )
            started.append(start_serve(config, f"replica{n}"))
        for serve in started:
            wait_ready(serve)
        yield started
    finally:
        for serve in started:
            serve.daemon.stop()


def test_alertmanager_ha_fan_out_to_every_replica_yields_one_incident_and_one_execution_per_step(
    replicas, postgres_url, hook_sink
):
    groups = [
        body(
            alert(xid(node=f"gpu-{n:02d}", job=str(7000 + n))),
            alert(xid(node=f"gpu-{n:02d}", job=str(7000 + n), gpu="5")),
        )
        for n in range(10)
    ]
    rounds = 4  # repeat_interval re-sends, and Alertmanager retries
    deliveries = [(serve, group) for _ in range(rounds) for group in groups for serve in replicas]
    with ThreadPoolExecutor(max_workers=24) as pool:
        statuses = list(pool.map(lambda d: d[0].post_alerts(d[1]).status_code, deliveries))
    assert statuses == [200] * len(deliveries)

    store = Store.from_url(postgres_url)
    try:

        def all_closed() -> bool:
            with store.transaction() as conn:
                rows = conn.execute(select(incidents.c.open_key, incidents.c.finalize_pending)).all()
                inbox = records.inbox_stats(conn)
            closed = len(rows) == 10 and all(key is None and not pending for key, pending in rows)
            return closed and inbox["pending"] == inbox["failed"] == 0

        wait_until(all_closed, 60, "every notification ingested and every incident finished on some replica")
        with store.transaction() as conn:
            per_job = conn.execute(select(incidents.c.job, func.count()).group_by(incidents.c.job)).all()
            outcomes = conn.execute(select(incidents.c.outcome).distinct()).scalars().all()
            step_rows = conn.execute(select(steps.c.incident_id, steps.c.status)).all()
            alert_rows = conn.execute(select(func.count(), func.sum(alerts.c.notifications))).one()
    finally:
        store.dispose()
    assert sorted(per_job) == [(str(7000 + n), 1) for n in range(10)]  # one job incident per job
    assert outcomes == ["advisory"]
    assert sorted(status for _, status in step_rows) == ["ok"] * 10
    # 20 alert instances; every delivery of every alert recorded, none lost, none stored twice.
    assert tuple(alert_rows) == (20, len(deliveries) * 2)
    # The step ran once per incident across 3 replicas x 2 workers, and each outcome was announced once.
    step_posts = Counter(b["nightshift"]["incident"] for b in hook_sink.bodies("/step"))
    summaries = Counter(b["nightshift"]["incident"] for b in hook_sink.bodies("/summary"))
    assert len(step_posts) == 10 and set(step_posts.values()) == {1}
    assert summaries == step_posts
