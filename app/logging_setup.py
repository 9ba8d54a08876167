"""Log output for operators: ``log_format: text`` (the default, for a terminal) or ``json`` (one object a line).

A JSON line carries ``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger`` and ``message``; the ids of
the incident, node repair, alert or inbox notification it is about when the record has them
(``extra={"incident_id": ...}``, or a message that starts with ``incident %s``, ``alert %s`` or ``inbox %s``, as
the engine's do); ``exception`` with the traceback; for gunicorn's access log the request's ``remote_addr``,
``method``, ``path``, ``status``, ``bytes`` and ``duration_ms``; for a ledger row's line (:mod:`app.ledger_log`)
its ``kind`` and fields (``command``, ``exit_code``, ``duration``...). :class:`GunicornLogger` (``nightshift
serve``'s gunicorn logger class) gives gunicorn's error and access logs the format the root logger has, so one
process writes one format.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from gunicorn import glogging

from app.config import LOG_FORMATS
from app.domain.errors import ConfigError

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ID_FIELDS = ("incident_id", "repair_id", "alert_id", "inbox_id")
LEDGER_PREFIX = "ledger_"  # app.ledger_log's lines: kind and the row's fields (ledger_command -> command)
# "incident %s: tick failed" -> incident_id is the first argument.
_ID_PREFIX = re.compile(r"^(incident|alert|inbox) %[sd]\b")
# gunicorn's access log atoms (gunicorn.glogging.Logger.atoms) -> our field names.
_ACCESS_ATOMS = {
    "h": "remote_addr",
    "m": "method",
    "U": "path",
    "s": "status",
    "B": "bytes",
    "a": "user_agent",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(record_ids(record))
        if record.name == "app.ledger":
            entry["kind"] = getattr(record, "kind", None)
            entry.update(
                (name.removeprefix(LEDGER_PREFIX), value)
                for name, value in vars(record).items()
                if name.startswith(LEDGER_PREFIX)
            )
        if record.name == "gunicorn.access" and isinstance(record.args, Mapping):
            entry.update(access_fields(record.args))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False)


def record_ids(record: logging.LogRecord) -> dict[str, Any]:
    """The incident/alert/inbox ids a record is about: given as ``extra``, else from its message's prefix."""
    ids = {name: getattr(record, name) for name in ID_FIELDS if getattr(record, name, None) is not None}
    if not ids and isinstance(record.msg, str) and isinstance(record.args, tuple) and record.args:
        match = _ID_PREFIX.match(record.msg)
        if match:
            ids[f"{match.group(1)}_id"] = record.args[0]
    return ids


def access_fields(atoms: Mapping[str, Any]) -> dict[str, Any]:
    """The request fields of a gunicorn access-log record (its ``args`` are gunicorn's atoms)."""
    fields = {name: atoms[atom] for atom, name in _ACCESS_ATOMS.items() if atom in atoms}
    for name in ("status", "bytes"):
        value = fields.get(name)
        if isinstance(value, str) and value.isdigit():
            fields[name] = int(value)
    if "D" in atoms:  # microseconds
        fields["duration_ms"] = round(int(atoms["D"]) / 1000, 3)
    return fields


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format: expected one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def configure_logging(log_format: str, level: str) -> None:
    """The root logger at ``level``, every handler of it in ``log_format`` (one handler on stderr if none)."""
    chosen = formatter(log_format)
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        handler.setFormatter(chosen)
    root.setLevel(level.upper())


def json_logging() -> bool:
    """Whether the root logger writes JSON (what :func:`configure_logging` chose for this process)."""
    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)


class GunicornLogger(glogging.Logger):
    """gunicorn's logger, writing its error and access logs as JSON when the root logger does."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        if json_logging():
            for log in (self.error_log, self.access_log):
                for handler in log.handlers:
                    handler.setFormatter(JsonFormatter())
