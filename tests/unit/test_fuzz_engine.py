"""Property-based tests (hypothesis) of the webhook endpoint and of the engine.

- Webhook: any body (random bytes, random JSON, payload-shaped documents, sound payloads with random label text)
  gets 200, 400 or 413, and every refusal has the JSON error shape. Never a 5xx.
- Engine: any sequence of deliveries (duplicates, repeats, resolutions, out of order, hostile target values) and
  worker ticks on a fake clock keeps the store's invariants: one open incident per (playbook, target), one
  incident per alert instance and playbook, no instance recorded twice, a resolution never undone, no tick
  failing, and no action called with a value outside its schema.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from app.domain.alertmanager import am_fingerprint, parse_notification
from app.store import records
from app.store.schema import alerts, incident_alerts, incidents
from tests.fakes import START, FakeSample
from tests.payloads import alert, payload, xid
from tests.strategies import JOBS, NODES, alert_docs, json_values, payloads
from tests.webapps import build_app, headers
from tests.worlds import GRANTS, World, make_world

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_BODY = 8 * 1024

# --- the webhook endpoint ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    app = build_app(tmp_path_factory.mktemp("fuzz-webhook"), max_body_bytes=MAX_BODY)
    yield app
    app.extensions["nightshift"].store.dispose()


label_text = st.text(max_size=40) | st.builds(
    lambda s, n: s * n, st.text(min_size=1, max_size=4), st.integers(0, 3000)
)
sound_with_random_labels = st.builds(
    lambda node, job, gpu, extra: json.dumps(
        payload(alert({**xid(node=node, job=job, gpu=gpu), "extra": extra}))
    ),
    label_text,
    label_text,
    label_text,
    label_text,
)
bodies = (
    st.binary(max_size=300)
    | json_values.map(json.dumps)
    | payloads.map(json.dumps)
    | sound_with_random_labels
    | st.text(max_size=300)
)


@FUZZ
@given(bodies)
def test_webhook_answers_only_200_400_or_413(webhook: Flask, data: str | bytes) -> None:
    response = webhook.test_client().post("/api/v1/alerts", data=data, headers=headers())
    assert response.status_code in (200, 400, 413), (response.status_code, response.get_data()[:300])
    document = response.json
    if response.status_code == 200:
        assert document["status"] == "ok"
    else:
        assert document["status"] == "error" and document["message"]


# --- the engine --------------------------------------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("deliver"), st.lists(alert_docs(), min_size=1, max_size=3)),
        st.tuples(st.just("tick"), st.sampled_from((0, 30, 301, 601, 3600))),
        st.tuples(st.just("verify"), st.booleans()),
    ),
    min_size=1,
    max_size=25,
)


def check_invariants(world: World, delivered: set[tuple[str, str]], resolved: set[tuple[str, str]]) -> None:
    deps = world.engine.deps
    with deps.store.transaction() as conn:
        rows = conn.execute(select(alerts.c.fingerprint, alerts.c.starts_at, alerts.c.status)).all()
        instances = [(fp, starts.isoformat()) for fp, starts, _ in rows]
        assert len(instances) == len(set(instances)) == len(delivered)  # none lost, none stored twice
        assert set(instances) == delivered
        for fp, starts, status in rows:
            if (fp, starts.isoformat()) in resolved:
                assert status == "resolved"  # a resolution is never undone by a late firing copy
        open_keys = conn.execute(
            select(incidents.c.playbook, incidents.c.target_key).where(incidents.c.open_key.is_not(None))
        ).all()
        assert len(open_keys) == len(set(open_keys))
        per_instance = conn.execute(
            select(incident_alerts.c.alert_id, incidents.c.playbook, func.count())
            .join(incidents, incidents.c.id == incident_alerts.c.incident_id)
            .group_by(incident_alerts.c.alert_id, incidents.c.playbook)
        ).all()
        assert all(count == 1 for _, _, count in per_instance)  # a repeat never opens a second incident
        for inc in records.list_incidents(conn, limit=10_000):
            if inc.outcome == "resolved" and "before any action" in inc.reason:
                assert not inc.acted and records.firing_alert_count(conn, inc.id) == 0
            assert (inc.open_key is None) == (inc.outcome is not None)
        kinds = [row.kind for row in records.iter_ledger(conn)]
    assert "engine_error" not in kinds
    for action in world.actions.values():
        for params in action.script.calls:
            assert action.validate(params) == params, action.name
            assert params.get("node", "node1") in NODES[:3] and params.get("job", "1234") in JOBS[:2]


@FUZZ
@given(operations)
def test_any_delivery_order_keeps_the_store_invariants(ops: list[tuple[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        world = make_world(Path(tmp), GRANTS)
        world.prometheus.default = [FakeSample({}, 1.0)]
        delivered: set[tuple[str, str]] = set()
        resolved: set[tuple[str, str]] = set()
        try:
            for kind, arg in ops:
                if kind == "deliver":
                    world.engine.ingest(parse_notification(json.dumps(payload(*arg))))
                    for doc in arg:
                        instance = (am_fingerprint(doc["labels"]), doc["startsAt"].replace("Z", "+00:00"))
                        delivered.add(instance)
                        if doc["status"] == "resolved":
                            resolved.add(instance)
                elif kind == "tick":
                    world.clock.advance(arg)
                    world.run()
                else:
                    world.prometheus.down = not arg
                check_invariants(world, delivered, resolved)
            world.clock.advance(hours=2)
            world.run()
            check_invariants(world, delivered, resolved)
        finally:
            world.engine.deps.store.dispose()


def test_a_repeat_after_the_incident_closed_opens_nothing_but_a_re_fire_does(tmp_path):
    """Found by the property above: Alertmanager's repeat_interval re-sends an alert instance whose incident
    has already closed (here: advisory); that is the same fault, not a new one."""
    world = make_world(tmp_path)
    first = world.send(alert(xid())).opened
    world.run()
    assert world.incident(first[0])["outcome"] == "advisory"
    repeat = world.send(alert(xid()))
    assert (repeat.opened, repeat.attached) == ([], [])
    refire = world.send(alert(xid(), starts_at=START + timedelta(hours=1)))
    assert len(refire.opened) == 1 and refire.opened != first
