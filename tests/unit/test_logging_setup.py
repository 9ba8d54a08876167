"""log_format: the JSON lines (fields, ids, exceptions, gunicorn's access atoms), the text default, bad values."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest
from gunicorn.config import Config

from app.config import load_settings
from app.domain.errors import ConfigError
from app.logging_setup import GunicornLogger, JsonFormatter, configure_logging, json_logging


def record(msg: str, *args: object, name: str = "app.engine", **extra: object) -> logging.LogRecord:
    made = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args or None, None)
    made.__dict__.update(extra)
    return made


def as_json(rec: logging.LogRecord) -> dict[str, object]:
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    return json.loads(line)


def test_a_json_line_has_time_level_logger_and_message() -> None:
    entry = as_json(record("worker %s started", "w1"))

    assert entry["level"] == "WARNING"
    assert entry["logger"] == "app.engine"
    assert entry["message"] == "worker w1 started"
    assert str(entry["time"]).endswith("Z") and "T" in str(entry["time"])
    assert not {"incident_id", "alert_id", "inbox_id"} & entry.keys()


def test_ids_come_from_extra_or_from_the_engines_message_prefix() -> None:
    assert as_json(record("acting", incident_id=7, alert_id=12))["incident_id"] == 7
    assert as_json(record("incident %s: tick failed", 42))["incident_id"] == 42
    assert as_json(record("inbox %d: ingestion failed; set aside", 3))["inbox_id"] == 3
    assert "incident_id" not in as_json(record("incidents %s", 5))


def test_an_exception_is_one_field_of_the_same_line() -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        rec = logging.LogRecord("app", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())

    entry = as_json(rec)

    assert entry["message"] == "failed"
    assert "RuntimeError: boom" in str(entry["exception"])


def test_gunicorn_access_records_carry_the_request() -> None:
    atoms = {"h": "10.0.0.9", "m": "POST", "U": "/api/v1/alerts", "s": "200", "B": "57", "D": 2500, "a": "am"}
    rec = record('%(h)s "%(m)s %(U)s" %(s)s', name="gunicorn.access")
    rec.args = atoms  # gunicorn passes its atoms as the one mapping argument

    entry = as_json(rec)

    assert entry["message"] == '10.0.0.9 "POST /api/v1/alerts" 200'
    assert (entry["method"], entry["path"], entry["status"], entry["bytes"]) == (
        "POST",
        "/api/v1/alerts",
        200,
        57,
    )
    assert entry["duration_ms"] == 2.5
    assert entry["remote_addr"] == "10.0.0.9"


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    """The root logger with one handler of our own, restored afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    root.handlers = [logging.StreamHandler(io.StringIO())]
    yield root
    root.handlers, root.level = saved[0], saved[1]


def test_configure_json_then_gunicorn_follows(root_logging: logging.Logger) -> None:
    configure_logging("json", "debug")
    cfg = Config()
    cfg.set("accesslog", "-")
    gunicorn_log = GunicornLogger(cfg)

    assert json_logging() and root_logging.level == logging.DEBUG
    formatters = [
        h.formatter for log in (gunicorn_log.error_log, gunicorn_log.access_log) for h in log.handlers
    ]
    assert formatters and all(isinstance(f, JsonFormatter) for f in formatters)


def test_text_is_the_default_and_gunicorn_keeps_its_own(root_logging: logging.Logger) -> None:
    configure_logging(load_settings(env={}).log_format, "INFO")
    cfg = Config()
    cfg.set("accesslog", "-")
    gunicorn_log = GunicornLogger(cfg)

    assert not json_logging()
    assert not any(isinstance(h.formatter, JsonFormatter) for h in gunicorn_log.access_log.handlers)


def test_an_unknown_format_is_a_config_error(root_logging: logging.Logger) -> None:
    with pytest.raises(ConfigError, match="log_format: expected one of text, json, got 'yaml'"):
        configure_logging("yaml", "INFO")
