"""Nightshift's own cost of ingesting an alert: ``Engine.ingest`` in-process, one thread, SQLite, no HTTP.

What the worker pays per alert when it ingests the inbox (the same ``ingest_alerts``, a batch at a time), inside
the store's write transaction; SQLite serialises writers, so this per-alert time bounds the alerts/s one store can
ingest whatever the gunicorn settings.
Same workload as the load generator (groups of 1..50, half repeats), shipped playbooks, a fresh store.

    python -m bench.engine_ingest [--notifications 300] [--rounds 3] [--out bench/results/engine_ingest.json]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from app import build_engine
from app.config import Settings
from app.domain.alertmanager import parse_notification
from bench import inprocess
from bench.stats import spread
from bench.workload import Fleet

REPO = Path(__file__).resolve().parents[1]


def measure_round(notifications: int, seed: int, workdir: Path) -> dict[str, float]:
    """Median and mean µs per alert over ``notifications`` ingested into a fresh store."""
    engine = build_engine(Settings(data_dir=str(workdir), playbook_paths=[str(REPO / "playbooks")]))
    fleet = Fleet(seed)
    parsed = [parse_notification(fleet.next().body) for _ in range(notifications)]
    per_alert = []
    started = time.perf_counter()
    for notification in parsed:
        begin = time.perf_counter()
        engine.ingest(notification)
        per_alert.append((time.perf_counter() - begin) / len(notification.alerts) * 1e6)
    elapsed = time.perf_counter() - started
    engine.deps.store.dispose()
    alerts = sum(len(n.alerts) for n in parsed)
    return {"median_us": statistics.median(per_alert), "mean_us": elapsed / alerts * 1e6, "alerts": alerts}


def main(argv: list[str] | None = None) -> None:
    args = inprocess.parser(__doc__, "engine_ingest", 300, "notifications per round").parse_args(argv)
    rounds = inprocess.fresh_store_rounds(
        args.rounds,
        "engine-ingest",
        lambda seed, workdir: measure_round(args.notifications, seed, workdir),
        lambda r: f"{r['median_us']:.0f}us per alert (median over notifications)",
    )
    results = {
        "per_alert_us": {k: round(v, 1) for k, v in spread([r["median_us"] for r in rounds]).items()},
        "rounds": rounds,
    }
    inprocess.write(args, "engine_ingest", results, store="SQLite (WAL), fresh per round")


if __name__ == "__main__":
    main()
