"""The inbox: the webhook commits each notification as received; the worker ingests it, a few alerts a transaction.

Answering Alertmanager costs one INSERT and one commit whatever the group's size, and the per-alert work (dedup,
match, incidents, ledger) happens in the worker, in transactions short enough that the webhook's commit never
waits long for SQLite's single write lock. Each transaction ingests the next ``batch`` alerts of the oldest
pending notification and advances its ``next_alert`` with them, so a crash between two batches resumes where it
stopped, and no alert is ingested twice. A notification whose ingestion raises (a bug, not an outage) is set aside
with its error (``failed_at``) and the queue moves on; ``nightshift inbox --retry`` puts it back.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from app.alertmanager import Notification, parse_notification
from app.engine.deps import EngineDeps
from app.engine.ingest import IngestResult, ingest_alerts, prefetch_workloads, publish
from app.errors import StoreUnavailable
from app.store import records
from app.wakeup import SOCKET_NAME, Wakeup

log = logging.getLogger(__name__)


@dataclass
class _Parsed:
    inbox_id: int
    notification: Notification


class Inbox:
    """Accepts notifications (the webhook) and ingests them (the worker). ``wakeup`` is set on every accept: it wakes
    this process's worker threads, and a ``nightshift worker`` process on the same host."""

    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self.wakeup = Wakeup(Path(deps.settings.data_dir) / SOCKET_NAME)
        # The notification being ingested, parsed once for all its batches (one worker thread per process).
        self._parsed: _Parsed | None = None
        self._parsed_lock = threading.Lock()

    def accept(self, notification: Notification, body: bytes) -> int:
        """Commit the notification as received and return its inbox id. Raises StoreUnavailable (→ 503)."""
        deps = self.deps
        with deps.store.transaction() as conn:
            inbox_id = records.enqueue_notification(
                conn, deps.clock.now(), notification.receiver, len(notification.alerts), body.decode("utf-8")
            )
        self.wakeup.set()
        firing = sum(alert.status == "firing" for alert in notification.alerts)
        deps.metrics.alerts_received.labels("firing").inc(firing)
        deps.metrics.alerts_received.labels("resolved").inc(len(notification.alerts) - firing)
        return inbox_id

    def ingest_next(self) -> IngestResult | None:
        """Ingest the next batch of the oldest pending notification: what it did, or None when the inbox is empty.

        A notification set aside gives an empty result."""
        deps = self.deps
        with deps.store.read() as conn:
            if not records.inbox_pending(conn):
                return None
        batch = deps.settings.worker.inbox_batch_alerts
        self._prefetch(batch)
        result = IngestResult()
        inbox_id: int | None = None
        try:
            with deps.store.transaction() as conn:
                row = records.next_inbox(conn)
                if row is None:
                    return None  # another worker took the last one
                inbox_id = row["id"]
                notification = self._notification(row)
                start = row["next_alert"]
                chunk = notification.alerts[start : start + batch]
                ingest_alerts(deps, conn, notification, chunk, deps.clock.now(), result)
                done = start + len(chunk)
                if done >= len(notification.alerts):
                    records.delete_inbox(conn, inbox_id)
                else:
                    records.advance_inbox(conn, inbox_id, done)
        except StoreUnavailable:
            raise
        except Exception as exc:
            if inbox_id is None:
                raise
            self._set_aside(inbox_id, exc)
            return IngestResult()
        publish(deps, result)
        return result

    def _prefetch(self, batch: int) -> None:
        """Look up the Kubernetes jobs of the next batch's alerts outside the transaction (a read of the inbox
        row; if another worker takes it meanwhile, the next row's alerts are looked up on its own turn, and any not
        looked up are ingested on their labels alone)."""
        if self.deps.workloads is None:
            return
        with self.deps.store.read() as conn:
            row = records.peek_inbox(conn)
        if row is not None:
            start = row["next_alert"]
            prefetch_workloads(self.deps, self._notification(row).alerts[start : start + batch])

    def ingest_all(self) -> IngestResult:
        """Ingest until the inbox is empty (tests, tools): what every batch did, together."""
        total = IngestResult()
        while (result := self.ingest_next()) is not None:
            total.add(result)
        return total

    def _notification(self, row: records.Row) -> Notification:
        with self._parsed_lock:
            if self._parsed is None or self._parsed.inbox_id != row["id"]:
                # Validated at the door already; the webhook's size limit does not apply twice.
                self._parsed = _Parsed(
                    row["id"], parse_notification(row["body"], max_alerts=row["alert_count"])
                )
            return self._parsed.notification

    def _set_aside(self, inbox_id: int, exc: Exception) -> None:
        log.exception("inbox %d: ingestion failed; set aside", inbox_id)
        error = f"{type(exc).__name__}: {exc}"
        deps = self.deps
        with deps.store.transaction() as conn:
            now = deps.clock.now()
            records.fail_inbox(conn, inbox_id, now, error)
            records.record(
                conn,
                now,
                "inbox_failed",
                f"notification {inbox_id} could not be ingested and is set aside: {error}",
                data={"inbox_id": inbox_id, "error": error},
            )
