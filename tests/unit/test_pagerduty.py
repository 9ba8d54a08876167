"""The paging channel: PagerDutyClient against a fake of the Events API v2 contract (tests/contracts.py), what
pages and what does not (app/domain/paging.py), and send_notification delivering a page beside the other channels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import responses

from app.actions.notify import send_notification
from app.clients import Clients
from app.clients.pagerduty import PagerDutyClient
from app.config import NotifySettings, Settings
from app.domain import errors
from app.domain.paging import MAX_DEDUP_KEY, Notice, Page, dedup_key, node_held, page_for, unmatched_alert
from app.domain.states import NoticeKind
from tests.contracts import PagerDutyEventsFake, pagerduty_contract

URL = "https://events.pagerduty.test/v2/enqueue"
KEY = "R0UT1NGKEY0123456789abcdefABCDEF"  # 32 characters, as PagerDuty's integration keys
assert len(KEY) == 32


def page(**overrides: object) -> Page:
    fields: dict = dict(
        dedup_key="nightshift/incident/7",
        summary="[nightshift] needs_human: gpu-xid on node1",
        source="node1",
        severity="critical",
        event_class="needs_human",
        component="GpuXidError",
        group="4242",
        custom_details={"incident": 7},
        links=(("http://nightshift.test/incidents/7", "Nightshift"),),
    )
    fields.update(overrides)
    return Page(**fields)


@pytest.fixture
def pagerduty() -> PagerDutyEventsFake:
    with pagerduty_contract(URL, (KEY,)) as fake:
        yield fake


def test_trigger_sends_the_documented_event_and_returns_its_dedup_key(pagerduty: PagerDutyEventsFake) -> None:
    client = PagerDutyClient(KEY, url=URL, client_url="http://nightshift.test")
    assert client.trigger(page()) == "nightshift/incident/7"
    (event,) = pagerduty.events
    assert event == {
        "routing_key": KEY,
        "event_action": "trigger",
        "dedup_key": "nightshift/incident/7",
        "payload": {
            "summary": "[nightshift] needs_human: gpu-xid on node1",
            "source": "node1",
            "severity": "critical",
            "class": "needs_human",
            "component": "GpuXidError",
            "group": "4242",
            "custom_details": {"incident": 7},
        },
        "client": "Nightshift",
        "client_url": "http://nightshift.test",
        "links": [{"href": "http://nightshift.test/incidents/7", "text": "Nightshift"}],
    }
    # The same dedup key again updates the one open alert.
    client.trigger(page(summary="again"))
    assert list(pagerduty.alerts) == ["nightshift/incident/7"] and len(pagerduty.events) == 2


def test_a_key_of_the_wrong_length_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(errors.ConfigError, match="32 characters, this one has 5"):
        PagerDutyClient("short", url=URL)


def test_an_unknown_routing_key_is_a_credential_error_that_does_not_leak_the_key(
    pagerduty: PagerDutyEventsFake,
) -> None:
    other = "X" * 32
    with pytest.raises(errors.CredentialRejected, match="Invalid routing key") as caught:
        PagerDutyClient(other, url=URL).trigger(page())
    assert other not in str(caught.value) and pagerduty.events == []


def test_an_event_the_api_calls_invalid_names_its_errors(pagerduty: PagerDutyEventsFake) -> None:
    client = PagerDutyClient(KEY, url=URL)
    # Bypass the client's own check to see the API's verdict on an empty source.
    with pytest.raises(
        errors.BackendError, match=r"HTTP 400: Event object is invalid: 'payload.source' is missing"
    ):
        client.trigger(page(source=""))
    with pytest.raises(errors.BackendError, match="severity 'page'"):
        client.trigger(page(severity="page"))
    with pytest.raises(errors.BackendError, match="summary empty"):
        client.trigger(page(summary="x" * 1025))
    assert pagerduty.events == []


def test_throttled_is_rate_limited_and_server_errors_are_backend_errors(
    pagerduty: PagerDutyEventsFake,
) -> None:
    client = PagerDutyClient(KEY, url=URL)
    pagerduty.rate_limit = 1
    client.trigger(page())
    with pytest.raises(errors.RateLimited):
        client.trigger(page())
    pagerduty.fail_with = 503
    with pytest.raises(errors.Unavailable):
        client.trigger(page())
    pagerduty.fail_with = 500
    with pytest.raises(errors.BackendError, match="HTTP 500"):
        client.trigger(page())


def test_an_answer_other_than_202_success_is_an_error() -> None:
    with responses.RequestsMock() as mock:
        mock.add(responses.POST, URL, status=200, json={"status": "success"})
        with pytest.raises(errors.BackendError, match="expected HTTP 202, got 200"):
            PagerDutyClient(KEY, url=URL).trigger(page())


def test_a_lost_answer_is_outcome_unknown() -> None:
    with responses.RequestsMock() as mock:
        mock.add(responses.POST, URL, body=requests.exceptions.ReadTimeout("read timed out"))
        with pytest.raises(errors.OutcomeUnknown):
            PagerDutyClient(KEY, url=URL).trigger(page())


OUTCOME, HELD, UNMATCHED = NoticeKind.OUTCOME, NoticeKind.NODE_HELD, NoticeKind.UNMATCHED_ALERT
HELD_NODE2 = {"node_held": "node2", "node": "node2", "scheduler": "slurm", "repair_id": 5}


# What each kind of notice pages as (severity, event class), or None.
PAGES = [
        (OUTCOME, {"incident": 3, "outcome": "needs_human", "labels": {"Hostname": "node1"}},
         ("critical", "needs_human")),
        (OUTCOME, {"incident": 3, "outcome": "failed"}, ("critical", "failed")),
        (OUTCOME, {"incident": 3, "outcome": "credential_error"}, ("critical", "credential_error")),
        (OUTCOME, {"incident": 3, "outcome": "unverified"}, ("error", "unverified")),
        (OUTCOME, {"incident": 3, "outcome": "advisory"}, ("warning", "advisory")),
        (OUTCOME, {"incident": 3, "outcome": "recovered"}, None),
        (OUTCOME, {"incident": 3, "outcome": "blocked"}, None),
        (OUTCOME, {"incident": 3, "outcome": "resolved"}, None),
        (OUTCOME, {"incident": 3}, None),
        (NoticeKind.BLAST_RADIUS, {"incident": 3, "guard": "blast_radius"}, ("critical", "blast_radius")),
        (NoticeKind.APPROVAL, {"incident": 3, "step": 11}, ("warning", "approval")),
        (HELD, HELD_NODE2, ("critical", "node_held")),
        (NoticeKind.NODE_NOT_TAKEN_OUT, {**HELD_NODE2, "node_not_taken_out": "node2"}, None),
        (UNMATCHED, {"unmatched": "GpuVanished", "fingerprint": "ab12", "labels": {"severity": "critical"}},
         ("critical", "unmatched_alert")),
        (UNMATCHED, {"unmatched": "X", "fingerprint": "cd34", "labels": {}}, ("warning", "unmatched_alert")),
        (NoticeKind.FLEET_INCIDENT, {"incident": 3, "fleet": "storage_io", "outcome": "needs_human"},
         ("critical", "needs_human")),
        (NoticeKind.FLEET_STORM, {"incident": 3, "guard": "fleet_storm", "outcome": "needs_human"},
         ("critical", "needs_human")),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "data", "expected"), PAGES)
def test_what_pages(kind: NoticeKind, data: dict, expected: tuple[str, str] | None) -> None:
    result = page_for(Notice(kind, "subject", "text", data))
    assert (None if result is None else (result.severity, result.event_class)) == expected


def test_the_table_covers_every_kind_of_notice() -> None:
    assert {kind for kind, _, _ in PAGES} == set(NoticeKind)


def test_dedup_keys_name_the_subject_and_stay_within_255_characters() -> None:
    advisory = Notice(OUTCOME, "s", "t", {"incident": 9, "outcome": "advisory"})
    assert page_for(advisory).dedup_key == "nightshift/incident/9"
    unmatched = Notice(UNMATCHED, "s", "t", {"unmatched": "A", "fingerprint": "f00"})
    assert page_for(unmatched).dedup_key == "nightshift/alert/f00"
    # A cause's fleet incidents share one: the second of a flapping file system updates the first's open alert.
    fleet = [
        page_for(
            Notice(NoticeKind.FLEET_INCIDENT, "s", "t", {"incident": i, "fleet": "storage_io", "outcome": o})
        )
        for i, o in ((3, "needs_human"), (8, "needs_human"))
    ]
    assert [p.dedup_key for p in fleet] == ["nightshift/fleet/storage_io"] * 2
    long = dedup_key("node/slurm/" + "n" * 400)
    assert len(long) == MAX_DEDUP_KEY and long != dedup_key("node/slurm/" + "n" * 401)


def test_held_node_and_unmatched_alert_notices() -> None:
    notice = node_held(
        node="node3",
        scheduler="slurm",
        reason="dcgmi diag -r 2 failed",
        repair_id=4,
        incident_id=None,
        external_url="http://ns.test/",
    )
    held = page_for(notice, "http://ns.test/")
    assert held.source == "node3" and held.dedup_key == "nightshift/node/slurm/node3/repair/4"
    assert held.links == (("http://ns.test/nodes", "Nightshift"),)
    assert "POST /api/v1/nodes/node3/release" in notice.text
    alert = unmatched_alert(
        alertname="DcgmExporterDown",
        fingerprint="0f0f",
        labels={"alertname": "DcgmExporterDown", "instance": "node4:9400", "severity": "warning"},
        annotations={"summary": "dcgm-exporter node4:9400 is down"},
    )
    assert alert.subject == "[nightshift] no playbook for DcgmExporterDown on node4:9400"
    unmatched = page_for(alert)
    assert (unmatched.severity, unmatched.component, unmatched.source) == (
        "warning",
        "DcgmExporterDown",
        "nightshift",
    )


def settings_with_pagerduty(tmp_path: Path, key: str = KEY) -> Settings:
    key_file = tmp_path / "pd.key"
    key_file.write_text(key + "\n")
    return Settings(
        external_url="http://nightshift.test",
        notify=NotifySettings(pagerduty_routing_key_file=str(key_file), pagerduty_url=URL),
    )


def test_send_notification_pages_only_what_needs_a_person(
    tmp_path: Path, pagerduty: PagerDutyEventsFake
) -> None:
    settings = settings_with_pagerduty(tmp_path)
    clients = Clients(settings)
    data = {
        "incident": 12,
        "outcome": "needs_human",
        "labels": {"Hostname": "node2", "alertname": "TrainingHang"},
    }
    (outcome,) = send_notification(
        clients, settings, Notice(OUTCOME, "[nightshift] needs_human: hang on node2", "details", data)
    )
    assert outcome.status == "ok" and outcome.data == {"channel": "pagerduty"}
    assert outcome.command == "POST <pagerduty events v2> trigger nightshift/incident/12 (critical)"
    assert KEY not in json.dumps([outcome.command, outcome.output])
    (event,) = pagerduty.events
    assert event["payload"]["source"] == "node2"
    assert event["links"] == [{"href": "http://nightshift.test/incidents/12", "text": "Nightshift"}]
    assert (
        send_notification(
            clients, settings, Notice(OUTCOME, "r", "", {"incident": 13, "outcome": "recovered"})
        )
        == []
    )
    assert len(pagerduty.events) == 1


def test_send_notification_reports_a_missing_key_file_as_that_channels_failure(tmp_path: Path) -> None:
    settings = settings_with_pagerduty(tmp_path)
    (tmp_path / "pd.key").unlink()
    (outcome,) = send_notification(
        Clients(settings), settings, Notice(OUTCOME, "s", "t", {"incident": 1, "outcome": "failed"})
    )
    assert outcome.status == "failed" and "cannot read secret file" in outcome.reason


# --- every channel clipped to its limit (issue 22 items 2 and 6) -----------------------------------------

# The review's case: 190 labels of 2,800 characters (a 534 KB notification, inside the webhook's bounds).
BIG_LABELS = {f"label_{i:03d}": chr(0x41 + i % 26) * 2800 for i in range(190)}
BIG_CASES = {
    "incident_needs_human": {
        "incident": 12,
        "outcome": "needs_human",
        "labels": {**BIG_LABELS, "Hostname": "n1"},
    },
    "node_held": {
        "node_held": "n1",
        "node": "n1",
        "scheduler": "slurm",
        "repair_id": 3,
        "incident": 4,
        "reason": "x" * 600_000,
    },
    "non_ascii_labels": {
        "incident": 13,
        "outcome": "failed",
        "labels": {f"l{i}": "\u202e山" * 1400 for i in range(190)},
    },
}


@pytest.mark.parametrize("data", BIG_CASES.values(), ids=BIG_CASES.keys())
def test_a_huge_notice_still_pages_within_512_kb(
    tmp_path: Path, pagerduty: PagerDutyEventsFake, data
) -> None:
    settings = settings_with_pagerduty(tmp_path)
    kind = NoticeKind.NODE_HELD if "node_held" in data else OUTCOME
    notice = Notice(kind, "[nightshift] big", "t" * 200_000, data)
    outcomes = send_notification(Clients(settings), settings, notice)
    assert [(o.status, o.data["channel"]) for o in outcomes] == [("ok", "pagerduty")], outcomes
    (event,) = pagerduty.events
    assert len(json.dumps(event).encode()) <= 512 * 1024


def test_an_unmatched_alert_with_huge_labels_makes_a_bounded_notice() -> None:
    notice = unmatched_alert(
        alertname="A" * 3000,
        fingerprint="f",
        labels=BIG_LABELS,
        annotations={"summary": "s" * 100_000, "description": "d" * 900_000},
    )
    assert len(notice.text) < 40_000 and len(notice.subject) <= 1024
    assert len(json.dumps(notice.data)) < 64 * 1024
