"""kill -9 of a real `nightshift serve` (its whole process group) and a restart:

- a mutating step in flight (``slurm.resume_node`` on the real Slurm cluster, blocked in its validation command)
  becomes ``ambiguous``, the incident ``needs_human``, and the step is never run again (Slurm state and the
  validation command's own log say so);
- a read-only step in flight (``notify.webhook`` to a receiver that does not answer) is run again and the
  incident continues to its end;
- every alert answered 200 before the kill (committed to the inbox) is ingested after the restart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import select

from app.domain.alertmanager import am_fingerprint
from app.store import Store
from app.store.schema import alerts
from tests.fixtures.procs import wait_until
from tests.fixtures.reader import api_get
from tests.fixtures.serve import (
    HookSink,
    Serve,
    only_incident,
    running_hook_sink,
    start_serve,
    wait_ready,
    write_settings,
)
from tests.fixtures.slurm import SlurmCluster
from tests.payloads import alert, body

pytestmark = pytest.mark.integration

# A short lease: the restarted worker may claim the dead worker's incident 3 s after the step started.
CRASH_SETTINGS: dict[str, Any] = {"worker": {"poll_seconds": 0.1, "lease_seconds": 3}}
RESUME_PLAYBOOK = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {{name: node-healthy-again, description: "resume a node nightshift drained, after a health check"}}
match: ['alertname="GpuNodeHealthy"']
target: {{scheduler: slurm, node: "{{{{ labels.Hostname }}}}"}}
steps:
  - action: slurm.resume_node
    with: {{node: "{{{{ target.node }}}}", validate: "{check}"}}
"""
NOTIFY_PLAYBOOK = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {{name: xid-notice, description: "tell the channel (read-only)"}}
match: ['alertname="GpuXidError"']
target: {{scheduler: slurm, node: "{{{{ labels.Hostname }}}}"}}
steps:
  - action: notify.webhook
    with: {{url: "{url}", text: "Xid on {{{{ target.node }}}}"}}
"""
# The validation command: leaves a line per run, then takes longer than the test lets it.
SLOW_CHECK = """#!/bin/sh
echo "validation started by pid $$" >> {log}
sleep 30
"""


@pytest.fixture
def hook_sink() -> Iterator[HookSink]:
    with running_hook_sink() as sink:
        yield sink


@pytest.fixture
def crashes() -> Iterator[list[Serve]]:
    """Every server a test starts; whatever is still running is stopped at the end."""
    started: list[Serve] = []
    yield started
    for serve in started:
        serve.daemon.stop()


def _start(crashes: list[Serve], config: Path, name: str) -> Serve:
    serve = start_serve(config, name, workers=1, threads=4)
    crashes.append(serve)
    wait_ready(serve)
    return serve


def _closed_incident(serve: Serve, incident_id: int, timeout: float = 30) -> dict[str, Any]:
    def closed() -> dict[str, Any] | None:
        detail = serve.incident(incident_id)
        return (
            detail if detail["incident"]["outcome"] and not detail["incident"]["finalize_pending"] else None
        )

    return wait_until(closed, timeout, f"incident {incident_id} to close")  # type: ignore[return-value]


def _sinfo_reason(cluster: SlurmCluster, node: str) -> str:
    return cluster.command("sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%E").stdout.strip()


def test_mutating_step_in_flight_at_kill_9_becomes_ambiguous_and_is_never_rerun(
    tmp_path, clean_slurm: SlurmCluster, crashes
):
    cluster = clean_slurm
    cluster.command("scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=nightshift: Xid 79")
    runs = tmp_path / "validations.log"
    check = tmp_path / "slow-check.sh"
    check.write_text(SLOW_CHECK.format(log=runs))
    check.chmod(0o755)
    (tmp_path / "permissions.yaml").write_text(
        "apiVersion: nightshift/v1\nkind: Permissions\nallow:\n  - action: slurm.resume_node\n"
    )
    slurm = {**dataclasses.asdict(cluster.settings.slurm), "command_timeout_seconds": 60.0}
    config = write_settings(
        tmp_path / "node",
        RESUME_PLAYBOOK.format(check=check),
        permissions_file=str(tmp_path / "permissions.yaml"),
        slurm=slurm,
        **CRASH_SETTINGS,
    )
    serve = _start(crashes, config, "serve-before-crash")
    response = serve.post_alerts(body(alert({"alertname": "GpuNodeHealthy", "Hostname": "node1"})))
    assert response.status_code == 200, response.text
    incident_id = only_incident(serve.url)
    wait_until(lambda: runs.exists() and runs.read_text(), 30, "the validation command to start")
    steps = serve.incident(incident_id)["steps"]
    assert [(s["action"], s["status"]) for s in steps] == [("slurm.resume_node", "running")]

    serve.daemon.kill()
    restarted = _start(crashes, config, "serve-after-crash")
    detail = _closed_incident(restarted, incident_id)

    incident, (step,) = detail["incident"], detail["steps"]
    assert (incident["state"], incident["outcome"]) == ("needs_human", "needs_human")
    assert "in flight when its worker stopped" in incident["reason"]
    assert (step["status"], step["reason"]) == (
        "ambiguous",
        "in flight when its worker stopped; outcome unknown, not re-run",
    )
    assert [row["kind"] for row in detail["ledger"]].count("step_ambiguous") == 1
    # Not run again: the validation ran once, and the resume that follows it never happened.
    assert runs.read_text().count("validation started") == 1
    assert "drain" in cluster.node_state("node1")  # drained or idle+drain: sinfo's wording varies
    assert _sinfo_reason(cluster, "node1") == "nightshift: Xid 79"


def test_read_only_step_in_flight_at_kill_9_runs_again_and_the_incident_continues(
    tmp_path, hook_sink: HookSink, crashes
):
    hook_sink.hold.add("/slow")  # the first POST gets no answer: the step is in flight at the kill
    config = write_settings(
        tmp_path / "notify",
        NOTIFY_PLAYBOOK.format(url=hook_sink.url("/slow")),
        notify={"timeout_seconds": 30},
        **CRASH_SETTINGS,
    )
    serve = _start(crashes, config, "serve-before-crash")
    response = serve.post_alerts(body(alert({"alertname": "GpuXidError", "Hostname": "node3"})))
    assert response.status_code == 200, response.text
    incident_id = only_incident(serve.url)
    assert hook_sink.held.wait(30), "the notify step never reached the receiver"

    serve.daemon.kill()
    hook_sink.release.set()
    restarted = _start(crashes, config, "serve-after-crash")
    detail = _closed_incident(restarted, incident_id)

    assert detail["incident"]["outcome"] == "advisory"
    assert [(s["action"], s["status"]) for s in detail["steps"]] == [("notify.webhook", "ok")]
    posts = hook_sink.bodies("/slow")
    assert [p["nightshift"]["incident"] for p in posts] == [incident_id, incident_id]
    assert posts[0]["text"] == posts[1]["text"] == "Xid on node3"
    assert "step_ambiguous" not in [row["kind"] for row in detail["ledger"]]


def test_every_alert_answered_200_before_kill_9_is_in_the_store_after_restart(tmp_path, crashes):
    config = write_settings(tmp_path / "stream", "", **CRASH_SETTINGS)
    serve = _start(crashes, config, "serve-before-crash")
    answered: list[str] = []

    def deliver(n: int) -> None:
        labels = {"alertname": "DurabilityProbe", "Hostname": f"node-{n}"}
        try:
            response = serve.post_alerts(body(alert(labels)))
        except requests.RequestException:
            return  # in flight at the kill, or refused after it: Alertmanager would retry these
        if response.status_code == 200:
            answered.append(am_fingerprint(labels))

    total = 3000
    with ThreadPoolExecutor(max_workers=8) as pool:
        for n in range(total):
            pool.submit(deliver, n)
        wait_until(lambda: len(answered) >= 200, 60, "200 alerts to be answered")
        serve.daemon.kill()
    accepted = set(answered)
    assert 200 <= len(accepted) < total  # the kill landed mid-stream

    restarted = _start(crashes, config, "serve-after-crash")
    wait_until(
        lambda: api_get(restarted.url, "/api/v1/status").json()["inbox"]["pending"] == 0,
        60,
        "the restarted worker to ingest the inbox",
    )
    store = Store.from_url(f"sqlite:///{tmp_path / 'stream' / 'var' / 'nightshift.db'}")
    try:
        with store.transaction() as conn:
            stored = set(conn.execute(select(alerts.c.fingerprint)).scalars())
    finally:
        store.dispose()
    assert accepted <= stored, f"{len(accepted - stored)} alert(s) answered 200 were lost"
