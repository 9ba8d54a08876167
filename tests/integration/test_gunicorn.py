"""The real server: `nightshift serve` (gunicorn, 2 workers, worker threads) on loopback, driven over HTTP."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from sim.webhook_sink import WebhookSink
from tests.fixtures.procs import Daemon, free_port, wait_until
from tests.fixtures.reader import api_get, viewer_access
from tests.integration.test_replicas import only_incident
from tests.payloads import alert, body, xid

TOKEN = "gunicorn-test-token"
PLAYBOOK = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: gpu-xid-79, description: "Xid 79: drain the node, requeue the job"}
match: ['alertname="GpuXidError"', 'xid="79"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
serialize: node
steps:
  - action: slurm.drain_node
    with: {node: "{{ target.node }}", reason: "Xid {{ labels.xid }}"}
  - action: slurm.requeue_job
    with: {job: "{{ target.job }}", exclude_nodes: "{{ target.node }}"}
"""


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    """The chat webhook the notifications go to."""
    receiver = WebhookSink()
    yield receiver
    receiver.close()


def start_serve(tmp_path: Path, sink: WebhookSink, **settings: object) -> tuple[Daemon, str]:
    """``nightshift serve`` with 2 gunicorn workers on a free port, once ready; ``settings`` override the test's."""
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "gpu.yaml").write_text(PLAYBOOK)
    (tmp_path / "token").write_text(TOKEN)
    config = {
        "data_dir": str(tmp_path / "var"),
        "playbook_paths": [str(tmp_path / "playbooks")],
        "webhook": {"token_file": str(tmp_path / "token")},
        "access": viewer_access(tmp_path),
        "notify": {"webhook_url": sink.url("/hook")},
        "worker": {"poll_seconds": 0.2},
        "episodes": {"correlation_seconds": 0},  # act at once: the episode window is tested elsewhere
        **settings,
    }
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        *nightshift_argv(tmp_path, "serve"),
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        "2",
        "--threads",
        "4",
    ]
    daemon = Daemon("nightshift", argv, tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: requests.get(f"{url}/readyz", timeout=1).status_code == 200,
            30,
            f"nightshift serve to be ready (log: {daemon.log_path})",
        )
    except BaseException:
        daemon.stop()
        raise
    return daemon, url


def nightshift_argv(tmp_path: Path, command: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", command, "--config", str(tmp_path / "settings.yaml")]


@pytest.fixture
def server(tmp_path, sink):
    daemon, url = start_serve(tmp_path, sink)
    try:
        yield url
    finally:
        daemon.stop()
        print(daemon.log_tail())


def post(url: str, data: bytes, token: str = TOKEN) -> requests.Response:
    return requests.post(
        f"{url}/api/v1/alerts",
        data=data,
        timeout=10,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )


def test_real_gunicorn_webhook_to_advisory_incident_with_notification(server, sink):
    assert post(server, body(alert(xid())), token="wrong").status_code == 401
    response = post(server, body(alert(xid())))
    assert response.status_code == 200, response.text
    incident_id = only_incident(server)

    def closed():
        detail = api_get(server, f"/api/v1/incidents/{incident_id}").json()
        return detail if detail["incident"]["outcome"] else None

    detail = wait_until(closed, 30, "the worker thread to finish the incident")
    assert detail["incident"]["outcome"] == "advisory"
    assert [(s["action"], s["status"]) for s in detail["steps"]] == [
        ("slurm.drain_node", "would_run"),
        ("slurm.requeue_job", "would_run"),
    ]
    assert "scontrol" in detail["steps"][0]["command"]
    (notice, *_) = wait_until(sink.bodies, 10, "the advisory notification")
    assert "advisory" in notice["text"] and "slurm.drain_node" in notice["text"]


def test_concurrent_duplicate_deliveries_across_workers_yield_one_incident(server):
    payload = body(alert(xid(node="node7", job="77")))
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(lambda _: post(server, payload).status_code, range(40)))
    assert statuses == [200] * 40
    wait_until(
        lambda: api_get(server, "/api/v1/status").json()["inbox"]["pending"] == 0,
        30,
        "the workers to ingest the 40 deliveries",
    )
    incidents = api_get(server, "/api/v1/incidents", job="77").json()["incidents"]
    assert len(incidents) == 1
    metrics = requests.get(f"{server}/metrics", timeout=5).text
    # Aggregated over both gunicorn workers (multiprocess mode), whichever served each request.
    assert 'nightshift_alerts_received_total{status="firing"} 40.0' in metrics


def test_a_worker_process_beside_serve_is_woken_by_the_webhook_not_by_its_poll(tmp_path, sink):
    """`serve` without its embedded worker and `nightshift worker` on the same SQLite file: the worker polls only
    every 60 s here, so an incident opened within seconds of the POST was ingested on the webhook's wakeup."""
    daemon, url = start_serve(tmp_path, sink, embedded_worker=False, worker={"poll_seconds": 60})
    worker = Daemon("worker", nightshift_argv(tmp_path, "worker"), tmp_path)
    try:
        wait_until(lambda: (tmp_path / "var" / "worker.sock").exists(), 30, "the worker to listen")
        assert post(url, body(alert(xid()))).status_code == 200
        only_incident(url, timeout=20)  # ingested by the worker process: within seconds, not at its 60 s poll
    finally:
        worker.stop()
        daemon.stop()
        print(worker.log_tail(), daemon.log_tail())
    assert not (tmp_path / "var" / "worker.sock").exists()  # removed on a clean stop


def test_real_gunicorn_limits_and_errors(server):
    assert post(server, b'{"alerts": "nope"').status_code == 400
    big = body(alert({**xid(), "blob": "x" * 2_000_000}))
    assert post(server, big).status_code == 413
    assert api_get(server, "/api/v1/incidents/12345").status_code == 404
    anonymous = requests.get(f"{server}/api/v1/incidents/12345", timeout=5)
    assert anonymous.status_code == 401 and anonymous.json()["status"] == "error"  # reads need a reader


def test_example_settings_file_is_valid():
    from app.config import load_settings

    settings = load_settings(Path(__file__).parents[2] / "examples" / "settings.yaml", env={})
    assert settings.webhook.token_file
