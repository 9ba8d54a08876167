"""Retention (issue 22 item 8): what a pass deletes and keeps, its export, its bounds, and the store's size under a
steady stream, with the shipped playbooks, a fake clock and a real SQLite store (PostgreSQL:
tests/integration/test_retention_postgres.py runs the pruning scenario there)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from app import build_engine
from app.cli import cli
from app.clients import Clients
from app.config import Settings, load_settings
from app.domain.alertmanager import parse_notification
from app.domain.errors import ConfigError
from app.domain.playbooks import PlaybookSet, parse_playbooks
from app.domain.retention import check_windows
from app.engine import Engine
from app.metrics import PRUNED_TABLES
from app.store import records
from app.store import retention as prunable
from app.store.schema import inbox, ledger, metadata, node_repairs
from bench.retention import stream
from tests.fakes import FakeClock
from tests.payloads import alert, body, xid

UNMATCHED = {"alertname": "DiskAlmostFull", "instance": "host1", "severity": "warning"}


# Node3's job may be requeued: with no Prometheus its incident waits for a re-check, open; the others are advisory.
PERMISSIONS = """
apiVersion: nightshift/v1
kind: Permissions
allow:
  - action: slurm.requeue_job
    nodes: "node3"
"""


def make_engine(tmp_path: Path, store_url: str | None = None, **retention: Any) -> Engine:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "permissions.yaml").write_text(PERMISSIONS)
    settings = Settings(
        data_dir=str(tmp_path / "data"),
        store_url=store_url,
        permissions_file=str(tmp_path / "permissions.yaml"),
    )
    settings.retention.incidents_days = 30
    settings.retention.alerts_days = 7
    settings.retention.export_dir = str(tmp_path / "export")
    for key, value in retention.items():
        setattr(settings.retention, key, value)
    return build_engine(settings, clock=FakeClock(), clients=Clients(settings))


def send(engine: Engine, *alerts: dict[str, Any]) -> None:
    raw = body(*alerts)
    engine.accept(parse_notification(raw), raw)
    engine.run_until_idle()


def rows(engine: Engine) -> dict[str, set[int]]:
    """Every row of every table retention touches, as (table -> primary keys)."""
    found: dict[str, set[Any]] = {}
    with engine.deps.store.read() as conn:
        for name in PRUNED_TABLES:
            table = metadata.tables[name]
            key = list(table.primary_key.columns)
            found[name] = {tuple(r) if len(key) > 1 else r[0] for r in conn.execute(select(*key))}
    return found


def unattached_kinds(engine: Engine) -> Counter[str]:
    """The kinds of the ledger rows of no incident."""
    with engine.deps.store.read() as conn:
        return Counter(
            r.kind for r in conn.execute(select(ledger.c.kind).where(ledger.c.incident_id.is_(None)))
        )


def incident_of(engine: Engine, job: str) -> dict[str, Any]:
    (found,) = engine.incidents(job=job)
    return found


def test_a_pass_prunes_closed_history_and_keeps_what_is_open(tmp_path, store_url: str | None = None):
    engine = make_engine(tmp_path, store_url, enabled=False)  # until the pass below
    clock = engine.deps.clock
    assert isinstance(clock, FakeClock)
    # Day 0: two jobs fail and their incidents close (advisory); a third job's incident stays open (waiting for
    # a re-check); an alert no playbook matches; a notification whose ingestion failed; an operator holds node9
    # and pauses automation for a while.
    send(engine, alert(xid("node1", job="101")))
    send(engine, alert(xid("node2", job="102")))
    send(engine, alert(xid("node3", job="103")))
    send(engine, alert(UNMATCHED))
    with engine.deps.store.transaction() as conn:
        set_aside = records.enqueue_notification(conn, clock.now(), "nightshift", 1, "{}")
        records.fail_inbox(conn, set_aside, clock.now(), "PayloadError: test")
    engine.repairs.hold("node9", by="alice", note="bad fan")
    engine.set_paused(True, "maintenance", "alice")
    engine.set_paused(False, "done", "alice")
    # Day 2: a fourth job's incident closes; 29 days before the pass it is still kept.
    clock.advance(days=2)
    send(engine, alert(xid("node4", job="104", gpu="1"), starts_at=clock.now()))
    # Day 31: job 102's alert is notified again (a repeat): its incident stays while the alert is alive.
    clock.advance(days=29)
    send(engine, alert(xid("node2", job="102")))
    closed_old, closed_kept, still_open, closed_recent = (
        incident_of(engine, job) for job in ("101", "102", "103", "104")
    )
    assert [i["open_key"] is None for i in (closed_old, closed_kept, still_open, closed_recent)] == [
        True,
        True,
        False,
        True,
    ]
    with engine.deps.store.read() as conn:
        doomed_links = {
            (closed_old["id"], a.id) for a in records.get_alerts_for_incident(conn, closed_old["id"])
        }
        recent_alerts = {a.id for a in records.get_alerts_for_incident(conn, closed_recent["id"])}
        open_alerts = {a.id for a in records.get_alerts_for_incident(conn, still_open["id"])}
        held = conn.execute(select(node_repairs).where(node_repairs.c.node == "node9")).one()
    before, kinds_before = rows(engine), unattached_kinds(engine)

    engine.deps.settings.retention.enabled = True
    engine.run_until_idle()
    after, kinds_after = rows(engine), unattached_kinds(engine)

    gone = {table: before[table] - after[table] for table in before}
    # Ledger rows of no incident: the per-alert ones of day 0 went, and the operator's pause and resume
    # (past incidents_days); the retention pass's own summary is new.
    assert kinds_before["alert_received"] and kinds_before["unmatched"] and kinds_before["pause"]
    assert not (kinds_after["alert_received"] or kinds_after["unmatched"] or kinds_after["pause"])
    assert after["incidents"] == before["incidents"] - {closed_old["id"]}
    assert doomed_links <= gone["incident_alerts"]
    assert open_alerts <= after["alerts"] and still_open["id"] in after["incidents"]  # never what is open
    assert recent_alerts <= gone["alerts"]  # alerts go after alerts_days, their incident stays
    assert held.id in after["node_repairs"] and set_aside in gone["inbox"]
    with engine.deps.store.read() as conn:
        assert not conn.execute(select(ledger.c.id).where(ledger.c.incident_id == closed_old["id"])).all()
        about_held = [
            r for r in conn.execute(select(ledger.c.data).where(ledger.c.incident_id.is_(None)))
            if (r.data or {}).get("repair_id") == held.id
        ]  # fmt: skip
        assert about_held, "the held node's history stays with it"
        (summary,) = conn.execute(select(ledger.c.data).where(ledger.c.kind == "retention")).all()
    deleted = {table: len(ids) for table, ids in gone.items() if ids}
    assert summary.data["deleted"] == deleted
    metrics = engine.deps.metrics
    assert {t: metrics.pruned_rows.labels(t)._value.get() for t in deleted} == deleted
    # The export holds exactly the rows deleted, each once.
    exported: dict[str, set[Any]] = {}
    for path in (tmp_path / "export").glob("pruned-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            row = entry["row"]
            key = (row["incident_id"], row["alert_id"]) if entry["table"] == "incident_alerts" else row["id"]
            exported.setdefault(entry["table"], set()).add(key)
    assert exported == {table: ids for table, ids in gone.items() if ids}


def test_nightshift_export_prunable_lists_what_the_next_pass_deletes(tmp_path):
    engine = make_engine(tmp_path, export_dir=None, enabled=False)
    send(engine, alert(xid("node1", job="101")))
    engine.deps.clock.advance(days=31)  # type: ignore[attr-defined]
    engine.deps.settings.retention.enabled = True
    with engine.deps.store.read() as conn:
        cut = prunable_cutoffs(engine)
        listed = [line for found in prunable.prunable(conn, cut, 2) for line in prunable.jsonl(found)]
    tables = {json.loads(line)["table"] for line in listed}
    assert {"incidents", "alerts", "ledger", "steps", "incident_alerts"} <= tables
    before = rows(engine)
    engine.run_until_idle()
    gone = sum(len(before[t] - ids) for t, ids in rows(engine).items())
    assert gone == len(listed)


def prunable_cutoffs(engine: Engine) -> Any:
    from app.domain.retention import cutoffs

    return cutoffs(engine.deps.settings.retention, engine.deps.clock.now())


def test_export_prunable_on_the_cli_lists_and_deletes_nothing(tmp_path):
    config = tmp_path / "settings.yaml"
    config.write_text("data_dir: data\nwebhook: {auth_disabled: true}\nretention: {alerts_days: 1}\n")
    two_days_ago = datetime.now(UTC) - timedelta(days=2)  # the CLI reads the wall clock
    engine = build_engine(load_settings(config, env={}), clock=FakeClock(two_days_ago))
    send(engine, alert(UNMATCHED, starts_at=two_days_ago))
    before = rows(engine)
    result = CliRunner().invoke(cli, ["export", "--prunable", "-c", str(config)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    listed = Counter(json.loads(line)["table"] for line in result.output.splitlines())
    assert listed == {"alerts": 1, "ledger": 2}  # the alert, its alert_received and unmatched rows
    assert rows(engine) == before


def test_a_failed_export_deletes_nothing_and_says_why(tmp_path):
    (tmp_path / "not-a-dir").write_text("")
    engine = make_engine(tmp_path, export_dir=str(tmp_path / "not-a-dir"), enabled=False)
    send(engine, alert(xid("node1", job="101")))
    engine.deps.clock.advance(days=31)  # type: ignore[attr-defined]
    engine.deps.settings.retention.enabled = True
    before = rows(engine)
    engine.run_until_idle()
    after = rows(engine)
    assert all(before[table] <= after[table] for table in before)  # nothing deleted
    with engine.deps.store.read() as conn:
        (failure,) = conn.execute(
            select(ledger.c.message).where(ledger.c.kind == "retention_export_failed")
        ).all()
    assert "not-a-dir" in failure.message and "nothing deleted" in failure.message


def test_retention_off_deletes_nothing(tmp_path):
    engine = make_engine(tmp_path, enabled=False)
    send(engine, alert(xid("node1", job="101")))
    engine.deps.clock.advance(days=400)  # type: ignore[attr-defined]
    before = rows(engine)
    engine.run_until_idle()
    assert rows(engine) == before


def test_inbox_rows_waiting_to_be_ingested_are_never_pruned(tmp_path):
    engine = make_engine(tmp_path)
    with engine.deps.store.transaction() as conn:
        waiting = records.enqueue_notification(conn, engine.deps.clock.now(), "nightshift", 1, "{}")
    engine.deps.clock.advance(days=400)  # type: ignore[attr-defined]
    engine.retention.work_once("test")
    with engine.deps.store.read() as conn:
        assert conn.execute(select(func.count()).where(inbox.c.id == waiting)).scalar_one() == 1


def test_a_set_aside_notification_is_pruned_with_the_new_alerts_it_carried(tmp_path):
    engine = make_engine(tmp_path)
    fingerprint, started = "00000000000000ab", engine.deps.clock.now()
    with engine.deps.store.transaction() as conn:
        failed = records.enqueue_notification(
            conn, started, "nightshift", 1, "{}", new_instances=[(fingerprint, started)]
        )
        records.fail_inbox(conn, failed, started, "RuntimeError: a bug")
    engine.deps.clock.advance(days=400)  # type: ignore[attr-defined]
    engine.retention.work_once("test")
    with engine.deps.store.read() as conn:
        assert conn.execute(select(func.count()).where(inbox.c.id == failed)).scalar_one() == 0
        assert records.known_instances(conn, [(fingerprint, started)]) == set()


def test_the_pruned_tables_are_the_metrics_label_values():
    tables = {
        t
        for group in prunable.GROUPS
        for t in (group, "incident_alerts", "inbox_alerts", "job_exclusions", "attempts", "steps", "ledger")
    }
    assert tables == set(PRUNED_TABLES)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("retention: {incidents_days: 29}\n", "settings.yaml:1: retention.incidents_days: 30..36500, got 29"),
        ("retention:\n  alerts_days: 0\n", "settings.yaml:2: retention.alerts_days: 1..36500, got 0"),
        ("retention: {batch_rows: 100000}\n", "retention.batch_rows: 1..10000"),
        ("retention: {interval_seconds: 5}\n", "retention.interval_seconds: 60..86400"),
        (
            "repair: {lemon_window_seconds: 5184000}\n",
            "settings.yaml:1: repair.lemon_window_seconds: reads back 401 days, more than retention.incidents_days",
        ),
        ("retention: {incidents_days: 30.5}\n", "retention.incidents_days: expected an integer"),
    ],
)
def test_retention_settings_are_range_checked_with_their_line(tmp_path, text, message):
    path = tmp_path / "settings.yaml"
    path.write_text(text.replace("5184000", str(401 * 86400)))
    with pytest.raises(ConfigError, match=None) as caught:
        load_settings(path, env={})
    assert message in str(caught.value)


def test_retention_never_shorter_than_a_playbook_window(tmp_path):
    text = (Path(__file__).parents[2] / "playbooks" / "gpu-xid.yaml").read_text()
    longer = text.replace("window: 24h", "window: 40d", 1)
    assert longer != text
    from app.actions import default_registry

    playbooks = PlaybookSet(parse_playbooks(longer, "gpu-xid.yaml", default_registry())).playbooks
    settings = Settings()
    check_windows(settings, playbooks)  # 400 days keep 40
    settings.retention.incidents_days = 30
    with pytest.raises(
        ConfigError, match=r"^gpu-xid.yaml:\d+: gpu-xid-node-fault-slurm: budget.window: reads back 40 days"
    ):
        check_windows(settings, playbooks)
    settings.retention.enabled = False
    check_windows(settings, playbooks)


def test_store_size_levels_off_under_a_steady_stream(tmp_path):
    """Two jobs fail a day for 14 days (bench/retention.py's stream, scaled: 3 days of incidents, 1 of alerts).
    Without retention the store grows every day; with it, its size after day 6 stays within 5% of day 6's."""
    plateau = 6
    kept = stream(tmp_path / "with", 14, 2, {"incidents_days": 3, "alerts_days": 1})
    grown = stream(tmp_path / "without", 14, 2, {"enabled": False})
    level = kept[plateau - 1]["bytes"]
    assert max(day["bytes"] for day in kept[plateau:]) <= level * 1.05
    assert grown[-1]["bytes"] > grown[plateau - 1]["bytes"] + level * 0.05  # the bound can fail
