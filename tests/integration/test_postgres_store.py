"""The store on a real PostgreSQL 15 behaves as on SQLite: the engine scenarios run on both backends, and the
idempotency and claim guarantees hold under concurrent writers (SKIP LOCKED, unique constraints)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text

from app.config import StoreSettings
from app.domain.alertmanager import parse_notification
from app.engine import Engine
from app.store import PG_POOL_SIZE, Store, records
from app.store.claims import INCIDENTS
from app.store.schema import alerts, incident_alerts, incidents, store_probe
from tests.bounded import store_unavailable_after
from tests.fakes import START, FakeClock
from tests.payloads import HOSTILE, alert, payload, xid
from tests.unit import test_engine as scenarios
from tests.webapps import build_app, headers
from tests.worlds import World

pytestmark = pytest.mark.integration

# The engine's unit scenarios, run unchanged against each backend (a representative subset: lifecycle,
# idempotency, guards, crash recovery, claims, approvals).
SCENARIOS: list[Callable[..., None]] = [
    scenarios.test_default_is_advisory_every_change_would_run_and_nothing_is_called,
    scenarios.test_whitelisted_steps_run_then_verification_recovers,
    scenarios.test_duplicates_and_repeats_attach_to_the_open_incident,
    scenarios.test_resolved_before_acting_closes_and_late_firing_is_ignored,
    scenarios.test_resolved_while_acting_lets_verification_finish_and_runs_undo_steps,
    scenarios.test_budget_backoff_then_needs_human,
    scenarios.test_cooldown_then_stale_signal,
    scenarios.test_serialisation_one_incident_per_node_at_a_time,
    scenarios.test_blast_radius_holds_the_fourth_node_and_notifies_once,
    scenarios.test_kill_switch_pauses_and_resume_continues,
    scenarios.test_retry_outcome_waits_and_runs_again,
    scenarios.test_hostile_label_never_reaches_an_action,
    scenarios.test_step_in_flight_at_a_crash_is_ambiguous_and_not_rerun,
    scenarios.test_claims_are_exclusive_until_the_lease_expires,
    scenarios.test_step_marked_approval_required_waits_for_an_operator,
    scenarios.test_operator_marks_an_open_incident_handled,
]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty store of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store' / 'nightshift.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def backend_worlds(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Store]]:
    """Make ``make_world`` (as the scenarios call it) build its world on ``store_url``."""
    built: list[Store] = []
    make_sqlite_world = scenarios.make_world

    def make_world(tmp_path: Any, *args: Any, **kwargs: Any) -> World:
        world = make_sqlite_world(tmp_path, *args, **kwargs)
        store = Store.from_url(store_url, world.clock)
        store.create_schema()
        world.engine.deps.store = store
        built.append(store)
        return world

    monkeypatch.setattr(scenarios, "make_world", make_world)
    yield built
    for store in built:
        store.dispose()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__.removeprefix("test_") for s in SCENARIOS])
def test_engine_scenario(scenario, backend_worlds, store_url, tmp_path):
    scenario(tmp_path)
    assert backend_worlds and backend_worlds[0].dialect == store_url.split(":")[0]


def test_postgres_store_keeps_aware_utc_times_and_json(postgres_url):
    store = Store.from_url(postgres_url, FakeClock())
    try:
        assert store.dialect == "postgresql"
        labels = {**xid(), "note": "ünïcödé \u202e ok"}
        notification = parse_notification(json.dumps(payload(alert(labels))))
        first = notification.alerts[0]
        with store.transaction() as conn, records.alert_batch_of(conn, [(notification, first)], START, ()):
            alert_id, previous = records.upsert_alert(conn, first, START)
        with store.transaction() as conn:
            stored = records.get_alert(conn, alert_id)
        assert previous is None and stored is not None
        assert stored.starts_at == START and stored.starts_at.tzinfo is not None
        assert stored.labels == labels
    finally:
        store.dispose()


def _ingest_concurrently(world: World, body: str, copies: int) -> list[Any]:
    notification = parse_notification(body)
    barrier = threading.Barrier(copies)

    def deliver(_: int) -> Any:
        barrier.wait()  # all replicas' deliveries race into the store at once
        return world.engine.ingest(notification)

    with ThreadPoolExecutor(max_workers=copies) as pool:
        return list(pool.map(deliver, range(copies)))


def test_concurrent_deliveries_of_one_group_yield_one_incident(backend_worlds, store_url, tmp_path):
    world = scenarios.make_world(tmp_path, scenarios.GRANTS)
    group = json.dumps(payload(alert(xid()), alert(xid(gpu="5")), alert(xid(node="node2", job="99"))))
    results = _ingest_concurrently(world, group, copies=8)
    opened = sorted(i for r in results for i in r.opened)
    assert len(opened) == 2  # node1/1234 and node2/99, each opened by exactly one delivery
    with world.engine.deps.store.transaction() as conn:
        assert conn.execute(select(func.count()).select_from(alerts)).scalar_one() == 3
        assert conn.execute(select(func.count()).select_from(incidents)).scalar_one() == 2
        assert conn.execute(select(func.count()).select_from(incident_alerts)).scalar_one() == 3
        counted = conn.execute(select(func.sum(alerts.c.notifications))).scalar_one()
    assert counted == 8 * 3  # every delivery of every alert counted once, none lost to a racing update


def test_concurrent_workers_claim_each_incident_once(backend_worlds, store_url, tmp_path):
    world = scenarios.make_world(tmp_path, scenarios.GRANTS)
    for n in range(12):
        world.send(alert(xid(node=f"node{n}", job=str(500 + n))))
    store = world.engine.deps.store
    lease = timedelta(minutes=2)
    barrier = threading.Barrier(6)

    def claim_all(worker: str) -> list[int]:
        barrier.wait()
        mine = []
        while True:
            with store.transaction() as conn:
                row_id = INCIDENTS.claim_next(conn, worker, world.clock.now(), lease)
            if row_id is None:
                return mine
            mine.append(row_id)

    with ThreadPoolExecutor(max_workers=6) as pool:
        claimed = list(pool.map(claim_all, [f"w{i}" for i in range(6)]))
    flat = [i for ids in claimed for i in ids]
    assert sorted(flat) == sorted(set(flat)) and len(flat) == 12
    with store.transaction() as conn:
        holders = dict(conn.execute(select(incidents.c.id, incidents.c.claimed_by)).all())
    assert all(holders[i] == f"w{n}" for n, ids in enumerate(claimed) for i in ids)


def test_replicas_draining_one_inbox_ingest_every_alert_exactly_once(backend_worlds, store_url, tmp_path):
    world = scenarios.make_world(tmp_path, scenarios.GRANTS)
    world.engine.deps.settings.worker.inbox_batch_alerts = 2
    for n in range(20):
        group = [alert(xid(node=f"node{n}-{gpu}", job=str(n), gpu=str(gpu))) for gpu in range(5)]
        doc = json.dumps(payload(*group)).encode()
        world.engine.accept(parse_notification(doc), doc)
    replicas = [
        Engine(world.engine.deps) for _ in range(6)
    ]  # each with its own inbox state, as processes have
    barrier = threading.Barrier(len(replicas))

    def drain(replica: Engine) -> int:
        barrier.wait()
        return replica.inbox.ingest_all().alerts

    with ThreadPoolExecutor(max_workers=len(replicas)) as pool:
        ingested = list(pool.map(drain, replicas))
    assert sum(ingested) == 100
    with world.engine.deps.store.read() as conn:
        per_alert = conn.execute(select(alerts.c.notifications)).scalars().all()
        assert records.inbox_stats(conn) == {"pending": 0, "failed": 0, "oldest_pending_at": None}
    assert len(per_alert) == 100 and set(per_alert) == {1}


def test_open_key_unique_constraint_holds_on_the_backend(backend_worlds, store_url, tmp_path):
    world = scenarios.make_world(tmp_path)
    incident_id = world.send(alert(xid())).opened[0]
    with world.engine.deps.store.transaction() as conn:
        existing = records.get_incident(conn, incident_id)
        assert existing is not None
        copy = {k: v for k, v in existing.as_dict().items() if k != "id"}
        assert records.insert_incident(conn, copy) is None  # same (playbook, target) while open
        copy["open_key"] = None  # closed incidents never collide
        assert records.insert_incident(conn, copy) is not None
        assert records.insert_incident(conn, copy) is not None


def _hostile_documents(name: str, value: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """One payload per place a value can sit, each otherwise sound and a new alert (so that it is inserted)."""
    placements: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
        "label": lambda doc, a: a["labels"].update(gpu=value),
        "alertname": lambda doc, a: a["labels"].update(alertname=value),
        "target_label": lambda doc, a: a["labels"].update(Hostname=value),
        "annotation": lambda doc, a: a["annotations"].update(summary=value),
        "generatorURL": lambda doc, a: a.update(generatorURL=value),
        "receiver": lambda doc, a: doc.update(receiver=value),
        "groupKey": lambda doc, a: doc.update(groupKey=value),
        "externalURL": lambda doc, a: doc.update(externalURL=value),
    }
    for where, place in placements.items():
        doc = payload(alert({**xid(node="node2"), "probe": f"{name}-{where}"}))
        place(doc, doc["alerts"][0])
        yield where, doc


def test_hostile_payload_fields_on_postgresql_are_never_a_5xx(postgres_url, tmp_path):
    """PostgreSQL text cannot hold NUL and is stricter than SQLite: a hostile value anywhere in a payload is a
    200 (recorded as data) or a 400, never a 5xx."""
    app = build_app(tmp_path, store_url=postgres_url)
    client = app.test_client()
    try:
        for name, value in HOSTILE.items():
            for where, doc in _hostile_documents(name, value):
                response = client.post("/api/v1/alerts", data=json.dumps(doc), headers=headers())
                assert response.status_code in (200, 400), (name, where, response.status_code, response.json)
        engine = app.extensions["nightshift"].engine
        engine.run_until_idle()
        assert engine.inbox_stats()["failed"] == 0, "a notification answered 200 could not be ingested"
    finally:
        app.extensions["nightshift"].store.dispose()


# --- bounded waits: each wait for PostgreSQL ends in StoreUnavailable (503 on the webhook), never a hang ---------


def test_a_row_lock_held_by_another_connection_is_given_up_after_lock_timeout(postgres_url):
    """Another replica holds the readiness probe's row: this one's probe (a write, as /readyz runs it) fails after
    store.lock_timeout_seconds with the reason, and succeeds once the lock is released."""
    store = Store.from_url(postgres_url, FakeClock(), StoreSettings(lock_timeout_seconds=1))
    other = Store.from_url(postgres_url)
    try:
        store.check_writable()
        with other.transaction() as conn:
            conn.execute(select(store_probe).where(store_probe.c.id == 1).with_for_update())
            with store_unavailable_after(1.0, "lock timeout"):
                store.check_writable()
        store.check_writable()
    finally:
        store.dispose()
        other.dispose()


def test_a_statement_running_past_statement_timeout_is_cancelled(postgres_url):
    store = Store.from_url(postgres_url, settings=StoreSettings(statement_timeout_seconds=1))
    try:
        with store_unavailable_after(1.0, "statement timeout"), store.read() as conn:
            conn.execute(text("SELECT pg_sleep(30)"))
    finally:
        store.dispose()


def test_a_request_finding_every_pooled_connection_busy_waits_at_most_lock_timeout(postgres_url):
    store = Store.from_url(postgres_url, settings=StoreSettings(lock_timeout_seconds=1))
    try:
        with ExitStack() as held:
            for _ in range(2 * PG_POOL_SIZE):  # pool_size, then max_overflow
                held.enter_context(store.engine.connect())
            with store_unavailable_after(1.0, "no free connection"), store.read():
                pass
        with store.read():  # returned to the pool: answers again
            pass
    finally:
        store.dispose()


def test_the_node_filter_finds_a_job_incident_by_any_of_its_culprits_on_postgres(tmp_path, postgres_url):
    from tests.unit import test_episodes

    test_episodes.test_the_node_filter_finds_a_job_incident_by_any_of_its_culprits(tmp_path, url=postgres_url)


def test_the_store_reads_culprits_an_older_version_wrote_and_writes_the_same_json_on_postgres(postgres_url):
    from tests.unit import test_culprits

    store = Store.from_url(postgres_url)
    try:
        store.create_schema()
        test_culprits.test_the_store_reads_culprits_an_older_version_wrote_and_writes_the_same_json(store)
    finally:
        store.dispose()


def test_the_fleet_reads_open_job_incidents_as_their_whole_rows_say_on_postgres(tmp_path, postgres_url):
    from tests.unit import test_episodes

    test_episodes.test_the_fleet_reads_open_job_incidents_as_their_whole_rows_say(tmp_path, url=postgres_url)
