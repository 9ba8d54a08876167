"""Property tests: hostile input raises only PayloadError / MatcherError; matchers round-trip."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.alertmanager import Notification, am_fingerprint, parse_notification
from app.domain.errors import PayloadError
from app.domain.matchers import OPERATORS, Matcher, MatcherError, matches_all, parse_matchers
from tests.strategies import json_values, long_strings, payloads

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parse_or_payload_error(body: str | bytes) -> Notification | None:
    """Parse, accepting only a Notification or a PayloadError as outcomes."""
    try:
        return parse_notification(body)
    except PayloadError:
        return None


@FUZZ
@given(json_values)
def test_any_json_value(value: Any) -> None:
    parse_or_payload_error(json.dumps(value))


@FUZZ
@given(payloads)
def test_payload_shaped_documents(doc: dict[str, Any]) -> None:
    note = parse_or_payload_error(json.dumps(doc))
    if note is not None:
        # Whatever got through honours the model's contract.
        assert note.version == "4" and 1 <= len(note.alerts) <= 1000
        for alert in note.alerts:
            assert alert.status in ("firing", "resolved") and alert.labels["alertname"]
            assert alert.starts_at.tzinfo is not None
            assert re.fullmatch("[0-9a-f]{16}", alert.fingerprint)


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    parse_or_payload_error(data)


@FUZZ
@given(st.text(max_size=200))
def test_random_text(text: str) -> None:
    parse_or_payload_error(text)


@FUZZ
@given(
    st.lists(st.sampled_from(["[", "{", '{"a":', "]", "}", ",", '"x"', "1"]), max_size=60),
    st.integers(1, 30000),
)
def test_deep_nesting(pieces: list[str], depth: int) -> None:
    parse_or_payload_error("[" * depth + "".join(pieces) + "]" * depth)


@FUZZ
@given(long_strings, st.sampled_from(["labels", "annotations", "startsAt", "fingerprint", "generatorURL"]))
def test_huge_strings(text: str, field: str) -> None:
    alert = {"status": "firing", "labels": {"alertname": "A"}, "startsAt": "2026-01-01T00:00:00Z"}
    alert[field] = {"alertname": "A", "big": text} if field in ("labels", "annotations") else text
    parse_or_payload_error(json.dumps({"version": "4", "alerts": [alert]}))


@FUZZ
@given(
    st.dictionaries(
        st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True),
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
    )
)
def test_computed_fingerprint_matches_am_fingerprint(labels: dict[str, str]) -> None:
    labels["alertname"] = "A"
    doc = {
        "version": "4",
        "alerts": [{"status": "firing", "labels": labels, "startsAt": "2026-01-01T00:00:00Z"}],
    }
    assert parse_notification(json.dumps(doc)).alerts[0].fingerprint == am_fingerprint(labels)


# --- matchers -------------------------------------------------------------------------------------

grammar_text = st.text(
    alphabet=st.sampled_from(list("{}!=~,\\\"'` \t\nabxyz019.*+?()[]|^$-:_éπ🙂")), max_size=40
)
regex_text = st.text(
    alphabet=st.sampled_from(list("\\()[]{}?*+|^$.-:=!<>PQEzZpdswbx0129aAiUms,^#&~ ")), max_size=25
)


def parse_or_matcher_error(text: str) -> list[Matcher] | None:
    try:
        return parse_matchers(text)
    except MatcherError:
        return None


@FUZZ
@given(st.text(max_size=100) | grammar_text)
def test_any_text_into_parse_matchers(text: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning from Python's re would mean a translation gap
        parse_or_matcher_error(text)


@FUZZ
@given(regex_text)
def test_any_regex_compiles_or_is_a_matcher_error(regex: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            matcher = Matcher("x", "=~", regex)
        except MatcherError:
            return
    matcher.matches({"x": regex})


def re2_escape(text: str) -> str:
    """Escape ``text`` as an RE2 literal: a backslash before every ASCII character but letters and digits."""
    return "".join("\\" + c if c.isascii() and not c.isalnum() else c for c in text)


@st.composite
def matchers(draw: st.DrawFn) -> Matcher:
    name = draw(st.text(min_size=1, max_size=20))
    op = draw(st.sampled_from(OPERATORS))
    value = draw(st.text(max_size=30))
    if op in ("=~", "!~"):
        value = draw(
            st.sampled_from([re2_escape(value), "79|48", "gpu_.*", "(?i)xid[0-9]+", "[[:alpha:]]*", "a\\z"])
        )
    return Matcher(name, op, value)


@FUZZ
@given(matchers())
def test_canonical_form_round_trips(matcher: Matcher) -> None:
    assert parse_matchers(str(matcher)) == [matcher]


@FUZZ
@given(st.text(max_size=30))
def test_escaped_regex_matches_its_literal(text: str) -> None:
    matcher = Matcher("x", "=~", re2_escape(text))
    assert matcher.matches({"x": text})
    assert not matcher.matches({"x": text + "x"})


def reference_equality(labels: dict[str, str], name: str, op: str, value: str) -> bool:
    """Alertmanager's `=`/`!=`: compare with the label's value, a missing label being ""."""
    actual = labels.get(name, "")
    return actual == value if op == "=" else actual != value


small_values = st.sampled_from(["", "a", "79", "node1", " ", "é"])


@FUZZ
@given(
    st.dictionaries(st.sampled_from(["alertname", "xid", "gpu"]), small_values, max_size=3),
    st.lists(
        st.tuples(st.sampled_from(["alertname", "xid", "gpu"]), st.sampled_from(["=", "!="]), small_values)
    ),
)
def test_equality_matching_agrees_with_reference(
    labels: dict[str, str], specs: list[tuple[str, str, str]]
) -> None:
    built = [Matcher(*spec) for spec in specs]
    for matcher, spec in zip(built, specs, strict=True):
        assert matcher.matches(labels) == reference_equality(labels, *spec)
    assert matches_all(built, labels) == all(reference_equality(labels, *spec) for spec in specs)
