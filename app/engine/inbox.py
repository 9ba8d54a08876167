"""The inbox: the webhook commits each notification as received; the worker ingests them, a batch a transaction.

Answering Alertmanager costs one transaction whatever the group's size (the backlog's check, the body, the new
instances it carries), and the per-alert work (dedup, match, incidents, ledger) happens in the worker, in
transactions short enough that the webhook's commit never waits long for SQLite's single write lock. Each
transaction ingests the next ``worker.inbox_batch_alerts`` alerts of the queue (:func:`take`: the next
notifications of one lane while they fit whole, or the next alerts of one larger than a batch) and advances each
one's ``next_alert`` with them, so a crash between two batches resumes where it stopped, and no alert is ingested
twice. A batch that raises is rolled back and its first notification ingested alone; a notification whose
ingestion raises (a bug, not an outage) is set aside with its error (``failed_at``) and the queue moves on;
``nightshift inbox --retry`` puts it back. A notification this process accepted reaches its own worker thread as
parsed at the door (``serve`` with its embedded worker; bounded by :data:`MAX_HANDED_OVER_ALERTS`); a worker in
another process reads and parses the body.

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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
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
# Alerts of accepted notifications kept parsed for this process's worker (about 1 KiB each).
MAX_HANDED_OVER_ALERTS = 10_000
RETRY_AFTER_SECONDS = 30  # what a refused sender is told (Alertmanager retries on its own backoff anyway)


@dataclass(frozen=True)
class _Portion:
    """The alerts ``start`` to ``end`` of a queued notification that one batch ingests."""

    inbox_id: int
    start: int
    end: int
    alert_count: int


def take(queued: Sequence[records.Row], batch: int) -> list[_Portion]:
    """What one transaction ingests of the queue's head (as :func:`records.next_inbox` orders it): the first
    notification's next ``batch`` alerts and, while they fit, the next notifications of the same lane whole (a batch
    never mixes the lanes: new alerts go before every repeat, not beside them)."""
    portions: list[_Portion] = []
    room = batch
    for row in queued:
        if portions and (row["lane"] != queued[0]["lane"] or row["alert_count"] - row["next_alert"] > room):
            break
        start = row["next_alert"]
        end = min(row["alert_count"], start + room)
        portions.append(_Portion(row["id"], start, end, row["alert_count"]))
        room -= end - start
        if room <= 0:
            break
    return portions


class Inbox:
    """Accepts notifications (the webhook) and ingests them (the worker). ``wakeup`` is set on every accept: it wakes
    this process's worker threads, and a ``nightshift worker`` process on the same host."""

    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self.wakeup = Wakeup(Path(deps.settings.data_dir) / SOCKET_NAME)
        # The notifications of the batch being ingested, parsed once for all their batches (the look ahead's and
        # the transaction's; one worker thread per process): a notification larger than a batch stays here.
        self._parsed: dict[int, Notification] = {}
        self._parsed_lock = threading.Lock()
        # Notifications this process accepted, as parsed at the door, for its own worker thread (``serve`` with its
        # embedded worker): spared reading and parsing their bodies again. Bounded; a worker in another process
        # (another gunicorn worker, ``nightshift worker``) reads the body.
        self._accepted: OrderedDict[int, Notification] = OrderedDict()
        self._accepted_alerts = 0
        self._hand_over = deps.settings.embedded_worker

    def accept(self, notification: Notification, body: bytes) -> int:
        """Commit the notification as received and return its inbox id, in one transaction. Raises StoreUnavailable
        or, past the backlog bound, InboxFull (both → 503, retried by Alertmanager; nothing is written)."""
        deps = self.deps
        firing = {(a.fingerprint, a.starts_at) for a in notification.alerts if a.status == "firing"}
        with deps.store.transaction() as conn:
            new = firing - records.known_instances(conn, firing)
            self._admit(records.inbox_backlog(conn), notification, bool(new))
            inbox_id = records.enqueue_notification(
                conn,
                deps.clock.now(),
                notification.receiver,
                len(notification.alerts),
                body.decode("utf-8"),
                lane=NEW_ALERTS if new else REPEATS,
                new_instances=new,
            )
        if self._hand_over:
            self._keep(inbox_id, notification)
        self.wakeup.set()
        firing_alerts = sum(alert.status == "firing" for alert in notification.alerts)
        deps.metrics.alerts_received.labels("firing").inc(firing_alerts)
        deps.metrics.alerts_received.labels("resolved").inc(len(notification.alerts) - firing_alerts)
        return inbox_id

    def _admit(self, backlog: int, notification: Notification, new: bool) -> None:
        """Raise InboxFull when the backlog refuses the notification (``new``: it carries firing alert instances
        nobody has seen, in the store or carried by a queued notification)."""
        bound = self.deps.settings.webhook.max_inbox_alerts
        limit = 2 * bound if new else bound
        if backlog > 0 and backlog + len(notification.alerts) > limit:
            what = "new alerts" if new else "repeats only"
            raise InboxFull(
                f"inbox backlog of {backlog} alerts (webhook.max_inbox_alerts {bound}): notification of "
                f"{len(notification.alerts)} alert(s), {what}, refused; retry later",
                retry_after=RETRY_AFTER_SECONDS,
            )

    def ingest_next(self) -> IngestResult | None:
        """Ingest the next batch of the queue (new alerts first, then the oldest; several notifications when they
        fit in ``worker.inbox_batch_alerts``): what it did, or None when the inbox is empty.

        A notification set aside gives an empty result."""
        return self._ingest(self.deps.settings.worker.inbox_batch_alerts)

    def _ingest(self, notifications: int) -> IngestResult | None:
        """Ingest the alerts :func:`take` takes of the first ``notifications`` queued. A batch that raises is rolled
        back and its first notification ingested alone; one notification that raises is set aside."""
        deps = self.deps
        batch = deps.settings.worker.inbox_batch_alerts
        with deps.store.read() as conn:
            ahead = take(records.peek_inbox(conn, notifications), batch)
            if not ahead:
                return None
            upcoming = [a for _, a in self._alerts(conn, ahead)] if deps.workloads is not None else []
        # The Kubernetes jobs of those alerts, looked up before the write transaction and outside the read: never a
        # network call inside a transaction. If another worker takes those notifications meanwhile, the next ones'
        # alerts are looked up on their own turn, and any not looked up are ingested on their labels alone.
        prefetch_workloads(deps, upcoming)
        result = IngestResult()
        portions: list[_Portion] = []
        try:
            with deps.store.transaction() as conn:
                portions = take(records.next_inbox(conn, notifications), batch)
                if not portions:
                    return None  # another worker took the last ones
                entries = self._alerts(conn, portions)
                ingest_alerts(deps, conn, entries, deps.clock.now(), result)
                records.ingested(conn, [(p.inbox_id, p.start, p.end, p.alert_count) for p in portions])
        except StoreUnavailable:
            raise
        except Exception as exc:
            if len(portions) > 1:
                log.warning(
                    "inbox: a batch of %d notifications failed (%s); the first alone", len(portions), exc
                )
                return self._ingest(1)
            if not portions:
                raise
            self._set_aside(portions[0].inbox_id, exc)
            return IngestResult()
        publish(deps, result)
        return result

    def _alerts(self, conn: Connection, portions: Sequence[_Portion]) -> list[tuple[Notification, Alert]]:
        """The portions' alerts, each with its notification (a notification gone since it was queued: none)."""
        notifications = self._notifications(conn, portions)
        return [
            (notifications[p.inbox_id], alert)
            for p in portions
            if p.inbox_id in notifications
            for alert in notifications[p.inbox_id].alerts[p.start : p.end]
        ]

    def ingest_all(self) -> IngestResult:
        """Ingest until the inbox is empty (tests, tools): what every batch did, together."""
        total = IngestResult()
        while (result := self.ingest_next()) is not None:
            total.add(result)
        return total

    def _notifications(self, conn: Connection, portions: Sequence[_Portion]) -> dict[int, Notification]:
        """The portions' notifications, parsed once for the look ahead and the transaction, and for all the batches
        of one larger than a batch (a body is read only when it is not parsed yet; one gone is left out). The parses
        of earlier batches are forgotten."""
        with self._parsed_lock:
            wanted = [p.inbox_id for p in portions]
            for inbox_id in wanted:
                handed = self._accepted.pop(inbox_id, None)
                if handed is not None:
                    self._accepted_alerts -= len(handed.alerts)
                    self._parsed.setdefault(inbox_id, handed)
            missing = [inbox_id for inbox_id in wanted if inbox_id not in self._parsed]
            counts = {p.inbox_id: p.alert_count for p in portions}
            for inbox_id, text in records.inbox_bodies(conn, missing).items() if missing else ():
                # Validated at the door already; the webhook's size limit does not apply twice.
                self._parsed[inbox_id] = parse_notification(text, max_alerts=counts[inbox_id])
            self._parsed = {
                inbox_id: self._parsed[inbox_id] for inbox_id in wanted if inbox_id in self._parsed
            }
            return dict(self._parsed)

    def _keep(self, inbox_id: int, notification: Notification) -> None:
        """Hand an accepted notification to this process's worker (the oldest are let go past
        :data:`MAX_HANDED_OVER_ALERTS`)."""
        with self._parsed_lock:
            self._accepted[inbox_id] = notification
            self._accepted_alerts += len(notification.alerts)
            while self._accepted_alerts > MAX_HANDED_OVER_ALERTS:
                _, dropped = self._accepted.popitem(last=False)
                self._accepted_alerts -= len(dropped.alerts)

    def _set_aside(self, inbox_id: int, exc: Exception) -> None:
        log.exception("inbox %d: ingestion failed; set aside", inbox_id)
        error = f"{type(exc).__name__}: {exc}"
        deps = self.deps
        with deps.store.transaction() as conn:
            transitions.inbox_set_aside(conn, deps.clock.now(), inbox_id, error)
