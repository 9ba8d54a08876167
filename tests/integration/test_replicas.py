"""Several real `nightshift serve` replicas on one PostgreSQL, as Alertmanager HA sees them: the same alert group
POSTed concurrently to every replica, many times, yields exactly one incident per (playbook, target) and one
execution of each step, counted by a real HTTP sink that the step (``notify.webhook``) posts to.

``running_hook_sink``, ``write_settings`` and ``start_serve`` (tests/fixtures/serve.py) are shared with the crash-safety
and secrets tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from app.store import Store, records
from app.store.schema import alerts, incidents, steps
from tests.fixtures.procs import wait_until
from tests.fixtures.serve import HookSink, Serve, running_hook_sink, start_serve, wait_ready, write_settings
from tests.payloads import alert, body, xid

pytestmark = pytest.mark.integration

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


@pytest.fixture
def hook_sink() -> Iterator[HookSink]:
    with running_hook_sink() as sink:
        yield sink


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
