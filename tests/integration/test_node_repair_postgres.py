"""Node repair records on a real PostgreSQL: one open repair per node and one claim per repair under concurrent
writers (replicas), and the whole Slurm lifecycle with the fake host on this backend."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from app.domain.states import RepairState
from app.store import Store, repairs
from app.store.claims import REPAIRS
from tests.fakes import START, FakeClock
from tests.unit import test_node_repair as scenarios

pytestmark = pytest.mark.integration


def test_concurrent_requests_open_one_repair_and_one_worker_claims_it(postgres_url: str) -> None:
    stores = [Store.from_url(postgres_url, FakeClock()) for _ in range(4)]
    stores[0].create_schema()
    barrier = threading.Barrier(len(stores))

    def request(store: Store) -> int:
        barrier.wait(timeout=10)
        with store.transaction() as conn:
            return repairs.request_repair(
                conn,
                node="node2",
                scheduler="slurm",
                playbook=None,
                incident_id=None,
                reason="Xid",
                now=START,
            )

    def claim(store: Store) -> int | None:
        barrier.wait(timeout=10)
        with store.transaction() as conn:
            return REPAIRS.claim_next(conn, f"w{id(store)}", START, timedelta(minutes=5))

    try:
        with ThreadPoolExecutor(len(stores)) as pool:
            ids = set(pool.map(request, stores))
            claims = list(pool.map(claim, stores))
        assert len(ids) == 1
        assert [c for c in claims if c is not None] == list(ids)
        with stores[0].read() as conn:
            rows = repairs.list_repairs(conn, node="node2")
            absorbed = [r.as_dict() for r in repairs.records.iter_ledger(conn) if r.kind == "repair_absorbed"]
        assert [r.state for r in rows] == [RepairState.REQUESTED]
        assert len(absorbed) == len(stores) - 1
    finally:
        for store in stores:
            store.dispose()


@pytest.mark.parametrize(
    "scenario",
    [
        scenarios.test_drain_reboot_validate_resume,
        scenarios.test_validation_fails_node_held_and_stays_out,
        scenarios.test_a_node_drained_by_someone_else_is_never_resumed,
        scenarios.test_lemon_rule_holds_a_node_repaired_too_often,
        scenarios.test_a_step_in_flight_at_a_crash_is_held_never_rerun,
    ],
    ids=lambda f: f.__name__.removeprefix("test_"),
)
def test_repair_scenarios_on_postgres(scenario, postgres_url: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(scenarios, "STORE_URL", postgres_url)
    scenario(tmp_path)
