"""The inbox: the webhook commits each notification as received; the worker ingests it, a few alerts a transaction.

Answering Alertmanager costs one INSERT and one commit whatever the group's size, and the per-alert work (dedup,
match, incidents, ledger) happens in the worker, in transactions short enough that the webhook's commit never
waits long for SQLite's single write lock. Each transaction ingests the next ``batch`` alerts of the oldest
pending notification and advances its ``next_alert`` with them, so a crash between two batches resumes where it
stopped, and no alert is ingested twice. A notification whose ingestion raises (a bug, not an outage) is set aside
with its error (``failed_at``) and the queue moves on; ``nightshift inbox --retry`` puts it back.

Backpressure: a notification carrying a firing alert instance the store has not seen (a new Xid, a node going
down) goes in lane 0, one of pure repeats (Alertmanager re-sending a group) in lane 1, and the worker takes lane 0
first, so a new alert never waits behind a flood of repeats. A notification of repeats that would take the alerts
queued past ``webhook.max_inbox_alerts`` is refused (:class:`InboxFull`: the webhook answers 503 with Retry-After,
Alertmanager retries it later, nothing is lost); one carrying new alerts is still taken up to twice the bound. An
empty inbox takes any notification, so the queue never holds more than twice the bound (or one notification).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import Connection

from app.domain.alertmanager import Alert, Notification, parse_notification
from app.domain.errors import InboxFull, StoreUnavailable
from app.engine import transitions
from app.engine.deps import EngineDeps
from app.engine.ingest import IngestResult, ingest_alerts, prefetch_workloads, publish
from app.store import records
from app.wakeup import SOCKET_NAME, Wakeup

log = logging.getLogger(__name__)

NEW_ALERTS, REPEATS = 0, 1  # inbox lanes
RETRY_AFTER_SECONDS = 30  # what a refused sender is told (Alertmanager retries on its own backoff anyway)


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
        """Commit the notification as received and return its inbox id. Raises StoreUnavailable or, past the
        backlog bound, InboxFull (both → 503, retried by Alertmanager)."""
        deps = self.deps
        lane, new = self._lane(notification)
        with deps.store.transaction() as conn:
            inbox_id = records.enqueue_notification(
                conn,
                deps.clock.now(),
                notification.receiver,
                len(notification.alerts),
                body.decode("utf-8"),
                lane=lane,
                new_instances=new,
            )
        self.wakeup.set()
        firing = sum(alert.status == "firing" for alert in notification.alerts)
        deps.metrics.alerts_received.labels("firing").inc(firing)
        deps.metrics.alerts_received.labels("resolved").inc(len(notification.alerts) - firing)
        return inbox_id

    def _lane(self, notification: Notification) -> tuple[int, set[tuple[str, datetime]]]:
        """The notification's lane and its firing alert instances nobody has seen (in the store or carried by a
        queued notification); raises InboxFull when the backlog refuses it."""
        bound = self.deps.settings.webhook.max_inbox_alerts
        with self.deps.store.read() as conn:
            backlog = records.inbox_backlog(conn)
            firing = {(a.fingerprint, a.starts_at) for a in notification.alerts if a.status == "firing"}
            new = firing - records.known_instances(conn, firing)
        limit = 2 * bound if new else bound
        if backlog > 0 and backlog + len(notification.alerts) > limit:
            what = "new alerts" if new else "repeats only"
            raise InboxFull(
                f"inbox backlog of {backlog} alerts (webhook.max_inbox_alerts {bound}): notification of "
                f"{len(notification.alerts)} alert(s), {what}, refused; retry later",
                retry_after=RETRY_AFTER_SECONDS,
            )
        return (NEW_ALERTS, new) if new else (REPEATS, set())

    def ingest_next(self) -> IngestResult | None:
        """Ingest the next batch of the first pending notification (new alerts first, then the oldest): what it
        did, or None when the inbox is empty.

        A notification set aside gives an empty result."""
        deps = self.deps
        batch = deps.settings.worker.inbox_batch_alerts
        with deps.store.read() as conn:
            ahead = records.peek_inbox(conn)
            if ahead is None:
                return None
            upcoming = self._upcoming(conn, ahead, batch) if deps.workloads is not None else ()
        # The Kubernetes jobs of those alerts, looked up before the write transaction and outside the read: never a
        # network call inside a transaction. If another worker takes that notification meanwhile, the next one's
        # alerts are looked up on its own turn, and any not looked up are ingested on their labels alone.
        prefetch_workloads(deps, upcoming)
        result = IngestResult()
        inbox_id: int | None = None
        try:
            with deps.store.transaction() as conn:
                row = records.next_inbox(conn)
                if row is None:
                    return None  # another worker took the last one
                inbox_id = row["id"]
                notification = self._notification(inbox_id, row["alert_count"], lambda: row["body"])
                assert notification is not None  # the row, locked, holds its body
                start = row["next_alert"]
                chunk = notification.alerts[start : start + batch]
                ingest_alerts(deps, conn, notification, chunk, deps.clock.now(), result)
                records.ingested(conn, inbox_id, start, start + len(chunk), row["alert_count"])
        except StoreUnavailable:
            raise
        except Exception as exc:
            if inbox_id is None:
                raise
            self._set_aside(inbox_id, exc)
            return IngestResult()
        publish(deps, result)
        return result

    def _upcoming(self, conn: Connection, ahead: records.Row, batch: int) -> Sequence[Alert]:
        """The alerts of the next batch of the notification the look ahead found (none if it is gone since)."""
        inbox_id = ahead["id"]
        notification = self._notification(
            inbox_id, ahead["alert_count"], lambda: records.inbox_body(conn, inbox_id)
        )
        if notification is None:
            return ()  # ingested by another worker since the look ahead
        start = ahead["next_alert"]
        return notification.alerts[start : start + batch]

    def ingest_all(self) -> IngestResult:
        """Ingest until the inbox is empty (tests, tools): what every batch did, together."""
        total = IngestResult()
        while (result := self.ingest_next()) is not None:
            total.add(result)
        return total

    def _notification(
        self, inbox_id: int, alert_count: int, body: Callable[[], str | None]
    ) -> Notification | None:
        """The queued notification, parsed once for all its batches (``body`` is read only when it is not parsed
        yet; None: it is gone)."""
        with self._parsed_lock:
            if self._parsed is None or self._parsed.inbox_id != inbox_id:
                text = body()
                if text is None:
                    return None
                # Validated at the door already; the webhook's size limit does not apply twice.
                self._parsed = _Parsed(inbox_id, parse_notification(text, max_alerts=alert_count))
            return self._parsed.notification

    def _set_aside(self, inbox_id: int, exc: Exception) -> None:
        log.exception("inbox %d: ingestion failed; set aside", inbox_id)
        error = f"{type(exc).__name__}: {exc}"
        deps = self.deps
        with deps.store.transaction() as conn:
            transitions.inbox_set_aside(conn, deps.clock.now(), inbox_id, error)
