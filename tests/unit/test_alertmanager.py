"""The v4 webhook payload model: real bodies from Alertmanager, and every way a body can be wrong."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from app.domain import alertmanager
from app.domain.alertmanager import (
    MAX_LABEL_VALUE,
    MAX_LABELS,
    Alert,
    am_fingerprint,
    parse_notification,
    parse_time,
)
from app.domain.errors import PayloadError

# Captured from Debian's Alertmanager 0.25.0 (reference/tech.md §1.6), receiver "gpu.remediator".
LIVE_FIRING = (
    '{"receiver":"gpu\\\\.remediator","status":"firing","alerts":[{"status":"firing","labels":'
    '{"Hostname":"node1","alertname":"GpuXidFatal","err_code":"79","gpu":"3","severity":"critical"},'
    '"annotations":{"summary":"Xid 79 on node1 GPU 3"},"startsAt":"2026-12-02T11:16:43.352266466Z",'
    '"endsAt":"0001-01-01T00:00:00Z","generatorURL":"http://prom:9090/graph?g0.expr=x",'
    '"fingerprint":"eeeaf1a3f41856c3"}],"groupLabels":{"Hostname":"node1","alertname":"GpuXidFatal"},'
    '"commonLabels":{"Hostname":"node1","alertname":"GpuXidFatal","err_code":"79","gpu":"3",'
    '"severity":"critical"},"commonAnnotations":{"summary":"Xid 79 on node1 GPU 3"},'
    '"externalURL":"http://vm:18093","version":"4",'
    '"groupKey":"{}:{Hostname=\\"node1\\", alertname=\\"GpuXidFatal\\"}","truncatedAlerts":0}\n'
)
LIVE_LABELS = {
    "Hostname": "node1",
    "alertname": "GpuXidFatal",
    "err_code": "79",
    "gpu": "3",
    "severity": "critical",
}


def alert(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "status": "firing",
        "labels": {"alertname": "GpuXidError", "Hostname": "node1", "xid": "79"},
        "annotations": {"summary": "Xid 79"},
        "startsAt": "2026-01-02T03:04:05.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": "",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


def body(*alerts: dict[str, Any], **fields: Any) -> str:
    doc: dict[str, Any] = {
        "receiver": "nightshift",
        "status": "firing",
        "alerts": list(alerts) or [alert()],
        "groupLabels": {"alertname": "GpuXidError"},
        "commonLabels": {"alertname": "GpuXidError"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": '{}:{alertname="GpuXidError"}',
        "truncatedAlerts": 0,
    }
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not ...})


def error_of(payload: str | bytes, **kwargs: Any) -> str:
    with pytest.raises(PayloadError) as info:
        parse_notification(payload, **kwargs)
    return str(info.value)


# --- real payloads --------------------------------------------------------------------------------


def test_live_alertmanager_payload():
    note = parse_notification(LIVE_FIRING.encode())
    assert note.receiver == "gpu\\.remediator"  # regexp.QuoteMeta'd by Alertmanager, kept as sent
    assert note.status == "firing"
    assert note.version == "4"
    assert note.group_key == '{}:{Hostname="node1", alertname="GpuXidFatal"}'
    assert note.external_url == "http://vm:18093"
    assert note.truncated_alerts == 0
    assert note.group_labels == {"Hostname": "node1", "alertname": "GpuXidFatal"}
    assert note.common_labels == LIVE_LABELS
    assert note.common_annotations == {"summary": "Xid 79 on node1 GPU 3"}
    (only,) = note.alerts
    assert only == Alert(
        status="firing",
        labels=LIVE_LABELS,
        annotations={"summary": "Xid 79 on node1 GPU 3"},
        starts_at=datetime(2026, 12, 2, 11, 16, 43, 352266, tzinfo=UTC),  # 9 digits truncated to µs
        ends_at=None,  # Go's zero time while firing
        generator_url="http://prom:9090/graph?g0.expr=x",
        fingerprint="eeeaf1a3f41856c3",
    )


def test_live_resolved_payload():
    resolved = (
        LIVE_FIRING.replace('"status":"firing"', '"status":"resolved"')
        .replace('"endsAt":"0001-01-01T00:00:00Z"', '"endsAt":"2026-12-02T11:17:19Z"')
        .replace(',"fingerprint":"eeeaf1a3f41856c3"', "")
    )
    note = parse_notification(resolved)
    assert note.status == "resolved"
    (only,) = note.alerts
    assert only.status == "resolved"
    assert only.ends_at == datetime(2026, 12, 2, 11, 17, 19, tzinfo=UTC)
    assert only.fingerprint == "eeeaf1a3f41856c3"  # computed: same label set, same fingerprint


def test_am_fingerprint_recipe():
    # reference/tech.md §1.6: reproduced against Alertmanager 0.25.0.
    assert am_fingerprint(LIVE_LABELS) == "eeeaf1a3f41856c3"
    assert am_fingerprint({}) == "cbf29ce484222325"  # FNV-1a offset basis: the empty label set
    assert am_fingerprint(dict(reversed(LIVE_LABELS.items()))) == "eeeaf1a3f41856c3"  # order-independent
    assert am_fingerprint({"a": "bc"}) != am_fingerprint({"ab": "c"})  # the 0xff separators matter


def test_unknown_keys_are_ignored():
    extra = json.loads(body(alert(values={"B": 1.5}, valueString="[ var='B' value=1.5 ]", silenceURL="x")))
    extra.update(notification_reason="new_alerts", routeLabels={"team": "ml"}, orgId=1, title="[FIRING:1]")
    note = parse_notification(json.dumps(extra))
    assert note.alerts[0].labels["alertname"] == "GpuXidError"


def test_optional_fields_default():
    minimal = json.dumps(
        {
            "version": "4",
            "alerts": [
                {"status": "resolved", "labels": {"alertname": "A"}, "startsAt": "2026-01-01T00:00:00Z"}
            ],
        }
    )
    note = parse_notification(minimal)
    assert (note.receiver, note.status, note.external_url, note.group_key, note.truncated_alerts) == (
        "",
        "resolved",  # derived: no alert fires
        "",
        "",
        0,
    )
    assert note.group_labels == note.common_labels == note.common_annotations == {}
    (only,) = note.alerts
    assert (only.annotations, only.ends_at, only.generator_url) == ({}, None, "")
    assert only.fingerprint == am_fingerprint({"alertname": "A"})


def test_derived_status_is_firing_when_any_alert_fires():
    note = parse_notification(body(alert(status="resolved"), alert(status="firing"), status=...))
    assert note.status == "firing"


def test_null_optional_maps_and_times():
    note = parse_notification(
        body(alert(annotations=None, endsAt=None, generatorURL=None), commonAnnotations=None)
    )
    assert note.common_annotations == {}
    assert note.alerts[0].annotations == {}
    assert note.alerts[0].ends_at is None


def test_fingerprint_kept_normalised_or_computed():
    assert (
        parse_notification(body(alert(fingerprint="ABCDEF0123456789"))).alerts[0].fingerprint
        == "abcdef0123456789"
    )
    computed = parse_notification(body(alert(fingerprint=...))).alerts[0]
    assert computed.fingerprint == am_fingerprint(computed.labels)


def test_values_are_frozen():
    note = parse_notification(LIVE_FIRING)
    with pytest.raises(dataclasses.FrozenInstanceError):
        note.status = "resolved"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        note.alerts[0].fingerprint = "0" * 16  # type: ignore[misc]
    assert isinstance(note.alerts, tuple)


def test_lone_surrogates_become_replacement_characters():
    # Python's json keeps "\ud800"; Go's decoder substitutes U+FFFD, and the string must stay encodable.
    raw = body(alert(labels={"alertname": "A", "gpu": "x\\ud800"}, annotations={"k\\udfff": "v"})).replace(
        "\\\\", "\\"
    )
    only = parse_notification(raw).alerts[0]
    assert only.labels["gpu"] == "x\ufffd"
    assert only.annotations == {"k\ufffd": "v"}
    assert only.fingerprint == am_fingerprint({"alertname": "A", "gpu": "x\ufffd"})


# --- RFC 3339 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023-02-06T13:08:45.828Z", datetime(2023, 2, 6, 13, 8, 45, 828000, tzinfo=UTC)),
        ("2018-08-03T09:52:26.739266876+02:00", datetime(2018, 8, 3, 7, 52, 26, 739266, tzinfo=UTC)),
        ("2026-01-01T00:30:00-05:30", datetime(2026, 1, 1, 6, 0, 0, tzinfo=UTC)),
        ("2026-01-01t00:00:00z", datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01T00:00:00.1234567891234Z", datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)),
        ("2026-01-01T00:00:00-00:00", datetime(2026, 1, 1, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC)),
    ],
)
def test_rfc3339_times_normalise_to_utc(text, expected):
    parsed = parse_time(text)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "yesterday",
        "",
        "2023-02-06T13:08:45",  # no offset
        "2023-02-06 13:08:45Z",
        "2023-02-30T00:00:00Z",
        "2023-02-06T24:00:00Z",
        "2023-02-06T13:08:60Z",  # Go refuses leap seconds too
        "2023-02-06T13:08:45+24:00",
        "2023-02-06T13:08:45+02:60",
        "2023-02-06T13:08:45.Z",
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        "２０２３-02-06T13:08:45Z",  # noqa: RUF001 (non-ASCII digits on purpose)
        " 2023-02-06T13:08:45Z",
    ],
)
def test_rfc3339_rejects(text):
    with pytest.raises(ValueError, match="not an RFC 3339 time"):
        parse_time(text)
    assert error_of(body(alert(startsAt=text))) == f"alerts[0].startsAt: not an RFC 3339 time: {text!r}"


def test_zero_ends_at_only_means_none():
    assert parse_notification(body(alert(endsAt="0001-01-01T00:00:00.000Z"))).alerts[0].ends_at is None
    assert parse_notification(body(alert(endsAt="2026-01-01T00:00:00Z"))).alerts[0].ends_at == datetime(
        2026, 1, 1, tzinfo=UTC
    )


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("[1, ]", "invalid JSON at line 1 column 5: Expecting value"),
        ('{"version": "4",\n "alerts": [}', "invalid JSON at line 2 column 13: Expecting value"),
        ("", "invalid JSON at line 1 column 1: Expecting value"),
        (b"\xef\xbb\xbf{}", "invalid JSON at line 1 column 1: Unexpected UTF-8 BOM (decode using utf-8-sig)"),
        (b'{"version": "4\xff"}', "body is not valid UTF-8 (byte 14)"),
        ('{"version": NaN}', "invalid JSON: NaN is not a JSON value"),
        ('{"a": -Infinity}', "invalid JSON: -Infinity is not a JSON value"),
        ("[]", "top level: expected an object, got array"),
        ("null", "top level: expected an object, got null"),
        ('"x"', "top level: expected an object, got string"),
        ("{}", "version: missing (expected '4')"),
        ('{"version": 4}', "version: expected a string, got number"),
        ('{"version": "3"}', "version: unsupported payload version '3' (expected '4')"),
        ('{"version": "4"}', "alerts: missing"),
        ('{"version": "4", "alerts": null}', "alerts: expected an array, got null"),
        ('{"version": "4", "alerts": {}}', "alerts: expected an array, got object"),
        ('{"version": "4", "alerts": []}', "alerts: empty (expected at least one alert)"),
        ('{"version": "4", "alerts": [true]}', "alerts[0]: expected an object, got boolean"),
    ],
)
def test_document_errors(payload, message):
    assert error_of(payload) == message


def test_huge_integer_is_a_payload_error():
    assert error_of('{"n": ' + "9" * 5000 + "}").startswith("invalid JSON: Exceeds the limit (4300 digits)")


@pytest.mark.parametrize(
    ("alerts", "message"),
    [
        (
            [alert(), alert(), alert(), alert(labels={"alertname": "A", "gpu": 3})],
            "alerts[3].labels.gpu: expected a string, got number",
        ),
        ([alert(startsAt="yesterday")], "alerts[0].startsAt: not an RFC 3339 time: 'yesterday'"),
        ([alert(startsAt=1700000000)], "alerts[0].startsAt: expected a string, got number"),
        ([alert(startsAt=...)], "alerts[0].startsAt: missing"),
        ([alert(endsAt="")], "alerts[0].endsAt: not an RFC 3339 time: ''"),
        (
            [alert(), alert(), alert(labels={"alertname": "A", "bad-name": "x"})],
            "alerts[2].labels: label name 'bad-name' is not valid",
        ),
        ([alert(labels={"alertname": "A", "1gpu": "x"})], "alerts[0].labels: label name '1gpu' is not valid"),
        ([alert(labels={"alertname": "A", "": "x"})], "alerts[0].labels: label name '' is not valid"),
        ([alert(labels={"gpu": "0"})], "alerts[0].labels: missing required label 'alertname'"),
        ([alert(labels={"alertname": ""})], "alerts[0].labels.alertname: must not be empty"),
        ([alert(labels={"alertname": None})], "alerts[0].labels.alertname: expected a string, got null"),
        ([alert(labels=...)], "alerts[0].labels: missing"),
        ([alert(labels=["alertname"])], "alerts[0].labels: expected an object, got array"),
        (
            [alert(labels={"alertname": "A", "gpu": "x" * (MAX_LABEL_VALUE + 1)})],
            "alerts[0].labels.gpu: value of 4097 characters exceeds the limit of 4096",
        ),
        (
            [alert(labels={"alertname": "A", **{f"l{i}": "v" for i in range(MAX_LABELS)}})],
            "alerts[0].labels: 201 labels exceed the limit of 200",
        ),
        ([alert(status=...)], "alerts[0].status: missing"),
        ([alert(status="pending")], "alerts[0].status: expected 'firing' or 'resolved', got 'pending'"),
        ([alert(status=1)], "alerts[0].status: expected 'firing' or 'resolved', got number"),
        ([alert(annotations={"summary": 1})], "alerts[0].annotations.summary: expected a string, got number"),
        ([alert(annotations={"a b": []})], 'alerts[0].annotations["a b"]: expected a string, got array'),
        (
            [alert(annotations={"d": "x" * 65537})],
            "alerts[0].annotations.d: value of 65537 characters exceeds the limit of 65536",
        ),
        ([alert(annotations="summary")], "alerts[0].annotations: expected an object, got string"),
        ([alert(generatorURL=5)], "alerts[0].generatorURL: expected a string, got number"),
        ([alert(fingerprint=12)], "alerts[0].fingerprint: expected a string, got number"),
        ([alert(fingerprint="xyz")], "alerts[0].fingerprint: expected 16 hex digits, got 'xyz'"),
        (
            [alert(fingerprint="0123456789abcdef0")],
            "alerts[0].fingerprint: expected 16 hex digits, got '0123456789abcdef0'",
        ),
    ],
)
def test_alert_errors_name_the_path(alerts, message):
    assert error_of(body(*alerts)) == message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"status": "pending"}, "status: expected 'firing' or 'resolved', got 'pending'"),
        ({"receiver": 1}, "receiver: expected a string, got number"),
        ({"externalURL": []}, "externalURL: expected a string, got array"),
        ({"groupKey": {}}, "groupKey: expected a string, got object"),
        ({"groupLabels": {"a.b": "x"}}, "groupLabels: label name 'a.b' is not valid"),
        ({"commonLabels": "x"}, "commonLabels: expected an object, got string"),
        ({"commonAnnotations": {"x": False}}, "commonAnnotations.x: expected a string, got boolean"),
        ({"truncatedAlerts": -1}, "truncatedAlerts: expected a non-negative integer, got -1"),
        ({"truncatedAlerts": 1.5}, "truncatedAlerts: expected a non-negative integer, got number"),
        ({"truncatedAlerts": True}, "truncatedAlerts: expected a non-negative integer, got boolean"),
    ],
)
def test_notification_errors_name_the_field(fields, message):
    assert error_of(body(**fields)) == message


def test_alert_count_limit():
    many = body(*[alert() for _ in range(1500)])
    assert error_of(many) == "alerts: 1500 alerts exceed the limit of 1000"
    assert len(parse_notification(many, max_alerts=1500).alerts) == 1500
    assert error_of(body(alert(), alert()), max_alerts=1) == "alerts: 2 alerts exceed the limit of 1"


def test_nesting_limit_is_checked_before_decoding():
    assert error_of("[" * 100_000) == "nesting deeper than 8 levels at line 1 column 9"
    nine = body(alert(annotations={"x": "y"}, values={"a": {"b": {"c": {"d": {"e": {}}}}}}))  # depth 9
    assert error_of(nine).startswith("nesting deeper than 8 levels at line 1 column ")
    assert parse_notification(nine, max_depth=9).alerts
    # Brackets inside strings do not count; escaped quotes do not end a string.
    text = body(alert(annotations={"summary": '[[[[[[[[[[ {{{{{{{{{{ \\" [[[[[[[[['}))
    assert parse_notification(text).alerts[0].annotations["summary"].startswith("[[[[")
    assert error_of('{"a":\n  [[[[[[[[[]]]]]]]]]}') == "nesting deeper than 8 levels at line 2 column 10"


def test_decoder_recursion_is_a_payload_error():
    # With a limit above what json can recurse into, the decoder's RecursionError is still translated.
    deep = "[" * 200_000 + "]" * 200_000
    assert error_of(deep, max_depth=1_000_000) == "invalid JSON: nested too deeply to decode"


def test_nul_in_a_label_or_annotation_is_refused():
    import json

    from app.domain.errors import PayloadError

    for where in ("labels", "annotations"):
        alert = {
            "status": "firing",
            "labels": {"alertname": "X"},
            "annotations": {},
            "startsAt": "2026-12-02T03:00:00Z",
        }
        alert[where] = {**alert[where], "evil": "a\x00b"}
        body = json.dumps({"version": "4", "status": "firing", "receiver": "r", "alerts": [alert]})
        with pytest.raises(PayloadError, match=rf"alerts\[0\]\.{where}\.evil: contains a NUL character"):
            parse_notification(body)


def test_values_within_the_limit_pass_even_when_together_they_exceed_it():
    labels = {"alertname": "A", "a": "x" * MAX_LABEL_VALUE, "b": "y" * MAX_LABEL_VALUE}
    assert parse_notification(body(alert(labels=labels))).alerts[0].labels == labels


def test_label_names_once_seen_valid_do_not_let_an_invalid_one_through():
    parse_notification(body(alert(labels={"alertname": "A", "gpu": "0"})))
    assert error_of(body(alert(labels={"alertname": "A", "gpu": "0", "gpu-uuid": "x"}))) == (
        "alerts[0].labels: label name 'gpu-uuid' is not valid"
    )


def test_remembered_label_names_are_bounded(monkeypatch):
    monkeypatch.setattr(alertmanager, "_VALID_LABEL_NAMES", set())
    monkeypatch.setattr(alertmanager, "MAX_REMEMBERED_LABEL_NAMES", 50)
    for start in range(0, 200, 20):
        parse_notification(
            body(alert(labels={"alertname": "A", **{f"l{i}": "v" for i in range(start, start + 20)}}))
        )
    assert 50 <= len(alertmanager._VALID_LABEL_NAMES) < 50 + 21
