"""The worker's retention pass: prune what the store may forget (app/store/retention.py says what), in bounded
batches, one transaction each, between the worker's other work.

A pass starts at most every ``retention.interval_seconds`` across all workers and replicas (the control row
``retention``); each :meth:`Retention.work_once` deletes one batch of one group (``retention.batch_rows`` rows and
what depends on them), after appending it to ``retention.export_dir`` when set, so the webhook never waits long
for SQLite's one write lock. When every group is done the pass writes one ledger row with the counts (none when
nothing went) and, on SQLite in incremental auto-vacuum, hands the freed pages back a bounded number at a time.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from app.domain.retention import Cutoffs, cutoffs
from app.domain.states import LedgerKind
from app.engine import transitions
from app.engine.deps import EngineDeps
from app.store import retention as prunable

log = logging.getLogger(__name__)
# Free pages handed back per step once a pass has deleted what it could (4 KiB pages: 8 MiB a step).
RECLAIM_PAGES = 2048


@dataclass
class Pass:
    """One pass under way: its cutoffs (fixed when it starts), the group it is at, and what it deleted."""

    cut: Cutoffs
    started_at: datetime
    groups: list[str] = field(default_factory=lambda: list(prunable.GROUPS))
    deleted: dict[str, int] = field(default_factory=dict)
    reclaiming: bool = False


class Retention:
    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self._pass: Pass | None = None
        self._next_look: datetime | None = None  # not due before this, as far as this worker knows

    def work_once(self, worker: str) -> bool:
        """Start a pass when one is due, or take the next step of this worker's pass. True when it deleted or
        reclaimed something (the worker looks again at once), False when there was nothing to do."""
        settings = self.deps.settings.retention
        if not settings.enabled:
            return False
        now = self.deps.clock.now()
        if self._pass is None:
            if self._next_look is not None and now < self._next_look:
                return False
            self._next_look = now + timedelta(seconds=settings.interval_seconds)
            with self.deps.store.transaction() as conn:
                if not prunable.claim_pass(conn, now, self._next_look, worker):
                    return False
            self._pass = Pass(cutoffs(settings, now), now)
        if self._pass.reclaiming:
            return self._reclaim()
        run = self._pass
        while run.groups:
            if self._delete_batch(run, run.groups[0]):
                return True
            if self._pass is None:  # the export failed: the pass has ended
                return False
            run.groups.pop(0)
        self._finish(run)
        return False

    def _delete_batch(self, run: Pass, group: str) -> bool:
        """Export (when configured) and delete one batch of ``group``; False when none is left. An export that
        fails deletes nothing and ends the pass (the ledger says why; the next pass tries again)."""
        settings = self.deps.settings.retention
        try:
            with self.deps.store.transaction() as conn:
                ids = prunable.next_ids(conn, group, run.cut, settings.batch_rows, lock=True)
                if not ids:
                    return False
                if settings.export_dir:
                    found = prunable.batch(conn, group, ids)
                    write_export(Path(settings.export_dir), self.deps.clock.now(), found)
                counts = prunable.delete_batch(conn, group, ids)
        except OSError as exc:
            log.error("retention: export to %s failed, nothing deleted: %s", settings.export_dir, exc)
            with self.deps.store.transaction() as conn:
                transitions.retention_noted(
                    conn,
                    self.deps.clock.now(),
                    LedgerKind.RETENTION_EXPORT_FAILED,
                    f"retention stopped: writing the export to {settings.export_dir} failed ({exc}); "
                    "nothing deleted",
                    {"export_dir": settings.export_dir, "error": str(exc), "deleted": run.deleted},
                )
            self._pass = None
            return False
        for table, count in counts.items():
            run.deleted[table] = run.deleted.get(table, 0) + count
            self.deps.metrics.pruned_rows.labels(table).inc(count)
        return True

    def _finish(self, run: Pass) -> None:
        if not run.deleted:
            self._pass = None
            return
        total = sum(run.deleted.values())
        settings = self.deps.settings.retention
        message = (
            f"retention pruned {total} row(s): "
            + ", ".join(f"{table} {count}" for table, count in sorted(run.deleted.items()))
            + f" (incidents closed before {run.cut.incidents:%Y-%m-%d %H:%M}, alerts before "
            f"{run.cut.alerts:%Y-%m-%d %H:%M} UTC)"
        )
        data = {
            "deleted": dict(sorted(run.deleted.items())),
            "incidents_before": run.cut.incidents.isoformat(),
            "alerts_before": run.cut.alerts.isoformat(),
            "export_dir": settings.export_dir,
        }
        with self.deps.store.transaction() as conn:
            transitions.retention_noted(conn, self.deps.clock.now(), LedgerKind.RETENTION, message, data)
        run.reclaiming = True

    def _reclaim(self) -> bool:
        left = self.deps.store.reclaim(RECLAIM_PAGES)
        if left == 0:
            self._pass = None
        return left > 0


def export_path(directory: Path, now: datetime) -> Path:
    return directory / f"pruned-{now:%Y-%m-%d}.jsonl"


def write_export(directory: Path, now: datetime, found: prunable.Batch) -> None:
    """Append ``found`` to the day's export file and sync it to disk before the rows are deleted (an error here
    raises, and the transaction that would delete them rolls back)."""
    directory.mkdir(parents=True, exist_ok=True)
    with export_path(directory, now).open("a", encoding="utf-8") as out:
        for line in prunable.jsonl(found):
            out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())
