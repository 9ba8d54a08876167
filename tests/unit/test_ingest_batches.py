"""Ingestion in batches (app/store/alert_batch.py, app/engine/inbox.py): a transaction takes several notifications,
reads its alerts and their incidents once and writes them once, and leaves the store exactly as ingesting one
alert a transaction does."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from app.domain.alertmanager import parse_notification
from app.domain.states import LedgerKind
from app.engine import inbox as inbox_module
from app.engine.inbox import NEW_ALERTS, REPEATS, Inbox, take
from app.store import records
from app.store.schema import alerts, inbox, incident_alerts, incidents, ledger
from tests.fakes import START
from tests.payloads import alert, payload, xid
from tests.strategies import alert_docs
from tests.worlds import GRANTS, World, make_world, matching_that_raises_on

# Few alert instances, so that one comes again, resolves and fires late within a batch; and the fuzz tests' wider
# mix (hostile values, unmatched Xids).
few_instances = st.builds(
    lambda node, code, minute, status: alert(
        xid(node=node, code=code), status=status, starts_at=START.replace(minute=minute)
    ),
    st.sampled_from(("node1", "node2")),
    st.sampled_from(("79", "48", "13")),
    st.sampled_from((0, 1)),
    st.sampled_from(("firing", "resolved")),
)
deliveries = st.lists(st.lists(few_instances | alert_docs(), min_size=1, max_size=4), min_size=1, max_size=12)


def accept(world: World, *docs: dict[str, Any]) -> int:
    body = json.dumps(payload(*docs)).encode()
    return world.engine.accept(parse_notification(body), body)


def tables(world: World) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of what ingestion writes, in id order; the ledger's rows without their ids, and the notices sent
    after each commit apart (a batch commits, then tells people, after more alerts than one alert does)."""
    with world.engine.deps.store.read() as conn:
        rows = {
            table.name: [tuple(row) for row in conn.execute(select(table).order_by(*table.primary_key))]
            for table in (alerts, incidents, incident_alerts)
        }
        entries = [row[1:] for row in conn.execute(select(ledger).order_by(ledger.c.id))]
    rows["ledger"] = [row for row in entries if row[2] != LedgerKind.NOTIFICATION]
    rows["notices"] = sorted(row[3] for row in entries if row[2] == LedgerKind.NOTIFICATION)
    return rows


def ingested(tmp: Path, batch: int, sent: list[list[dict[str, Any]]]) -> dict[str, list[tuple[Any, ...]]]:
    world = make_world(tmp, GRANTS)
    world.engine.deps.settings.worker.inbox_batch_alerts = batch
    try:
        for docs in sent:
            accept(world, *docs)
        world.engine.inbox.ingest_all()
        with world.engine.deps.store.read() as conn:  # the store's own count, not the batch's
            for incident in records.list_incidents(conn, open_only=True, limit=1000):
                # Nothing has acted (no worker ran): an incident is open while one of its alerts fires.
                assert records.firing_alert_count(conn, incident.id) > 0, incident
        return tables(world)
    finally:
        world.engine.deps.store.dispose()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries)
def test_a_batch_of_notifications_leaves_the_store_as_one_alert_a_transaction_does(sent):
    # Duplicates, repeats, resolutions and late firing copies, in one batch or one alert at a time.
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as many:
        alone = ingested(Path(one), 1, sent)
        together = ingested(Path(many), 64, sent)
    told, told_alone = together.pop("notices"), alone.pop("notices")
    assert together == alone
    assert alone["alerts"]  # the comparison saw what was ingested
    # People are told of alerts no playbook matches at most MAX_UNMATCHED_NOTICES times an ingestion: a batch of
    # several notifications may tell fewer, never another.
    assert not Counter(told) - Counter(told_alone) and bool(told) == bool(told_alone)


def test_an_alert_that_fires_and_resolves_in_one_batch_closes_its_incident(tmp_path):
    world = make_world(tmp_path, GRANTS)
    world.engine.deps.settings.worker.inbox_batch_alerts = 64
    fault = xid()
    accept(world, alert(fault), alert(fault, status="resolved"))
    assert world.engine.inbox.ingest_next().alerts == 2  # one transaction
    (incident,) = world.engine.incidents()
    assert incident["outcome"] == "resolved" and "before any action" in incident["reason"]
    with world.engine.deps.store.read() as conn:
        assert records.firing_alert_count(conn, incident["id"]) == 0


def portion(inbox_id: int, lane: int, alert_count: int, next_alert: int = 0) -> dict[str, int]:
    return {"id": inbox_id, "lane": lane, "alert_count": alert_count, "next_alert": next_alert}


def test_take_fills_a_batch_with_whole_notifications_of_one_lane():
    queued = [
        portion(1, NEW_ALERTS, 3),
        portion(2, NEW_ALERTS, 4),
        portion(3, NEW_ALERTS, 5),
        portion(4, REPEATS, 1),
    ]
    assert [(p.inbox_id, p.start, p.end) for p in take(queued, 8)] == [(1, 0, 3), (2, 0, 4)]
    # A notification larger than what is left waits for the next batch, whole; the lanes never mix.
    assert [p.inbox_id for p in take(queued[2:], 8)] == [3]
    assert [p.inbox_id for p in take([portion(3, NEW_ALERTS, 1), queued[3]], 8)] == [3]


def test_take_cuts_a_notification_larger_than_a_batch_where_it_stopped():
    assert [
        (p.start, p.end) for p in take([portion(1, REPEATS, 10, next_alert=4), portion(2, REPEATS, 1)], 4)
    ] == [(4, 8)]
    assert [(p.inbox_id, p.start, p.end) for p in take([portion(1, REPEATS, 10, next_alert=8)], 4)] == [
        (1, 8, 10)
    ]
    assert take([], 4) == []


def test_a_batch_that_raises_is_retried_a_notification_at_a_time_and_only_the_bad_one_is_set_aside(
    tmp_path, monkeypatch
):
    world = make_world(tmp_path, GRANTS)
    world.engine.deps.settings.worker.inbox_batch_alerts = 64
    first = accept(world, alert(xid(node="node1", job="1")))
    poisoned = accept(world, alert(xid(node="node9", job="9")))
    last = accept(world, alert(xid(node="node2", job="2")))
    monkeypatch.setattr(world.engine.deps.playbooks, "match", matching_that_raises_on(world, "node9"))
    world.engine.inbox.ingest_all()
    with world.engine.deps.store.read() as conn:
        rows = {row.id: row for row in conn.execute(select(inbox))}
        hosts = sorted(r.labels["Hostname"] for r in conn.execute(select(alerts.c.labels)))
    assert set(rows) == {poisoned} and rows[poisoned].failed_at is not None
    assert first not in rows and last not in rows
    assert hosts == ["node1", "node2"]  # each ingested once, the poisoned one not at all


@pytest.fixture
def bodies_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of the queued notifications whose bodies the worker reads from the store (filled as it does)."""
    read: list[int] = []
    real = records.inbox_bodies

    def bodies(conn: Any, inbox_ids: Sequence[int]) -> dict[int, str]:
        read.extend(inbox_ids)
        return real(conn, inbox_ids)

    monkeypatch.setattr(records, "inbox_bodies", bodies)
    return read


def test_the_worker_takes_a_notification_its_process_accepted_without_reading_its_body(tmp_path, monkeypatch):
    world = make_world(tmp_path, GRANTS)
    accept(world, alert(xid()))

    def unread(conn, inbox_ids):
        raise AssertionError(f"bodies read: {inbox_ids}")

    monkeypatch.setattr(records, "inbox_bodies", unread)
    assert len(world.engine.inbox.ingest_all().opened) == 1


def test_past_the_hand_over_bound_the_oldest_accepted_are_read_from_the_store(
    tmp_path, monkeypatch, bodies_read
):
    monkeypatch.setattr(inbox_module, "MAX_HANDED_OVER_ALERTS", 2)
    world = make_world(tmp_path, GRANTS)
    world.engine.deps.settings.worker.inbox_batch_alerts = 64
    ids = [accept(world, alert(xid(node=f"node{i}", job=str(i)))) for i in range(4)]
    assert len(world.engine.inbox.ingest_all().opened) == 4
    assert sorted(bodies_read) == ids[:2]  # the two let go; the last two were handed over


def test_serve_without_its_worker_hands_nothing_over(tmp_path, bodies_read):
    world = make_world(tmp_path, GRANTS)
    world.engine.deps.settings.embedded_worker = False
    serve = Inbox(world.engine.deps)  # as ``serve`` builds it with that setting
    body = json.dumps(payload(alert(xid()))).encode()
    inbox_id = serve.accept(parse_notification(body), body)
    assert len(serve.ingest_all().opened) == 1 and bodies_read == [inbox_id]
