"""The HTTP contract through Flask's test client: auth, limits, precise 400s, 503 on store outage, API, health."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from app.config import Settings
from app.domain.errors import ConfigError
from tests.payloads import alert, body, ingest_inbox, payload, xid
from tests.webapps import OPERATOR, TOKEN, auth, make_app, reader_client, webhook_settings, write


@pytest.fixture
def settings(tmp_path) -> Settings:
    return webhook_settings(tmp_path)


@pytest.fixture
def client(settings):
    return reader_client(make_app(settings))


def test_webhook_queues_the_notification_and_the_worker_opens_an_incident(client):
    response = client.post("/api/v1/alerts", data=body(alert(xid())), headers=auth())
    assert response.status_code == 200, response.json
    assert response.json == {"status": "ok", "alerts": 1, "inbox_id": 1}
    assert client.get("/api/v1/incidents").json["incidents"] == []  # not yet: the worker ingests it
    assert client.get("/api/v1/status").json["inbox"]["pending"] == 1
    assert len(ingest_inbox(client.application).opened) == 1
    assert client.get("/api/v1/status").json["inbox"]["pending"] == 0
    listed = client.get("/api/v1/incidents").json["incidents"]
    # One job incident (app/domain/episodes.py): it names the job; the node is its alerts' (Hostname), not the
    # incident's.
    assert [(i["playbook"], i["node"], i["job"]) for i in listed] == [("gpu-xid-79", None, "1234")]
    detail = client.get(f"/api/v1/incidents/{listed[0]['id']}").json
    assert detail["alerts"][0]["labels"]["xid"] == "79"
    assert [row["kind"] for row in detail["ledger"]] == ["incident_opened"]


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer wrong",
        "Bearer " + TOKEN + "x",
        "Basic !!!",
        "Token " + TOKEN,
        "Basic " + base64.b64encode(b"alertmanager:wrong").decode(),
    ],
)
def test_webhook_rejects_missing_or_wrong_credentials(client, header):
    headers = {"Content-Type": "application/json"} | ({"Authorization": header} if header else {})
    response = client.post("/api/v1/alerts", data=body(alert(xid())), headers=headers)
    assert response.status_code == 401
    assert response.json["status"] == "error" and "credentials" in response.json["message"]
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/api/v1/incidents").json["incidents"] == []


def test_webhook_accepts_basic_auth(client):
    basic = base64.b64encode(b"alertmanager:basic-pass").decode()
    response = client.post(
        "/api/v1/alerts",
        data=body(alert(xid())),
        headers={"Authorization": f"Basic {basic}", "Content-Type": "application/json"},
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "invalid JSON"),
        (
            json.dumps(
                {
                    "version": "4",
                    "status": "firing",
                    "receiver": "x",
                    "alerts": [
                        {
                            "status": "firing",
                            "labels": {"alertname": "X", "gpu": 3},
                            "startsAt": "2026-12-02T03:00:00Z",
                        }
                    ],
                }
            ),
            "alerts[0].labels.gpu",
        ),
        (json.dumps([1, 2]), "object"),
    ],
)
def test_webhook_bad_payload_is_400_with_a_precise_message(client, data, message):
    response = client.post("/api/v1/alerts", data=data, headers=auth())
    assert response.status_code == 400
    assert response.json["status"] == "error" and message in response.json["message"]


def test_webhook_oversized_body_is_413(client):
    huge = body(alert({**xid(), "blob": "x" * 100_000}))
    response = client.post("/api/v1/alerts", data=huge, headers=auth())
    assert response.status_code == 413 and response.json["status"] == "error"


def test_webhook_answers_503_when_the_store_is_down(settings):
    app = make_app(settings)
    store = app.extensions["nightshift"].store
    store.engine = create_engine(
        "postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 1}
    )
    client = app.test_client()
    response = client.post("/api/v1/alerts", data=body(alert(xid())), headers=auth())
    assert response.status_code == 503 and "store" in response.json["message"]
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").status_code == 200


def test_webhook_answers_503_with_retry_after_past_the_inbox_backlog_and_takes_new_alerts(settings):
    settings.webhook.max_inbox_alerts = 2
    client = make_app(settings).test_client()
    group = body(*(alert(xid(node=f"node{i}", job=str(i))) for i in range(2)))
    assert client.post("/api/v1/alerts", data=group, headers=auth()).status_code == 200
    refused = client.post("/api/v1/alerts", data=group, headers=auth())  # a repeat, while the first waits
    assert refused.status_code == 503 and refused.headers["Retry-After"].isdigit()
    assert "webhook.max_inbox_alerts" in refused.json["message"]
    fresh = client.post("/api/v1/alerts", data=body(alert(xid(node="node7", job="7"))), headers=auth())
    assert fresh.status_code == 200  # a new alert is taken past the bound (up to twice it)
    metrics = client.get("/metrics").text
    assert 'nightshift_webhook_requests_total{code="503"} 1.0' in metrics


def test_app_refuses_to_start_without_webhook_auth(settings):
    settings.webhook.token_file = None
    settings.webhook.basic_user = settings.webhook.basic_password_file = None
    with pytest.raises(ConfigError, match="no authentication configured"):
        make_app(settings)
    settings.webhook.auth_disabled = True
    app = make_app(settings)
    response = app.test_client().post(
        "/api/v1/alerts", data=body(alert(xid())), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200


def test_operator_endpoints_need_the_operator_token(client):
    viewer = client.post("/api/v1/pause", json={"reason": "x"})  # the client reads with the viewer token
    assert viewer.status_code == 403 and viewer.json == {
        "status": "error",
        "message": "the viewer token may read but not act: this endpoint needs the operator token",
    }
    assert (
        client.post("/api/v1/pause", json={"reason": "x"}, headers={"Authorization": ""}).status_code == 401
    )
    assert client.post("/api/v1/pause", json={"reason": "x"}, headers=auth(TOKEN)).status_code == 401
    response = client.post("/api/v1/pause", json={"reason": "GPU firmware rollout"}, headers=auth(OPERATOR))
    assert response.status_code == 200 and response.json["paused"] is True
    status = client.get("/api/v1/status").json
    assert status["paused"] is True and status["pause"]["reason"] == "GPU firmware rollout"
    assert client.post("/api/v1/resume", headers=auth(OPERATOR)).json["paused"] is False
    assert client.get("/api/v1/status").json["paused"] is False


def test_operator_api_is_disabled_without_a_token(settings):
    settings.operator_token_file = None
    client = make_app(settings).test_client()
    response = client.post("/api/v1/pause", headers=auth(OPERATOR))
    assert response.status_code == 403 and "operator API disabled" in response.json["message"]


def test_health_and_metrics(client):
    client.post("/api/v1/alerts", data=body(alert(xid())), headers=auth())
    assert "nightshift_inbox_pending 1.0" in client.get("/metrics").get_data(as_text=True)
    ingest_inbox(client.application)
    assert client.get("/healthz").json == {"status": "ok"}
    ready = client.get("/readyz").json
    assert ready["store"] == "ok" and ready["playbooks"] == 1
    text = client.get("/metrics").get_data(as_text=True)
    assert 'nightshift_alerts_received_total{status="firing"} 1.0' in text
    assert 'nightshift_incidents_opened_total{playbook="gpu-xid-79"} 1.0' in text
    assert 'nightshift_webhook_requests_total{code="200"} 1.0' in text
    assert 'nightshift_incidents_total{outcome="recovered"} 0.0' in text  # present before the first one
    assert (
        "nightshift_inbox_pending 0.0" in text and "nightshift_inbox_oldest_pending_age_seconds 0.0" in text
    )


def test_alerts_alertmanager_left_out_are_counted_and_the_rest_taken(client, caplog):
    """A group past Alertmanager's max_alerts arrives cut, with truncatedAlerts counting the rest: the alerts that
    came are taken, the missing ones counted (NightshiftAlertsTruncated fires on it) and logged with the group."""
    cut = payload(alert(xid()), alert(xid(node="node2")))
    cut["truncatedAlerts"] = 498
    response = client.post("/api/v1/alerts", data=json.dumps(cut), headers=auth())
    assert response.status_code == 200 and response.json["alerts"] == 2
    text = client.get("/metrics").get_data(as_text=True)
    assert "nightshift_alerts_truncated_total 498.0" in text
    assert any(
        "left 498 alert(s)" in r.getMessage() and cut["groupKey"] in r.getMessage() for r in caplog.records
    )


def test_unknown_incident_is_a_json_404(client):
    response = client.get("/api/v1/incidents/999")
    assert response.status_code == 404 and response.json == {
        "status": "error",
        "message": "incident 999 not found",
    }
    assert client.get("/nowhere").json["status"] == "error"


def test_operator_handles_an_incident_over_the_api(client):
    client.post("/api/v1/alerts", data=body(alert(xid())), headers=auth())
    (incident_id,) = ingest_inbox(client.application).opened
    url = f"/api/v1/incidents/{incident_id}/handled"
    assert client.post(url, json={"reason": "mine"}).status_code == 403  # the viewer token
    response = client.post(
        url, json={"reason": "mine"}, headers=auth(OPERATOR) | {"X-Nightshift-Operator": "carol"}
    )
    assert response.status_code == 200 and response.json["incident"]["outcome"] == "handled"
    assert response.json["incident"]["reason"] == "handled by carol: mine"
    assert client.post(url, headers=auth(OPERATOR)).status_code == 409
    assert client.post("/api/v1/incidents/999/handled", headers=auth(OPERATOR)).status_code == 404
    bad_step = client.post(f"/api/v1/incidents/{incident_id}/steps/1/approve", headers=auth(OPERATOR))
    assert bad_step.status_code == 404


def test_operator_token_guessing_is_throttled_per_address(settings):
    settings.webhook.auth_failure_burst = 2
    client = make_app(settings).test_client()
    for _ in range(2):
        assert client.post("/api/v1/pause", headers=auth("guess")).status_code == 401
    throttled = client.post("/api/v1/pause", headers=auth("guess"))
    assert throttled.status_code == 429 and int(throttled.headers["Retry-After"]) >= 1
    # Valid credentials are checked first and never refused, and operator guessing is not counted against the
    # webhook of the same address.
    assert client.post("/api/v1/pause", headers=auth(OPERATOR)).status_code == 200
    assert client.post("/api/v1/alerts", data=body(alert(xid())), headers=auth()).status_code == 200


# --- secrets refused at start (issue 22 item 10) ----------------------------------------------------------


def test_the_same_file_for_the_webhook_and_the_operator_token_is_refused_at_start(settings, tmp_path):
    settings.operator_token_file = settings.webhook.token_file
    with pytest.raises(ConfigError, match="must differ"):
        make_app(settings)


def test_the_same_value_in_two_files_is_refused_at_start(settings, tmp_path):
    settings.operator_token_file = write(tmp_path / "operator-copy", TOKEN)
    with pytest.raises(ConfigError, match="must differ"):
        make_app(settings)
    settings.operator_token_file = write(tmp_path / "operator-as-password", "basic-pass")
    with pytest.raises(ConfigError, match="must differ"):
        make_app(settings)


def test_a_symlink_to_the_webhook_token_is_the_same_file(settings, tmp_path):
    (tmp_path / "operator-link").symlink_to(settings.webhook.token_file)
    settings.operator_token_file = str(tmp_path / "operator-link")
    with pytest.raises(ConfigError, match="must differ"):
        make_app(settings)


def test_the_shipped_example_token_is_refused_unless_allowed_explicitly(settings):
    shipped = Path(__file__).parents[2] / "examples" / "webhook.token"
    settings.webhook.token_file = str(shipped)
    with pytest.raises(ConfigError, match="example token"):
        make_app(settings)
    settings.webhook.allow_example_token = True  # the demo's explicit setting
    assert make_app(settings).test_client().get("/healthz").status_code == 200


def test_the_example_token_is_refused_as_the_operator_token_too(settings, tmp_path):
    settings.operator_token_file = write(tmp_path / "op", "example-webhook-token-change-me\n")
    with pytest.raises(ConfigError, match="example token"):
        make_app(settings)


def test_an_unknown_state_or_outcome_filter_is_a_400_naming_the_known_ones(client):
    bogus = client.get("/api/v1/incidents?state=bogus")
    assert bogus.status_code == 400 and "known: " in bogus.get_json()["message"]
    assert "advisory" in client.get("/api/v1/incidents?outcome=nope").get_json()["message"]
    assert client.get("/api/v1/incidents?state=advisory").status_code == 200
