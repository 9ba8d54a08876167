"""Retention on a real PostgreSQL: the pruning scenario of tests/unit/test_retention.py (what goes, what stays,
the export, the counts), and two replicas' workers pruning at once delete each row once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import select

from app.store.schema import ledger
from tests.payloads import alert, xid
from tests.unit import test_retention as scenario
from tests.unit.test_retention import make_engine, rows, send

pytestmark = pytest.mark.integration


def test_a_pass_prunes_closed_history_and_keeps_what_is_open_on_postgres(tmp_path, postgres_url):
    scenario.test_a_pass_prunes_closed_history_and_keeps_what_is_open(tmp_path, store_url=postgres_url)


def test_two_replicas_pruning_at_once_delete_each_row_once(tmp_path: Path, postgres_url: str):
    first = make_engine(tmp_path / "a", postgres_url, enabled=False, batch_rows=3, export_dir=None)
    for n in range(12):  # advisory: each closes (node3's incidents would wait open, granted)
        send(first, alert(xid(f"node{(1, 2, 4, 5)[n % 4]}", job=str(500 + n))))
    first.deps.clock.advance(days=31)  # type: ignore[attr-defined]
    second = make_engine(tmp_path / "b", postgres_url, batch_rows=3, export_dir=None)
    second.deps.clock = first.deps.clock
    first.deps.settings.retention.enabled = True
    before = rows(first)

    def work(engine, worker: str) -> None:
        while engine.retention.work_once(worker):
            pass

    # Both claim a pass at once: the control row lets one of them start it; each batch is SKIP LOCKED.
    first.retention._next_look = second.retention._next_look = None
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda pair: work(*pair), [(first, "a"), (second, "b")]))
    after = rows(first)
    gone = {table: len(before[table] - after[table]) for table in before}
    assert gone["incidents"] == 12
    with first.deps.store.read() as conn:
        summaries = [
            r.data["deleted"] for r in conn.execute(select(ledger.c.data).where(ledger.c.kind == "retention"))
        ]
    counted: dict[str, int] = {}
    for summary in summaries:
        for table, count in summary.items():
            counted[table] = counted.get(table, 0) + count
    assert counted == {table: n for table, n in gone.items() if n}
