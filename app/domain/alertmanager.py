"""The Alertmanager webhook payload (version "4") as immutable values, validated with JSON-path errors.

:func:`parse_notification` is the only way in: it accepts the body Alertmanager POSTs (``notify/webhook``,
``template.Data``) and raises :class:`app.domain.errors.PayloadError` (HTTP 400, which Alertmanager does not retry)
naming the offending field, e.g. ``alerts[3].labels.gpu: expected a string, got number``. Unknown keys
(``notification_reason``, ``routeLabels``, Grafana's extras) are ignored.

Pure: no I/O, no web framework.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from app.domain.errors import PayloadError

PAYLOAD_VERSION = "4"
STATUSES = ("firing", "resolved")
MAX_LABELS = 200
MAX_LABEL_NAME = 256  # characters of a label or annotation name
MAX_LABEL_VALUE = 4096
MAX_ANNOTATION_VALUE = 65536
# Go's zero time.Time, which Alertmanager sends as endsAt for alerts still firing.
GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)

_FINGERPRINT = re.compile(r"[0-9a-fA-F]{16}")
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)
# A JSON string (possibly unterminated) or a bracket: enough to measure nesting without recursing.
_JSON_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTAINERS = (dict, list)  # what json.loads makes of objects and arrays
# Label names seen valid, so that the next alerts' are checked in one set operation; bounded against a sender
# that invents names: at most MAX_REMEMBERED_LABEL_NAMES names of at most MAX_LABEL_NAME characters (2.5 MB).
_VALID_LABEL_NAMES: set[str] = set()
MAX_REMEMBERED_LABEL_NAMES = 10_000


@dataclass(frozen=True)
class Alert:
    """One alert of a notification. ``labels`` and ``annotations`` are dicts; treat them as read-only."""

    status: str  # "firing" | "resolved"
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime  # aware, UTC
    ends_at: datetime | None  # None while firing (Go's zero time on the wire)
    generator_url: str
    fingerprint: str  # 16 lower-case hex digits, as sent or computed with am_fingerprint


@dataclass(frozen=True)
class Notification:
    """One webhook POST: a whole aggregation group's current state (not a delta; dedupe by fingerprint)."""

    receiver: str  # as sent: Alertmanager regex-escapes it (gpu\.remediator)
    status: str  # "firing" if any alert fires, else "resolved"
    alerts: tuple[Alert, ...]
    group_labels: Mapping[str, str]
    common_labels: Mapping[str, str]
    common_annotations: Mapping[str, str]
    external_url: str
    version: str
    group_key: str
    truncated_alerts: int


def am_fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's alert fingerprint: FNV-1a 64 over the sorted label names, each ``name 0xff value 0xff``
    (prometheus/common ``labelSetToFingerprint``), as 16 lower-case hex digits."""
    digest = 0xCBF29CE484222325
    for name in sorted(labels):
        for byte in name.encode() + b"\xff" + labels[name].encode() + b"\xff":
            digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{digest:016x}"


def parse_notification(body: bytes | str, *, max_alerts: int = 1000, max_depth: int = 8) -> Notification:
    """Parse and validate a version-4 webhook body. Raises :class:`PayloadError` naming the field at fault.

    Required: ``version`` ("4") and a non-empty ``alerts`` (at most ``max_alerts``), each alert with
    ``status``, ``labels`` (including ``alertname``) and ``startsAt``. JSON nested deeper than ``max_depth``
    is refused, with the line and column where it gets too deep.
    """
    doc = _decode(body, max_depth)
    if not isinstance(doc, dict):
        raise PayloadError(f"top level: expected an object, got {_kind(doc)}")
    version = doc.get("version")
    if version is None:
        raise PayloadError("version: missing (expected '4')")
    if not isinstance(version, str):
        raise PayloadError(f"version: expected a string, got {_kind(version)}")
    if version != PAYLOAD_VERSION:
        raise PayloadError(f"version: unsupported payload version {_show(version)} (expected '4')")
    raw_alerts = _required(doc, "alerts", "alerts")
    if not isinstance(raw_alerts, list):
        raise PayloadError(f"alerts: expected an array, got {_kind(raw_alerts)}")
    if not raw_alerts:
        raise PayloadError("alerts: empty (expected at least one alert)")
    if len(raw_alerts) > max_alerts:
        raise PayloadError(f"alerts: {len(raw_alerts)} alerts exceed the limit of {max_alerts}")
    alerts = tuple(_alert(raw, f"alerts[{i}]") for i, raw in enumerate(raw_alerts))
    status = _status(doc["status"], "status") if doc.get("status") is not None else None
    return Notification(
        receiver=_optional_string(doc, "receiver", ""),
        status=status or ("firing" if any(a.status == "firing" for a in alerts) else "resolved"),
        alerts=alerts,
        group_labels=_labels(doc.get("groupLabels"), "groupLabels"),
        common_labels=_labels(doc.get("commonLabels"), "commonLabels"),
        common_annotations=_annotations(doc.get("commonAnnotations"), "commonAnnotations"),
        external_url=_optional_string(doc, "externalURL", ""),
        version=version,
        group_key=_optional_string(doc, "groupKey", ""),
        truncated_alerts=_count(doc.get("truncatedAlerts"), "truncatedAlerts"),
    )


@functools.lru_cache(maxsize=4096)  # the same startsAt arrives again with every re-sent group
def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 time (``Z`` or ``±hh:mm``, any fraction, truncated to microseconds) to aware UTC.

    Raises ValueError when ``text`` is not one or is out of range.
    """
    problem = f"not an RFC 3339 time: {_show(text)}"
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(problem)
    year, month, day, hour, minute, second, fraction, sign, off_hours, off_minutes = match.groups()
    offset = timedelta(0)
    if sign is not None:
        if int(off_hours) > 23 or int(off_minutes) > 59:
            raise ValueError(problem)
        offset = timedelta(hours=int(off_hours), minutes=int(off_minutes)) * (1 if sign == "+" else -1)
    micros = int((fraction or "")[:6].ljust(6, "0"))
    try:
        local = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            micros,
            tzinfo=timezone(offset),
        )
        return local.astimezone(UTC)
    except (ValueError, OverflowError):  # day 30 of February; before year 1 or after 9999 once in UTC
        raise ValueError(problem) from None


# --- decoding -------------------------------------------------------------------------------------


def _decode(body: bytes | str, max_depth: int) -> Any:
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadError(f"body is not valid UTF-8 (byte {exc.start})") from None
    else:
        text = body
    # Decode first (C, bounded by the body size limit and by the interpreter's recursion limit) and measure the
    # depth of what came out; the slower scan that locates the fault runs only for a body that fails either way,
    # so that too deep a document is reported as such even when it is also malformed.
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        _check_nesting(text, max_depth)
        raise PayloadError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        _check_nesting(text, max_depth)
        # Only reachable with a max_depth above what the decoder can recurse into.
        raise PayloadError("invalid JSON: nested too deeply to decode") from None
    except ValueError as exc:  # NaN/Infinity, integers with too many digits
        _check_nesting(text, max_depth)
        raise PayloadError(f"invalid JSON: {exc}") from None
    if _depth_exceeds(doc, max_depth):
        _check_nesting(text, max_depth)
    return doc


def _depth_exceeds(doc: Any, max_depth: int) -> bool:
    """Whether a decoded document nests containers deeper than ``max_depth`` (the top level is depth 1)."""
    level = [doc] if type(doc) in _CONTAINERS else []
    for _ in range(max_depth):
        if not level:
            return False
        level = [
            child
            for node in level
            for child in (node.values() if type(node) is dict else node)
            if type(child) in _CONTAINERS
        ]
    return bool(level)


def _check_nesting(text: str, max_depth: int) -> None:
    """Refuse arrays/objects nested deeper than ``max_depth`` (linear scan; strings are skipped whole)."""
    depth = 0
    for token in _JSON_NESTING.finditer(text):
        char = token.group()[0]
        if char in "[{":
            depth += 1
            if depth > max_depth:
                line = text.count("\n", 0, token.start()) + 1
                column = token.start() - text.rfind("\n", 0, token.start())
                raise PayloadError(f"nesting deeper than {max_depth} levels at line {line} column {column}")
        elif char in "]}":
            depth -= 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


# --- fields ---------------------------------------------------------------------------------------


def _alert(raw: Any, path: str) -> Alert:
    if not isinstance(raw, dict):
        raise PayloadError(f"{path}: expected an object, got {_kind(raw)}")
    status = _status(_required(raw, "status", f"{path}.status"), f"{path}.status")
    labels = _labels(_required(raw, "labels", f"{path}.labels"), f"{path}.labels")
    if "alertname" not in labels:
        raise PayloadError(f"{path}.labels: missing required label 'alertname'")
    if not labels["alertname"]:
        raise PayloadError(f"{path}.labels.alertname: must not be empty")
    ends_at = _time(raw["endsAt"], f"{path}.endsAt") if raw.get("endsAt") is not None else None
    return Alert(
        status=status,
        labels=labels,
        annotations=_annotations(raw.get("annotations"), f"{path}.annotations"),
        starts_at=_time(_required(raw, "startsAt", f"{path}.startsAt"), f"{path}.startsAt"),
        ends_at=None if ends_at == GO_ZERO_TIME else ends_at,
        generator_url=_optional_string(raw, "generatorURL", "", path),
        fingerprint=_fingerprint(raw.get("fingerprint"), f"{path}.fingerprint", labels),
    )


def _required(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise PayloadError(f"{path}: missing")
    return obj[key]


def _status(value: Any, path: str) -> str:
    if value not in STATUSES:
        shown = _show(value) if isinstance(value, str) else _kind(value)
        raise PayloadError(f"{path}: expected 'firing' or 'resolved', got {shown}")
    return str(value)


def _labels(value: Any, path: str) -> dict[str, str]:
    if isinstance(value, dict):
        if len(value) > MAX_LABELS:
            raise PayloadError(f"{path}: {len(value)} labels exceed the limit of {MAX_LABELS}")
        if not value.keys() <= _VALID_LABEL_NAMES:  # a fleet uses a few dozen names: one set check in C
            for name in value:
                if len(name) > MAX_LABEL_NAME:
                    raise PayloadError(
                        f"{path}: label name of {len(name)} characters exceeds the limit of {MAX_LABEL_NAME}"
                    )
                if not _is_label_name(name):
                    raise PayloadError(f"{path}: label name {_show(name)} is not valid")
            if len(_VALID_LABEL_NAMES) < MAX_REMEMBERED_LABEL_NAMES:
                _VALID_LABEL_NAMES.update(value)
    return _string_map(value, path, MAX_LABEL_VALUE)


def _annotations(value: Any, path: str) -> dict[str, str]:
    return _string_map(value, path, MAX_ANNOTATION_VALUE)


def _string_map(value: Any, path: str, max_value: int) -> dict[str, str]:
    """A JSON object of strings (null or absent: empty), lone surrogates replaced as Go's decoder does."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(f"{path}: expected an object, got {_kind(value)}")
    if _plain_strings(value, max_value):
        return value
    out: dict[str, str] = {}
    for key, item in value.items():
        if len(key) > MAX_LABEL_NAME:
            raise PayloadError(f"{path}: name of {len(key)} characters exceeds the limit of {MAX_LABEL_NAME}")
        if not isinstance(item, str):
            raise PayloadError(f"{_member(path, key)}: expected a string, got {_kind(item)}")
        if len(item) > max_value:
            raise PayloadError(
                f"{_member(path, key)}: value of {len(item)} characters exceeds the limit of {max_value}"
            )
        if "\x00" in key or "\x00" in item:
            # No label source emits NUL, and PostgreSQL text cannot store it: refuse it here, loudly.
            raise PayloadError(f"{_member(path, key)}: contains a NUL character")
        out[_clean(key)] = _clean(item)
    return out


def _plain_strings(value: dict[str, Any], max_value: int) -> bool:
    """The common case, checked in bulk: every value a string within the limit, all of it ASCII without NUL."""
    try:
        values = "".join(value.values())
    except TypeError:  # a value that is not a string
        return False
    if len(values) > max_value and any(len(item) > max_value for item in value.values()):
        return False
    names = "".join(value)
    if len(names) > MAX_LABEL_NAME and any(len(name) > MAX_LABEL_NAME for name in value):
        return False
    text = names + values
    return text.isascii() and "\x00" not in text


def _time(value: Any, path: str) -> datetime:
    if not isinstance(value, str):
        raise PayloadError(f"{path}: expected a string, got {_kind(value)}")
    try:
        return parse_time(value)
    except ValueError as exc:
        raise PayloadError(f"{path}: {exc}") from None


def _fingerprint(value: Any, path: str, labels: Mapping[str, str]) -> str:
    if value is None or value == "":
        return am_fingerprint(labels)
    if not isinstance(value, str):
        raise PayloadError(f"{path}: expected a string, got {_kind(value)}")
    if not _FINGERPRINT.fullmatch(value):
        raise PayloadError(f"{path}: expected 16 hex digits, got {_show(value)}")
    return value.lower()


def _optional_string(obj: dict[str, Any], key: str, default: str, parent: str = "") -> str:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise PayloadError(f"{_member(parent, key)}: expected a string, got {_kind(value)}")
    if "\x00" in value:  # as in labels: PostgreSQL text cannot store it (a 500 there, retried forever)
        raise PayloadError(f"{_member(parent, key)}: contains a NUL character")
    return _clean(value)


def _count(value: Any, path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise PayloadError(f"{path}: expected a non-negative integer, got {_kind(value)}")
    if value < 0:
        raise PayloadError(f"{path}: expected a non-negative integer, got {value}")
    return value


# --- messages -------------------------------------------------------------------------------------


def _is_label_name(name: str) -> bool:
    """``[a-zA-Z_][a-zA-Z0-9_]*``: an ASCII identifier (str methods, several times faster than the regex)."""
    return name.isascii() and name.isidentifier()


def _member(path: str, key: str) -> str:
    """``path.key``, or ``path["key"]`` when the key is not identifier-like."""
    if _is_label_name(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key if len(key) <= 60 else key[:57] + '...')}]"


def _kind(value: Any) -> str:
    """The JSON type name of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _clean(text: str) -> str:
    # Python's json keeps lone UTF-16 surrogates ("\ud800"); Go's replaces them with U+FFFD, and so do we,
    # so that every string is encodable (fingerprints, the store). ASCII text (nearly all) has none.
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _show(text: str, limit: int = 80) -> str:
    """repr(text), shortened for messages."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"
