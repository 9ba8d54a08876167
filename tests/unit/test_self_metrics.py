"""Nightshift's own health as /metrics and /readyz show it (issue 23 item 7): build info, the store's reachability,
open incidents by state, each backend's credential state from the start (not "unknown" until a failed use), and
the worker's heartbeat; rules/nightshift.yml alerts on them."""

from __future__ import annotations

import threading
from importlib import metadata
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine

from app import create_app
from app.clients import Clients
from app.config import Settings
from app.engine import vitals
from app.metrics import Metrics
from app.store import records
from app.worker import run_worker
from tests.fakes import FakeClock, FakePrometheus
from tests.fixtures.procs import wait_until

VIEWER = "viewer-token-of-the-test-0123456789"


def make_app(tmp_path: Path, **slurm: object):
    (tmp_path / "webhook.token").write_text("webhook-token-of-the-test-0123456789")
    (tmp_path / "viewer.token").write_text(VIEWER)
    (tmp_path / "ssh.key").write_text("not a real key: its readability is what counts here")
    settings = Settings(data_dir=str(tmp_path / "var"))
    settings.webhook.token_file = str(tmp_path / "webhook.token")
    settings.access.viewer_token_file = str(tmp_path / "viewer.token")
    settings.slurm.host = "login1"
    settings.slurm.key_file = str(tmp_path / "ssh.key")
    settings.kubernetes.kubeconfig = str(tmp_path / "ssh.key")  # only its readability matters here
    for key, value in slurm.items():
        setattr(settings.slurm, key, value)
    return create_app(
        settings, clock=FakeClock(), clients=Clients(settings, prometheus=FakePrometheus()), metrics=Metrics()
    )


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_metrics_show_build_store_open_incidents_credentials_and_the_worker_tick(tmp_path):
    app = make_app(tmp_path)
    engine = app.extensions["nightshift"].engine
    client = app.test_client()
    now = engine.deps.clock.now()
    with engine.deps.store.transaction() as conn:  # one open incident, waiting
        records.insert_incident(
            conn,
            {"playbook": "p", "target_key": "{}", "target": {}, "open_key": "k", "state": "waiting",
             "labels": {}, "annotations": {}, "alert_starts_at": now, "opened_at": now, "updated_at": now},
        )  # fmt: skip
    text = client.get("/metrics").text
    assert samples(text, "nightshift_build_info") == {(("version", metadata.version("nightshift")),): 1.0}
    assert samples(text, "nightshift_store_up") == {(): 1.0}
    open_now = samples(text, "nightshift_open_incidents")
    assert open_now[(("state", "waiting"),)] == 1.0 and sum(open_now.values()) == 1.0
    credentials = samples(text, "nightshift_backend_credentials")
    assert {labels for labels, on in credentials.items() if on} == {
        (("backend", "kubernetes"), ("state", "configured")),
        (("backend", "slurm"), ("state", "configured")),
    }
    assert samples(text, "nightshift_worker_last_tick_timestamp_seconds") == {}  # no worker has ticked yet
    vitals.beat(engine.deps, "w1")
    ticked = samples(client.get("/metrics").text, "nightshift_worker_last_tick_timestamp_seconds")
    assert ticked == {(): now.timestamp()}


def test_readyz_reports_the_credentials_from_the_start_and_an_unreadable_key(tmp_path):
    """Before: "unknown" until a use failed, while the log already said the key was unreadable."""
    app = make_app(tmp_path)
    client = app.test_client()
    ready = client.get("/readyz").json["credentials"]
    assert ready["slurm"]["state"] == "configured" and "ssh.key readable" in ready["slurm"]["reason"]
    (tmp_path / "ssh.key").unlink()  # gone after the start (the start refuses an unreadable file)
    ready = client.get("/readyz").json["credentials"]
    assert ready["slurm"] == {
        "state": "credential_error",
        "reason": f"slurm.key_file {tmp_path / 'ssh.key'} cannot be read by this user",
    }
    assert ready["kubernetes"]["state"] == "credential_error"
    on = samples(client.get("/metrics").text, "nightshift_backend_credentials")
    assert on[(("backend", "slurm"), ("state", "credential_error"))] == 1.0


def test_a_backend_without_credentials_is_unset(tmp_path):
    app = make_app(tmp_path, host=None)
    assert app.test_client().get("/readyz").json["credentials"]["slurm"] == {
        "state": "unset",
        "reason": "slurm.host is not set",
    }


def test_a_store_that_does_not_answer_is_store_up_0_and_the_rest_still_answers(tmp_path):
    app = make_app(tmp_path)
    app.extensions["nightshift"].store.engine = create_engine(
        "postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 1}
    )
    text = app.test_client().get("/metrics").text
    assert samples(text, "nightshift_store_up") == {(): 0.0}
    assert samples(text, "nightshift_build_info") and samples(text, "nightshift_open_incidents") == {}


def test_the_worker_loop_records_its_heartbeat(tmp_path):
    app = make_app(tmp_path, host=None)
    engine = app.extensions["nightshift"].engine
    stop = threading.Event()
    thread = threading.Thread(target=run_worker, args=(engine, stop, 3600.0), daemon=True)
    thread.start()
    try:
        wait_until(lambda: vitals.read(engine.deps).last_tick is not None, timeout=10, what="the heartbeat")
    finally:
        stop.set()
        engine.wakeup.set()
        thread.join(timeout=10)
    assert vitals.read(engine.deps).last_tick == engine.deps.clock.now()
