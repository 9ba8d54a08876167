"""The worker's cost per incident: ``Engine.run_until_idle`` over incidents opened by fleet alerts, in-process.

What each incident costs the worker from open to closed (diagnosis, guards, plan, close, finalize), with the
shipped playbooks in advisory mode (nothing whitelisted, as ``nightshift serve`` starts), no backend configured,
one thread, a fresh SQLite store. Also counts the store transactions each incident takes (writes, and read-only
snapshots), which do not depend on the machine.

    python -m bench.lifecycle [--notifications 40] [--rounds 3] [--out bench/results/lifecycle.json]
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import event

from app import build_engine
from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.store import records
from bench import inprocess
from bench.stats import spread
from bench.workload import Fleet

REPO = Path(__file__).resolve().parents[1]


def run_incidents(notifications: int, seed: int, workdir: Path) -> dict[str, Any]:
    """Open incidents from ``notifications`` fleet notifications, then time the worker closing all of them."""
    settings = Settings(data_dir=str(workdir), playbook_paths=[str(REPO / "playbooks")])
    # The worker's cost per incident, from diagnosis to close: job incidents act at once, no correlation wait.
    settings.episodes.correlation_seconds = 0
    engine = build_engine(settings)
    fleet = Fleet(seed)
    for _ in range(notifications):
        engine.ingest(parse_notification(fleet.next().body))
    transactions: Counter[str] = Counter()

    @event.listens_for(engine.deps.store.engine, "begin")
    def _count(conn: Any) -> None:
        read_only = conn.get_execution_options().get("nightshift_read_only", False)
        transactions["read" if read_only else "write"] += 1

    started = time.perf_counter()
    ticks = engine.run_until_idle(limit=1_000_000)
    elapsed = time.perf_counter() - started
    with engine.deps.store.read() as conn:
        by_state = records.count_incidents_by(conn, "state")
    engine.deps.store.dispose()
    incidents = sum(by_state.values())
    if not incidents:
        raise SystemExit(
            f"{notifications} notifications (seed {seed}) opened no incident: raise --notifications"
        )
    return {
        "incidents": incidents,
        "by_state": by_state,
        "ticks": ticks,
        "ms_per_incident": elapsed / incidents * 1e3,
        "write_transactions_per_incident": transactions["write"] / incidents,
        "read_transactions_per_incident": transactions["read"] / incidents,
    }


def main(argv: list[str] | None = None) -> None:
    args = inprocess.parser(__doc__, "lifecycle", 40, "notifications per round (opens ~400)").parse_args(argv)
    rounds = inprocess.fresh_store_rounds(
        args.rounds,
        "lifecycle",
        lambda seed, workdir: run_incidents(args.notifications, seed, workdir),
        lambda r: (
            f"{r['incidents']} incidents, {r['ms_per_incident']:.2f} ms each, "
            f"{r['write_transactions_per_incident']:.1f} write + "
            f"{r['read_transactions_per_incident']:.1f} read transactions each"
        ),
    )
    results: dict[str, Any] = {
        key: {k: round(v, 2) for k, v in spread([r[key] for r in rounds]).items()}
        for key in ("ms_per_incident", "write_transactions_per_incident", "read_transactions_per_incident")
    }
    results["rounds"] = rounds
    inprocess.write(args, "lifecycle", results, mode="advisory, shipped playbooks")


if __name__ == "__main__":
    main()
