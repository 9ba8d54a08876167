"""The store's size under a steady stream of incidents, with and without retention (issue 22 item 8).

Every simulated day, ``--per-day`` training jobs fail: each job's Xid alert (node1..node16, the shipped example's
labels and annotations) and a rank's NCCL alert reach the engine through the inbox as Alertmanager sends them, the
shipped playbooks plan each job's recovery and its node's repair (advisory: nothing granted), the alerts resolve,
and one alert no playbook matches arrives too. The clock is a fake one that moves a day at a time; the worker
works until idle each day (its retention pass included). The store's size on disk (the SQLite file plus its
write-ahead log) is sampled after each day: without retention it grows linearly; with it, it levels off once the
oldest rows start to go (``retention.incidents_days``; alerts after ``retention.alerts_days``).

    python -m bench.retention [--days 120] [--per-day 20] [--out bench/results/retention.json]

tests/unit/test_retention.py drives the same stream (fewer jobs a day) and asserts the plateau.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app import build_engine
from app.clients import Clients
from app.config import Settings
from app.domain.alertmanager import am_fingerprint, parse_notification
from app.engine import Engine
from bench import record
from tests.fakes import FakeClock

EXAMPLE = Path(__file__).resolve().parents[1] / "alerts" / "examples" / "gpu-xid-79.json"
START = datetime(2026, 1, 1, tzinfo=UTC)
NODES = 16


def _notification(alerts: list[dict[str, Any]], receiver: str = "nightshift") -> bytes:
    return json.dumps(
        {
            "receiver": receiver,
            "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
            "alerts": alerts,
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "version": "4",
            "groupKey": "{}:{}",
            "truncatedAlerts": 0,
        }
    ).encode()


def day_of_alerts(day: int, per_day: int, at: datetime) -> Iterator[list[dict[str, Any]]]:
    """The notifications of one day: each job's Xid and NCCL alerts firing, then resolved; one unmatched alert."""
    template = json.loads(EXAMPLE.read_text())["alerts"][0]
    starts = at.isoformat().replace("+00:00", "Z")
    for i in range(per_day):
        job, node = str(100_000 + day * per_day + i), f"node{i % NODES + 1}"
        xid = copy.deepcopy(template)
        xid["labels"].update(Hostname=node, slurm_job_id=job, hpc_job=job)
        nccl = {
            "status": "firing",
            "labels": {
                "alertname": "TrainingJobError",
                "error_class": "nccl",
                "slurm_job_id": job,
                "Hostname": node,
                "rank": "3",
                "severity": "critical",
            },
            "annotations": {"summary": f"NCCL error in job {job} rank 3"},
            "generatorURL": template["generatorURL"],
        }
        firing = []
        for one in (xid, nccl):
            one.update(
                startsAt=starts, endsAt="0001-01-01T00:00:00Z", fingerprint=am_fingerprint(one["labels"])
            )
            firing.append(one)
        yield firing
        yield [{**one, "status": "resolved", "endsAt": starts} for one in firing]
    stray = {"alertname": "DiskAlmostFull", "instance": f"host{day}", "severity": "warning"}
    yield [
        {
            "status": "firing",
            "labels": stray,
            "annotations": {"summary": "a disk fills up"},
            "startsAt": starts,
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": template["generatorURL"],
            "fingerprint": am_fingerprint(stray),
        }
    ]


def store_bytes(engine: Engine) -> int:
    """The SQLite file and its write-ahead log, after a checkpoint."""
    engine.deps.store.checkpoint(min_interval_s=0)
    path = Path(engine.deps.settings.resolved_store_url.split("///", 1)[1])
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def stream(workdir: Path, days: int, per_day: int, retention: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the stream for ``days`` days with these retention settings; the store's size after each day."""
    settings = Settings(data_dir=str(workdir))
    for key, value in retention.items():
        setattr(settings.retention, key, value)
    clock = FakeClock(START)
    engine = build_engine(settings, clock=clock, clients=Clients(settings))
    sizes = []
    accepted = 0
    for day in range(days):
        for alerts in day_of_alerts(day, per_day, clock.now()):
            body = _notification(alerts)
            engine.accept(parse_notification(body), body)
            accepted += len(body)
            engine.run_until_idle(limit=100_000)
        clock.advance(days=1)
        engine.run_until_idle(limit=100_000)
        sizes.append({"day": day + 1, "bytes": store_bytes(engine), "accepted_bytes": accepted})
    engine.deps.store.dispose()
    return sizes


def growth_per_day(sizes: list[dict[str, Any]], first_day: int) -> float:
    """Bytes a day from ``first_day`` to the last (a straight line through both ends)."""
    start = next(s for s in sizes if s["day"] == first_day)
    return (sizes[-1]["bytes"] - start["bytes"]) / (sizes[-1]["day"] - first_day)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=120)
    parser.add_argument("--per-day", type=int, default=20)
    parser.add_argument("--incidents-days", type=int, default=30)
    parser.add_argument("--alerts-days", type=int, default=7)
    parser.add_argument("--out", default="bench/results/retention.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    plateau_from = args.incidents_days + 2
    for name, retention in (
        ("without", {"enabled": False}),
        ("with", {"incidents_days": args.incidents_days, "alerts_days": args.alerts_days}),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            sizes = stream(Path(tmp), args.days, args.per_day, retention)
        last = sizes[-1]
        results[name] = {
            "retention": retention,
            "sizes": sizes,
            "final_bytes": last["bytes"],
            "bytes_per_accepted_byte": round(last["bytes"] / last["accepted_bytes"], 3),
            f"bytes_per_day_from_day_{plateau_from}": round(growth_per_day(sizes, plateau_from)),
        }
        print(
            f"{name} retention: {last['bytes']} bytes after {args.days} days "
            f"({results[name]['bytes_per_accepted_byte']} per byte accepted), "
            f"{results[name][f'bytes_per_day_from_day_{plateau_from}']} bytes/day from day {plateau_from}",
            flush=True,
        )
    print(f"wrote {record.write(Path(args.out), 'retention', vars(args), results)}")


if __name__ == "__main__":
    main()
