"""Hostile input through the real HTTP layer (Flask test client): hostile label values are data, recorded but
never passed to an action; malformed payloads get a 4xx with the one JSON error shape, never a 5xx; a client that
keeps failing authentication is slowed down without ever limiting an authenticated Alertmanager.

Every step of the playbook is whitelisted and the re-check answers, so anything that got through would be run:
the fake actions record each call.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from flask import Flask

from app.config import Settings
from app.web.auth import LIMITER_KEY, AuthFailureLimiter
from tests.fakes import fake_actions
from tests.payloads import HOSTILE, alert, body, ingest_inbox, payload, xid
from tests.webapps import build_app, headers, make_app, reader_client
from tests.worlds import PLAYBOOK

# Actions whose parameters name things (patterned); fake.notice is free text for humans, like a chat message.
NAMING_ACTIONS = ("fake.drain", "fake.requeue", "fake.resume", "fake.logs")


def refused_by_parser(value: str) -> bool:
    """NUL: no label source emits it and PostgreSQL cannot store it, so the payload parser refuses it (400)."""
    return "\x00" in value


def calls(app: Flask, action: str) -> list[dict[str, Any]]:
    return app.extensions["nightshift"].engine.deps.registry.get(action).script.calls


def ledger_kinds(app: Flask) -> list[str]:
    from app.store import records

    with app.extensions["nightshift"].store.transaction() as conn:
        return [row.kind for row in records.iter_ledger(conn)]


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


# --- the hostile review's findings (issue 14) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/incidents/99999999999999999999999", 404),
        ("/api/v1/incidents/9223372036854775808", 404),  # 2**63: past the BIGINT ids
        ("/api/v1/incidents/0", 404),
        ("/api/v1/incidents?before=9223372036854775808", 400),
        ("/api/v1/incidents?before=0", 400),
        ("/api/v1/incidents?limit=-9223372036854775809", 400),
        ("/api/v1/incidents?limit=-1", 400),  # no longer a way around the 1,000-row cap
        ("/api/v1/incidents?limit=0", 400),
        ("/api/v1/incidents?limit=1001", 400),
        ("/api/v1/incidents?limit=1e3", 400),
        ("/api/v1/incidents?limit=%EF%BC%91", 400),  # a full-width digit, which int() would take
        ("/api/v1/incidents?node=" + "n" * 256, 400),
        ("/incidents/99999999999999999999999", 404),
        ("/history?before=9223372036854775808", 400),
    ],
)
def test_out_of_range_numbers_are_a_4xx_never_a_500(app, path, status):
    response = reader_client(app).get(path)
    assert response.status_code == status, (path, response.get_data(as_text=True)[:200])
    if path.startswith("/api/"):
        assert_json_error(response, status)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/incidents/99999999999999999999999/handled",
        "/api/v1/incidents/1/steps/99999999999999999999999/approve",
        "/api/v1/nodes/x;rm -rf //release",  # a node name ending in a slash: no redirect to another path
        "/api/v1/nodes//hold",
        "/api/v1/fleet//release",
    ],
)
def test_out_of_range_ids_in_operator_routes_are_404(tmp_path, path):
    app = build_app(tmp_path)
    (tmp_path / "operator").write_text("operator-token")
    settings = app.extensions["nightshift"].settings
    settings.operator_token_file = str(tmp_path / "operator")
    app = make_app(settings)
    response = app.test_client().post(path, headers={"Authorization": "Bearer operator-token"})
    assert_json_error(response, 404)


def test_a_chunked_body_over_the_limit_is_413_not_invalid_json(tmp_path):
    app = build_app(tmp_path, max_body_bytes=10_000)
    data = body(alert({**xid(), "blob": "x" * 20_000}))
    response = app.test_client().post(
        "/api/v1/alerts",
        input_stream=io.BytesIO(data),
        headers={**headers(), "Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},  # what gunicorn sets for a chunked body
    )
    assert_json_error(response, 413)
    small = app.test_client().post(
        "/api/v1/alerts",
        input_stream=io.BytesIO(body(alert(xid()))),
        headers={**headers(), "Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert small.status_code == 200, small.json


def test_label_names_are_bounded_and_the_name_cache_keeps_none_of_the_long_ones(app):
    from app.domain import alertmanager

    client = reader_client(app)
    for n in range(100):
        long_name = f"n{n}_" + "x" * 200_000
        for field in ("labels", "annotations"):
            doc = alert(xid())
            doc[field] = {**doc[field], long_name: "v"} if field == "labels" else {long_name: "v"}
            response = client.post("/api/v1/alerts", data=body(doc), headers=headers())
            assert_json_error(response, 400)
            assert f"exceeds the limit of {alertmanager.MAX_LABEL_NAME}" in response.json["message"]
        if n == 2:
            break  # three rounds show the refusal; the cache check below is what bounds memory
    assert all(len(name) <= alertmanager.MAX_LABEL_NAME for name in alertmanager._VALID_LABEL_NAMES)
    assert len(alertmanager._VALID_LABEL_NAMES) <= alertmanager.MAX_REMEMBERED_LABEL_NAMES
    ok = alert({**xid(), "n" * alertmanager.MAX_LABEL_NAME: "v"})
    assert client.post("/api/v1/alerts", data=body(ok), headers=headers()).status_code == 200


def test_pause_reason_from_the_api_loses_bidirectional_overrides(tmp_path):
    app = build_app(tmp_path)
    (tmp_path / "operator").write_text("operator-token")
    settings = app.extensions["nightshift"].settings
    settings.operator_token_file = str(tmp_path / "operator")
    app = make_app(settings)
    reason = "maint\u202eenance \u2066window\u2069\u200b done"
    answer = app.test_client().post(
        "/api/v1/pause",
        json={"reason": reason},
        headers={"Authorization": "Bearer operator-token", "X-Nightshift-Operator": "al\u202eice"},
    )
    assert answer.status_code == 200
    pause = app.extensions["nightshift"].engine.status()["pause"]
    assert pause["reason"] == "maintenance window done" and pause["by"] == "alice"


def test_pages_forbid_framing_twice(app):
    page = reader_client(app).get("/")
    assert page.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]


def test_a_recheck_built_from_a_lone_surrogate_says_why_it_found_nothing():
    from datetime import UTC, datetime, timedelta

    from app.domain.alertmanager import parse_notification
    from app.domain.guards import recheck
    from app.domain.templates import render_promql

    doc = json.loads(body(alert({**xid(), "Hostname": "node1"})))
    raw = json.dumps(doc).replace('"node1"', '"node\\ud8001"')  # a lone surrogate, as JSON allows
    labels = parse_notification(raw).alerts[0].labels
    assert labels["Hostname"] == "node\ufffd1"  # replaced on receipt, as Alertmanager's Go decoder does
    expr = render_promql('up{Hostname="{{ labels.Hostname }}"}', {"labels": labels})
    verdict = recheck(expr, 0, None, datetime(2026, 1, 1, tzinfo=UTC), timedelta(seconds=30))
    assert verdict.decision == "stop" and "U+FFFD" in verdict.reason and "surrogate" in verdict.reason


def test_label_markup_is_escaped_for_slack_and_email(tmp_path):
    from email import message_from_bytes, policy

    from app.actions.notify import NotifyWebhook, send_notification
    from app.clients import Clients
    from app.clients.mail import Mailer
    from app.domain.paging import Notice
    from app.domain.planning import render_params
    from app.domain.states import NoticeKind

    hostile = "<!channel> <https://evil.example/approve|Approve here> & more"
    rendered = render_params(
        NotifyWebhook(), {"text": "GPU {{ labels.gpu }} on <https://grafana.example/d/x|the dashboard>"},
        {"labels": {"gpu": hostile}},
    )  # fmt: skip
    assert rendered["text"] == (
        "GPU &lt;!channel&gt; &lt;https://evil.example/approve|Approve here&gt; &amp; more "
        "on <https://grafana.example/d/x|the dashboard>"  # the author's own link stays a link
    )

    class RecordingHttp:
        def __init__(self) -> None:
            self.bodies: list[Any] = []

        def post_json(self, url: str, payload: Any) -> int:
            self.bodies.append(payload)
            return 200

    http = RecordingHttp()
    settings = Settings(data_dir=str(tmp_path))
    settings.notify.webhook_url = "http://chat.example/hook"
    send_notification(
        Clients(settings, http=http), settings, Notice(NoticeKind.OUTCOME, f"on {hostile}", "text", {})
    )
    assert "<!channel>" not in http.bodies[0]["text"] and "&lt;!channel&gt;" in http.bodies[0]["text"]

    subject = "failed on =?utf-8?b?QXBwcm92ZSBoZXJl?= node\u202e1\r\nBcc: x@evil.example"
    message = Mailer("localhost")._message(["oncall@example.com"], subject, "body")
    parsed = message_from_bytes(message.as_bytes(), policy=policy.default)
    assert "Approve here" not in parsed["Subject"] and "= ?utf-8?b?QXBwcm92ZSBoZXJl?=" in parsed["Subject"]
    assert "\u202e" not in parsed["Subject"] and parsed["Bcc"] is None


@pytest.mark.parametrize(
    ("action", "param", "value"),
    [
        ("slurm.drain_node", "node", "ALL"),
        ("slurm.drain_node", "node", "all"),
        ("slurm.resume_node", "node", "All"),
        ("slurm.drain_node", "node", "node[1-4]"),
        ("slurm.drain_node", "node", "node1,node2"),
        ("kubernetes.cordon_node", "node", "NODE1"),
        ("kubernetes.cordon_node", "node", "x..y"),
        ("kubernetes.cordon_node", "node", "4242_7"),
        ("kubernetes.cordon_node", "node", "-node"),
        ("kubernetes.cordon_node", "node", "a" * 64),  # one DNS label is at most 63
    ],
)
def test_values_a_backend_reads_as_something_else_are_refused(action, param, value):
    from app.actions import default_registry
    from app.domain.errors import ParamError

    registry = default_registry()
    spec = registry.get(action)
    good = {"node": "node-1.example", "reason": "test"} if "drain" in action else {"node": "node-1.example"}
    spec.validate(good)  # the same action takes a sound name
    with pytest.raises(ParamError, match=param):
        spec.validate({**good, param: value})


@pytest.mark.parametrize("op", ["=~", "!~"])
def test_templates_inside_regex_matchers_fail_lint(op):
    from app.actions.registry import ActionRegistry
    from app.domain.playbooks import PlaybookError, parse_playbooks

    registry = ActionRegistry(fake_actions().values())
    text = PLAYBOOK.replace(
        'recheck: \'DCGM_EXP_XID_ERRORS_COUNT{Hostname="{{ labels.Hostname }}",xid="{{ labels.xid }}"} > 0\'',
        f"recheck: 'ALERTS{{Hostname{op}\"{{{{ labels.Hostname }}}}\"}}'",
    )
    assert text != PLAYBOOK
    with pytest.raises(PlaybookError, match="regular expression"):
        parse_playbooks(text, "regex.yaml", registry)
    literal = text.replace(
        f'{op}"{{{{ labels.Hostname }}}}"', f'{op}"node.*"'
    )  # written out: the author's regex
    assert literal != text and parse_playbooks(literal, "regex.yaml", registry)


# The operator's name as a browser or curl sends it: UTF-8 bytes, which WSGI hands over decoded as Latin-1
# (PEP 3333). Expected: the text as typed, controls (bidi overrides, zero width, escapes, line breaks) stripped.
OPERATOR_NAMES = {
    "accent": ("Zoë", "Zoë"),
    "spanish": ("José García", "José García"),
    "cjk": ("山田太郎", "山田太郎"),
    "rtl_override": ("ali\u202ece", "alice"),
    "isolates": ("\u2066bob\u2069", "bob"),
    "zero_width": ("ca\u200brol", "carol"),
    "escape": ("dave\x1b[31m", "dave[31m"),
    "tab_del": ("eve\tad\x7fmin", "eveadmin"),  # (a line break cannot be in a header: HTTP parsers refuse it)
    "ascii": ("frank", "frank"),
}
AS_WSGI_GIVES_THEM = {
    key: (typed.encode().decode("latin-1"), kept) for key, (typed, kept) in OPERATOR_NAMES.items()
}
AS_WSGI_GIVES_THEM["bad_utf8"] = (
    b"gr\xffeg".decode("latin-1"),
    "gr\ufffdeg",
)  # not UTF-8: replaced, not lost


@pytest.mark.parametrize(("wsgi", "kept"), AS_WSGI_GIVES_THEM.values(), ids=AS_WSGI_GIVES_THEM.keys())
def test_the_operator_name_header_is_decoded_as_utf8_and_loses_controls(tmp_path, wsgi, kept):
    app = build_app(tmp_path)
    (tmp_path / "operator").write_text("operator-token")
    settings = app.extensions["nightshift"].settings
    settings.operator_token_file = str(tmp_path / "operator")
    app = make_app(settings)
    answer = app.test_client().post(
        "/api/v1/pause",
        json={"reason": "x"},
        headers={"Authorization": "Bearer operator-token", "X-Nightshift-Operator": wsgi},
    )
    assert answer.status_code == 200, answer.json
    assert app.extensions["nightshift"].engine.status()["pause"]["by"] == kept


# A Slurm job identity or node name that Slurm reads as something else, or not as one job/node: refused at
# ingestion (target_invalid, no incident), never an engine_error in the job-status read (issue 22 item 4).
SLURM_TARGETS = {
    "job_all_lower": ("slurm_job_id", "all"),
    "job_all_upper": ("slurm_job_id", "ALL"),
    "job_all_mixed": ("slurm_job_id", "All"),
    "job_a_name": ("slurm_job_id", "train-llama"),
    "job_hex": ("slurm_job_id", "0x10"),
    "job_step": ("slurm_job_id", "1234.0"),
    "node_all_lower": ("Hostname", "all"),
    "node_all_upper": ("Hostname", "ALL"),
}


@pytest.mark.parametrize(("label", "value"), SLURM_TARGETS.values(), ids=SLURM_TARGETS.keys())
def test_a_slurm_target_slurm_would_misread_is_refused_at_ingestion(app, label, value):
    response = reader_client(app).post(
        "/api/v1/alerts", data=body(alert({**xid(), label: value})), headers=headers()
    )
    assert response.status_code == 200, response.json
    assert ingest_inbox(app).opened == []
    app.extensions["nightshift"].engine.run_until_idle()
    kinds = ledger_kinds(app)
    assert "target_invalid" in kinds and "engine_error" not in kinds
    for action in (*NAMING_ACTIONS, "fake.notice"):
        assert calls(app, action) == [], action
