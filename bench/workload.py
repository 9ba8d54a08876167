"""A synthetic GPU fleet's Alertmanager notifications, deterministic for a seed. Pure: no I/O.

Each notification is one aggregation group (one ``alertname``) of 1..``max_group`` alerts, shaped as Alertmanager
0.25 sends it (version 4). A share ``repeat`` of each group's alerts are instances already sent (same fingerprint
and ``startsAt``: Alertmanager re-sends the whole group at every ``group_interval``), the rest are new instances; a
share ``resolve`` of the repeats arrive resolved and retire. The alert kinds follow rules/ and playbooks/: some
match a shipped playbook (Xid 79/13, thermal, ECC, NCCL, storage, hang), others match none.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.domain.alertmanager import am_fingerprint

ZERO_TIME = "0001-01-01T00:00:00Z"
# Active instances kept per alertname for repeats: bounds the generator's memory on 100k-alert runs.
MAX_ACTIVE_PER_GROUP = 2000

# alertname → (weight, extra labels); the fleet fills Hostname, gpu, instance, job ids.
KINDS: dict[str, tuple[int, dict[str, str]]] = {
    "GpuXidError": (4, {"xid": "79", "xid_class": "reboot", "severity": "critical"}),
    "GpuXidErrorRestart": (2, {"xid": "13", "xid_class": "restart_app", "severity": "warning"}),
    "GpuXidErrorInfo": (2, {"xid": "43", "xid_class": "ignore", "severity": "info"}),
    "GpuThermalThrottle": (3, {"severity": "warning"}),
    "GpuEccDoubleBitError": (1, {"severity": "critical"}),
    "GpuNvlinkErrors": (2, {"severity": "warning"}),
    "DcgmExporterDown": (1, {"severity": "warning"}),
    "TrainingJobError": (2, {"error_class": "nccl", "severity": "critical"}),
    "TrainingJobErrorStorage": (1, {"error_class": "storage_io", "severity": "critical"}),
    "TrainingHang": (1, {"severity": "critical"}),
    "TrainingThroughputDrop": (2, {"severity": "warning"}),
}
# Several kinds share a real alertname and differ by labels (as the generated Xid rules do).
ALERTNAME = {
    "GpuXidErrorRestart": "GpuXidError",
    "GpuXidErrorInfo": "GpuXidError",
    "TrainingJobErrorStorage": "TrainingJobError",
}


@dataclass(frozen=True)
class Notification:
    """One webhook body and how many alerts it carries."""

    body: bytes
    alerts: int


@dataclass
class _Instance:
    labels: dict[str, str]
    fingerprint: str
    starts_at: str


class Fleet:
    """Generates notifications from ``nodes`` nodes of 8 GPUs, one training job per 8 nodes."""

    def __init__(
        self,
        seed: int = 1,
        *,
        nodes: int = 256,
        max_group: int = 50,
        repeat: float = 0.5,
        resolve: float = 0.1,
        start: datetime | None = None,
    ):
        if not 1 <= max_group <= 1000:
            raise ValueError("max_group must be within 1..1000 (Nightshift's default max_alerts_per_payload)")
        self.rng = random.Random(seed)
        self.nodes = nodes
        self.max_group = max_group
        self.repeat = repeat
        self.resolve = resolve
        self.start = start or datetime.now(UTC) - timedelta(hours=1)
        self._kinds = list(KINDS)
        self._weights = [KINDS[k][0] for k in self._kinds]
        self._active: dict[str, list[_Instance]] = {k: [] for k in self._kinds}
        self._serial = 0

    def notifications(self) -> Iterator[Notification]:
        """An endless stream of notifications."""
        while True:
            yield self.next()

    def next(self) -> Notification:
        kind = self.rng.choices(self._kinds, self._weights)[0]
        size = self.rng.randint(1, self.max_group)
        active = self._active[kind]
        repeats = min(len(active), round(size * self.repeat))
        alerts = []
        for instance in self.rng.sample(active, repeats):
            resolved = self.rng.random() < self.resolve
            if resolved:
                active.remove(instance)
            alerts.append(self._alert(instance, resolved))
        for _ in range(size - repeats):
            instance = self._new_instance(kind)
            active.append(instance)
            alerts.append(self._alert(instance, False))
        del active[:-MAX_ACTIVE_PER_GROUP]
        return Notification(json.dumps(_payload(ALERTNAME.get(kind, kind), alerts)).encode(), len(alerts))

    def _new_instance(self, kind: str) -> _Instance:
        node = self.rng.randrange(self.nodes)
        labels = {
            "alertname": ALERTNAME.get(kind, kind),
            "Hostname": f"gpu-node{node:04d}",
            "instance": f"gpu-node{node:04d}:9400",
            "job": "dcgm-exporter",
            "gpu": str(self.rng.randrange(8)),
            "slurm_job_id": str(100000 + node // 8),
            "train_job": f"llm-pretrain-{node // 8}",
            "cluster": "bench",
            **KINDS[kind][1],
        }
        self._serial += 1
        starts_at = self.start + timedelta(milliseconds=self._serial)
        return _Instance(labels, am_fingerprint(labels), _rfc3339(starts_at))

    def _alert(self, instance: _Instance, resolved: bool) -> dict[str, object]:
        labels = instance.labels
        return {
            "status": "resolved" if resolved else "firing",
            "labels": labels,
            "annotations": {
                "summary": f"{labels['alertname']} on {labels['Hostname']} GPU {labels['gpu']}",
                "description": "synthetic alert from bench/workload.py",
            },
            "startsAt": instance.starts_at,
            "endsAt": _rfc3339(datetime.now(UTC)) if resolved else ZERO_TIME,
            "generatorURL": "http://prometheus:9090/graph?g0.expr=bench",
            "fingerprint": instance.fingerprint,
        }


def _payload(alertname: str, alerts: list[dict[str, object]]) -> dict[str, object]:
    firing = any(a["status"] == "firing" for a in alerts)
    return {
        "receiver": "nightshift",
        "status": "firing" if firing else "resolved",
        "alerts": alerts,
        "groupLabels": {"alertname": alertname},
        "commonLabels": {"alertname": alertname, "cluster": "bench"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": '{}:{alertname="' + alertname + '"}',
        "truncatedAlerts": 0,
    }


def _rfc3339(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def schedule(
    fleet: Fleet, alerts_per_s: float, *, duration_s: float | None = None, total_alerts: int | None = None
) -> list[tuple[float, Notification]]:
    """Notifications with their send offsets (seconds from the start) for an offered load in alerts/s.

    Notification ``i`` is due when the alerts before it have been offered at exactly ``alerts_per_s``, so the
    alert rate is exact and notifications arrive at uneven intervals, as groups of uneven size do. Stops at
    ``duration_s`` or once ``total_alerts`` have been scheduled, whichever is given (one of them must be).
    """
    if (duration_s is None) == (total_alerts is None):
        raise ValueError("give exactly one of duration_s and total_alerts")
    if alerts_per_s <= 0:
        raise ValueError("alerts_per_s must be positive")
    planned: list[tuple[float, Notification]] = []
    offered = 0
    for notification in fleet.notifications():
        offset = offered / alerts_per_s
        if duration_s is not None and offset >= duration_s:
            break
        if total_alerts is not None and offered >= total_alerts:
            break
        planned.append((offset, notification))
        offered += notification.alerts
    return planned
