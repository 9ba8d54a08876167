"""A person's way in to fleet incidents: listed by the API, the Fleet page and `nightshift fleet`; released with the
operator token (API), a logged-in operator's form with its CSRF token (UI) or the CLI, each ledgered with a name."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from app.domain import fleet
from app.engine.fleet_hold import MAX_HISTORY, archive_record, read_record, write_record
from app.store import Store, records
from tests.fixtures.procs import nightshift_cli as nightshift
from tests.webapps import OPERATOR, VIEWER, make_app, webhook_settings

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def open_fleet_incident(store, key: str = "storage_io") -> None:
    now = store.clock.now()
    record = fleet.FleetRecord(
        key, "storage", "3 jobs failed with storage_io within 300s", now - timedelta(minutes=2)
    )
    with store.transaction() as conn:
        write_record(conn, record, now)


def released_rows(store) -> list[dict]:
    with store.read() as conn:
        return [r.as_dict() for r in records.iter_ledger(conn) if r.kind == "fleet_cleared"]


def test_the_api_lists_fleet_incidents_and_an_operator_releases_one(tmp_path):
    app = make_app(webhook_settings(tmp_path))
    store = app.extensions["nightshift"].store
    open_fleet_incident(store)
    client = app.test_client()
    viewer = {"Authorization": f"Bearer {VIEWER}"}
    operator = {"Authorization": f"Bearer {OPERATOR}", "X-Nightshift-Operator": "alice"}
    assert client.get("/api/v1/fleet").status_code == 401  # reads need a reader
    (listed,) = client.get("/api/v1/fleet", headers=viewer).json["fleet"]
    assert (listed["key"], listed["held"], listed["cleared_at"]) == ("storage_io", True, None)
    assert client.post("/api/v1/fleet/storage_io/release", headers=viewer).status_code == 403  # reads only
    assert client.post("/api/v1/fleet/switch:leaf9/release", headers=operator).status_code == 404
    bad = client.post("/api/v1/fleet/x;rm%20-rf/release", headers=operator)
    assert bad.status_code == 400 and bad.json["status"] == "error"
    released = client.post("/api/v1/fleet/storage_io/release", headers=operator, json={"reason": "NFS back"})
    assert released.status_code == 200 and released.json["fleet"]["cleared_by"] == "operator alice"
    assert client.post("/api/v1/fleet/storage_io/release", headers=operator).status_code == 409
    (row,) = released_rows(store)
    assert "released by alice: NFS back" in row["message"]


def test_the_fleet_page_shows_the_incident_and_its_release_form_needs_the_csrf_token(tmp_path):
    app = make_app(webhook_settings(tmp_path))
    store = app.extensions["nightshift"].store
    open_fleet_incident(store)
    reader = app.test_client()
    page = reader.get("/fleet", headers={"Authorization": f"Bearer {VIEWER}"})
    assert page.status_code == 200 and 'data-key="storage_io"' in page.text
    assert "release-form" not in page.text  # a reader sees no form
    ui = app.test_client()
    form = CSRF.search(ui.get("/login").text).group(1)  # type: ignore[union-attr]
    login = {"operator": "bob", "token": OPERATOR, "csrf_token": form}
    assert ui.post("/login", data=login).status_code == 303
    page = ui.get("/fleet").text
    assert 'action="/fleet/storage_io/release"' in page
    csrf = CSRF.search(page).group(1)  # type: ignore[union-attr]
    assert ui.post("/fleet/storage_io/release", data={"csrf_token": "forged"}).status_code == 403
    assert released_rows(store) == []
    assert ui.post("/fleet/storage_io/release", data={"note": "back", "csrf_token": csrf}).status_code == 303
    with store.read() as conn:
        assert read_record(conn, "storage_io").cleared_by == "operator bob"  # type: ignore[union-attr]


def test_the_cli_lists_and_releases_a_fleet_incident(tmp_path):
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"data_dir: {tmp_path}\nwebhook: {{auth_disabled: true}}\n")
    store = Store.from_url(f"sqlite:///{tmp_path}/nightshift.db")
    store.create_schema()
    open_fleet_incident(store, "switch:leaf3")
    listed = nightshift("fleet", "-c", str(settings))
    assert listed.returncode == 0, listed.stderr
    assert [f["key"] for f in json.loads(listed.stdout)] == ["switch:leaf3"]
    released = nightshift(
        "fleet", "-c", str(settings), "release", "switch:leaf3", "--by", "erin", "--note", "ok"
    )
    assert released.returncode == 0, released.stderr
    assert "released by erin" in released.stdout
    again = nightshift("fleet", "-c", str(settings), "release", "switch:leaf3", "--by", "erin")
    assert again.returncode == 1 and "already cleared" in again.stderr
    (row,) = released_rows(store)
    assert "released by erin: ok" in row["message"]


def test_a_cause_s_earlier_fleet_incidents_are_listed_beside_its_current_one_which_alone_can_be_released(
    tmp_path,
):
    app = make_app(webhook_settings(tmp_path))
    store = app.extensions["nightshift"].store
    now = store.clock.now()
    earlier = fleet.FleetRecord(
        "storage_io", "storage", "NFS down", now - timedelta(hours=2), incidents=[1, 2]
    )
    earlier.cleared_at, earlier.cleared_by = now - timedelta(hours=1), "query"
    with store.transaction() as conn:
        archive_record(conn, earlier, now)
        write_record(conn, fleet.FleetRecord("storage_io", "storage", "NFS down again", now, number=2), now)
    listed = (
        app.test_client().get("/api/v1/fleet", headers={"Authorization": f"Bearer {VIEWER}"}).json["fleet"]
    )
    assert [(f["number"], f["current"], f["summary"]) for f in listed] == [
        (2, True, "NFS down again"),
        (1, False, "NFS down"),
    ]
    ui = app.test_client()
    form = CSRF.search(ui.get("/login").text).group(1)  # type: ignore[union-attr]
    assert (
        ui.post("/login", data={"operator": "bob", "token": OPERATOR, "csrf_token": form}).status_code == 303
    )
    page = ui.get("/fleet").text
    assert 'data-number="1"' in page and 'data-number="2"' in page
    assert page.count('action="/fleet/storage_io/release"') == 1


def test_a_cause_keeps_its_last_twenty_earlier_fleet_incidents(tmp_path):
    app = make_app(webhook_settings(tmp_path))
    store = app.extensions["nightshift"].store
    now = store.clock.now()
    with store.transaction() as conn:
        for number in range(1, MAX_HISTORY + 6):
            archive_record(conn, fleet.FleetRecord("storage_io", "storage", "NFS", now, number=number), now)
    listing = app.extensions["nightshift"].engine.fleet.fleet_incidents
    assert sorted(f["number"] for f in listing(limit=100)) == list(range(6, MAX_HISTORY + 6))
    assert len(listing(limit=3)) == 3  # the listing is bounded too
