"""A store written by an older Nightshift gets the columns added since, in place, and keeps its rows."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, insert, inspect, select, text

from app.store import BACKLOG_SUM, Store, records
from app.store.schema import ADDED_COLUMNS, ADDED_INDEXES, SCHEMA_VERSION, inbox, metadata, schema_version
from tests.fakes import START


def test_a_version_2_store_gets_the_episode_columns_and_keeps_its_incidents(tmp_path):
    url = f"sqlite:///{tmp_path}/v2.db"
    old = Store.from_url(url)
    with old.transaction() as conn:
        metadata.create_all(conn)
        for table, column in ADDED_COLUMNS[3]:
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        conn.execute(insert(schema_version).values(version=2, applied_at=START))
        conn.execute(
            text(
                "INSERT INTO incidents (playbook, target_key, target, state, reason, labels, annotations, "
                "alert_starts_at, generator_url, attempt, acted, held_by_guard, alert_resolved, finalize_pending, "
                "opened_at, updated_at) VALUES ('p', 'k', '{}', 'recovered', '', '{}', '{}', :t, '', 1, 1, 0, 0, 0, "
                ":t, :t)"
            ),
            {"t": START.replace(tzinfo=None)},
        )
    old.dispose()
    assert "kind" not in {c["name"] for c in inspect(Store.from_url(url).engine).get_columns("incidents")}

    store = Store.from_url(url)
    store.create_schema()
    columns = {c["name"] for c in inspect(store.engine).get_columns("incidents")}
    assert {column for _, column in ADDED_COLUMNS[3]} <= columns
    with store.read() as conn:
        versions = list(
            conn.execute(select(schema_version.c.version).order_by(schema_version.c.version)).scalars()
        )
        incident = records.get_incident(conn, 1)
    assert versions == [2, SCHEMA_VERSION]
    assert incident is not None and incident.kind == "target" and incident.tick_errors == 0
    assert incident.culprits == ()  # the column added by version 3 is NULL: none named
    store.create_schema()  # a second start changes nothing


def _upgraded(tmp_path, version: int, queue: Callable[[Connection], None] | None = None) -> Store:
    """A store written at schema ``version`` (without the indexes and the backlog counter added after it), its
    inbox filled by ``queue`` as that version would, opened and upgraded."""
    url = f"sqlite:///{tmp_path}/v{version}.db"
    old = Store.from_url(url)
    with old.transaction() as conn:
        metadata.create_all(conn)
        for added, names in ADDED_INDEXES.items():
            for name in names if added > version else ():
                conn.execute(text(f"DROP INDEX {name}"))
        if version < 12:
            conn.execute(text("DROP TABLE inbox_counter"))
        if queue is not None:
            queue(conn)
        conn.execute(insert(schema_version).values(version=version, applied_at=START))
    old.dispose()
    store = Store.from_url(url)
    store.create_schema()
    return store


def _plan(store: Store, query: str) -> str:
    with store.read() as conn:
        return " ".join(str(row[-1]) for row in conn.execute(text(f"EXPLAIN QUERY PLAN {query}")))


def test_a_version_9_store_gets_the_inbox_queue_index(tmp_path):
    store = _upgraded(tmp_path, 9)
    indexes = {i["name"] for i in inspect(store.engine).get_indexes("inbox")}
    assert set(ADDED_INDEXES[10]) <= indexes
    # the worker's next batch is an index seek, not a sort of the queue
    plan = _plan(store, "SELECT * FROM inbox WHERE failed_at IS NULL ORDER BY lane, id LIMIT 1")
    assert "ix_inbox_queue" in plan and "TEMP B-TREE" not in plan, plan
    store.create_schema()  # a second start changes nothing


def test_a_version_10_store_gets_the_backlog_index_and_the_backlog_is_read_from_it(tmp_path):
    store = _upgraded(tmp_path, 10)
    assert set(ADDED_INDEXES[11]) <= {i["name"] for i in inspect(store.engine).get_indexes("inbox")}
    with store.read() as conn:  # the webhook's backlog check reads no notification body
        compiled = str(BACKLOG_SUM.compile(conn, compile_kwargs={"literal_binds": True}))
    plan = _plan(store, compiled)
    assert "COVERING INDEX ix_inbox_backlog" in plan, plan


def test_a_version_11_store_gets_the_backlog_counter_holding_what_is_queued(tmp_path):
    def queue(conn: Connection) -> None:  # as version 11 wrote its queue: rows only
        rows = [(5, 0, None), (8, 3, None), (7, 2, START)]  # alert_count, next_alert, failed_at
        for count, done, failed in rows:
            conn.execute(insert(inbox).values(received_at=START, receiver="r", alert_count=count,
                                              next_alert=done, body="{}", failed_at=failed))  # fmt: skip

    store = _upgraded(tmp_path, 11, queue)
    with store.read() as conn:
        assert records.inbox_backlog(conn) == 5 + (8 - 3)  # the set-aside notification is not counted
    store.create_schema()  # a second start changes nothing
    with store.read() as conn:
        assert records.inbox_backlog(conn) == 10
