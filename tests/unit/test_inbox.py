"""The inbox: notifications committed as received, ingested by the worker a batch of alerts per transaction."""

from __future__ import annotations

import json
import threading

import pytest
from sqlalchemy import func, insert, select

from app.config import ConfigError, load_settings
from app.domain.alertmanager import parse_notification
from app.domain.errors import InboxFull
from app.engine import Engine
from app.store import BACKLOG_SUM, Store, records
from app.store.schema import SCHEMA_VERSION, metadata, schema_version
from app.store.schema import alerts as alerts_table
from app.store.schema import inbox as inbox_table
from app.worker import run_worker
from sim.procs import wait_until
from tests.payloads import alert, payload, xid
from tests.worlds import World, make_world, matching_that_raises_on


def accept(world: World, *alerts: dict) -> int:
    body = json.dumps(payload(*alerts)).encode()
    return world.engine.accept(parse_notification(body), body)


def fleet(n: int) -> list[dict]:
    """n distinct Xid 79 alerts, one per node (each opens its own incident)."""
    return [alert(xid(node=f"node{i}", job=str(1000 + i))) for i in range(n)]


def inbox_rows(engine: Engine) -> list[dict]:
    with engine.deps.store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(select(inbox_table).order_by(inbox_table.c.id))]


def stored_alerts(engine: Engine) -> list[dict]:
    with engine.deps.store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(select(alerts_table))]


def backlog(engine: Engine) -> int:
    """The backlog's counter, checked against the sum of the queue it stands for."""
    with engine.deps.store.read() as conn:
        counted = records.inbox_backlog(conn)
        assert counted == conn.execute(BACKLOG_SUM).scalar_one()
    return counted


def test_accept_commits_the_body_as_received_and_ingests_nothing(tmp_path):
    world = make_world(tmp_path)
    body = json.dumps(payload(alert(xid()))).encode()
    inbox_id = world.engine.accept(parse_notification(body), body)
    (row,) = inbox_rows(world.engine)
    assert (row["id"], row["body"], row["alert_count"], row["next_alert"]) == (inbox_id, body.decode(), 1, 0)
    assert stored_alerts(world.engine) == [] and world.engine.incidents() == []
    assert world.engine.wakeup.is_set()


def test_worker_ingests_a_notification_in_batches_and_deletes_it_when_done(tmp_path):
    world = make_world(tmp_path)
    world.engine.deps.settings.worker.inbox_batch_alerts = 4
    accept(world, *fleet(10))
    progress = []
    while (result := world.engine.inbox.ingest_next()) is not None:
        progress.append(
            (result.alerts, [r["next_alert"] for r in inbox_rows(world.engine)], backlog(world.engine))
        )
    assert progress == [(4, [4], 6), (4, [8], 2), (2, [], 0)]
    assert len(stored_alerts(world.engine)) == 10 and len(world.engine.incidents()) == 10


def test_notifications_are_ingested_oldest_first(tmp_path):
    world = make_world(tmp_path)
    firing = alert(xid())
    accept(world, firing)
    accept(world, {**firing, "status": "resolved", "endsAt": "2026-01-01T00:05:00Z"})
    total = world.engine.inbox.ingest_all()
    assert (len(total.opened), total.closed) == (1, total.opened)  # opened by the first, closed by the second


def test_a_new_alert_is_ingested_before_a_flood_of_repeats(tmp_path):
    world = make_world(tmp_path)
    world.engine.deps.settings.worker.inbox_batch_alerts = 10
    storm = fleet(20)
    accept(world, *storm)
    for _ in range(5):  # Alertmanager re-sends the group while the first delivery still waits
        accept(world, *storm)
    accept(world, alert(xid(node="node99", job="99")))
    batches = []
    while (result := world.engine.inbox.ingest_next()) is not None:
        batches.append((result.alerts, len(result.opened)))
    # The storm's first delivery (new alerts, in two batches), then the new alert, then the repeats.
    assert batches[:3] == [(10, 10), (10, 10), (1, 1)]
    assert all(opened == 0 for _, opened in batches[3:]) and sum(n for n, _ in batches[3:]) == 100
    assert len(stored_alerts(world.engine)) == 21 and inbox_rows(world.engine) == []


def test_past_the_backlog_bound_repeats_are_refused_and_new_alerts_taken_up_to_twice_the_bound(tmp_path):
    world = make_world(tmp_path)
    world.engine.deps.settings.webhook.max_inbox_alerts = 10
    storm = fleet(6)
    accept(world, *storm)
    with pytest.raises(InboxFull, match=r"backlog of 6 alerts.*repeats only") as refused:
        accept(world, *storm)  # the same group again, while it waits: 12 would be queued, past 10
    assert refused.value.retry_after > 0
    accept(world, *(alert(xid(node=f"new{i}", job=str(2000 + i))) for i in range(13)))  # new: 19, taken
    with pytest.raises(InboxFull, match=r"backlog of 19 alerts.*new alerts"):
        accept(world, *(alert(xid(node=f"newer{i}", job=str(3000 + i))) for i in range(2)))  # 21 > 2 x 10
    accept(world, alert(xid(node="newest", job="4000")))  # 20: taken
    world.engine.inbox.ingest_all()
    accept(world, *storm)  # the backlog gone: taken again
    assert len(inbox_rows(world.engine)) == 1


def test_a_new_process_resumes_a_half_ingested_notification_without_ingesting_an_alert_twice(tmp_path):
    world = make_world(tmp_path)
    world.engine.deps.settings.worker.inbox_batch_alerts = 3
    accept(world, *fleet(7))
    world.engine.inbox.ingest_next()  # then the process dies
    restarted = Engine(world.engine.deps)  # nothing cached: it reads where the first one stopped
    assert restarted.inbox.ingest_all().alerts == 4
    rows = stored_alerts(restarted)
    assert len(rows) == 7 and {r["notifications"] for r in rows} == {1}
    assert inbox_rows(restarted) == []


def test_a_notification_whose_ingestion_raises_is_set_aside_and_the_queue_moves_on(tmp_path, monkeypatch):
    world = make_world(tmp_path)
    poisoned = accept(world, alert(xid(node="node9", job="9")))
    accept(world, alert(xid()))
    real_match = world.engine.deps.playbooks.match
    monkeypatch.setattr(world.engine.deps.playbooks, "match", matching_that_raises_on(world, "node9"))
    assert backlog(world.engine) == 2
    total = world.engine.inbox.ingest_all()
    assert backlog(world.engine) == 0  # the set-aside notification waits outside the backlog
    assert len(total.opened) == 1  # the second notification went through
    (row,) = inbox_rows(world.engine)
    assert row["id"] == poisoned and row["failed_at"] is not None
    assert row["error"] == "RuntimeError: a bug in matching"
    assert row["next_alert"] == 0 and [a["labels"]["Hostname"] for a in stored_alerts(world.engine)] == [
        "node1"
    ]
    with world.engine.deps.store.read() as conn:
        kinds = [r.kind for r in records.iter_ledger(conn)]
        assert "inbox_failed" in kinds
        assert records.inbox_stats(conn)["failed"] == 1 and records.peek_inbox(conn, 1) == []

    monkeypatch.setattr(world.engine.deps.playbooks, "match", real_match)  # the fix is deployed
    with world.engine.deps.store.transaction() as conn:
        assert records.retry_failed_inbox(conn) == 1
    assert backlog(world.engine) == 1
    assert len(world.engine.inbox.ingest_all().opened) == 1 and inbox_rows(world.engine) == []
    assert backlog(world.engine) == 0


def test_work_once_alternates_inbox_batches_and_incident_ticks(tmp_path):
    world = make_world(tmp_path)
    world.engine.deps.settings.worker.inbox_batch_alerts = 1
    accept(world, *fleet(3))
    assert world.engine.work_once("w")  # one alert in, and its incident ticked in the same round
    assert inbox_rows(world.engine)[0]["next_alert"] == 1
    (first,) = world.engine.incidents()
    assert first["state"] != "open"
    world.run()
    assert inbox_rows(world.engine) == [] and len(world.engine.incidents()) == 3


def test_the_embedded_worker_wakes_on_accept_rather_than_at_its_next_poll(tmp_path):
    world = make_world(tmp_path)
    idle_rounds = []
    real_work_once = world.engine.work_once

    def work_once(worker):
        did = real_work_once(worker)
        if not did:
            idle_rounds.append(worker)
        return did

    world.engine.work_once = work_once
    stop = threading.Event()
    thread = threading.Thread(target=run_worker, args=(world.engine, stop, 3600.0), daemon=True)
    thread.start()
    try:
        wait_until(lambda: idle_rounds, timeout=10, what="the worker to find nothing and wait an hour")
        accept(world, alert(xid()))
        wait_until(lambda: len(world.engine.incidents()) == 1, timeout=10, what="the incident")
    finally:
        stop.set()
        world.engine.wakeup.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_version_1_store_is_upgraded_in_place(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    old = Store.from_url(url)
    with old.transaction() as conn:
        metadata.create_all(conn, tables=[t for t in metadata.sorted_tables if t.name != "inbox"])
        conn.execute(insert(schema_version).values(version=1, applied_at=old.clock.now()))
    old.dispose()
    store = Store.from_url(url)
    store.create_schema()
    with store.transaction() as conn:
        assert records.enqueue_notification(conn, store.clock.now(), "r", 1, "{}") == 1
        versions = conn.execute(select(schema_version.c.version).order_by(schema_version.c.version)).scalars()
        assert list(versions) == [1, SCHEMA_VERSION]
        assert conn.execute(select(func.count()).select_from(inbox_table)).scalar() == 1


@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_batch_size_below_one_is_refused(value):
    with pytest.raises(ConfigError, match=r"worker.inbox_batch_alerts: must be positive"):
        load_settings(env={"NIGHTSHIFT_WORKER__INBOX_BATCH_ALERTS": value})
