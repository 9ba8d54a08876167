"""The real server: `nightshift serve` (gunicorn, 2 workers, worker threads) on loopback, driven over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from sim.webhook_sink import WebhookSink
from tests.fixtures.procs import Daemon, wait_until
from tests.fixtures.reader import api_get
from tests.fixtures.serve import nightshift_argv, only_incident, post
from tests.fixtures.serve import start_gunicorn as start_serve
from tests.payloads import alert, body, xid


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    """The chat webhook the notifications go to."""
    receiver = WebhookSink()
    yield receiver
    receiver.close()


@pytest.fixture
def server(tmp_path, sink):
    daemon, url = start_serve(tmp_path, sink)
    try:
        yield url
    finally:
        daemon.stop()
        print(daemon.log_tail())


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
