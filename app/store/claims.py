"""Claims on the worker's queues (incidents, node repairs): one mechanism for both.

A row is due when its ``next_run_at`` has passed and no live worker holds it (``claim_expires_at`` in the past or
unset). A worker claims the most overdue due row (``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite
serialises writers), renews its lease while a step runs (:func:`app.engine.claims.kept`), and releases it, with the
row's next look or leaving the schedule its tick wrote. Whatever changes a row from outside its worker while it may
be held (a culprit joins, its alerts resolve, an operator approves or releases) pokes it (``poked``): the release
then schedules it now, whatever the tick decided on the row as it had read it (a lost update otherwise). Statements
are built once per queue with bound parameters (the idle worker asks :meth:`Queue.any_due` on every poll).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, Table, and_, bindparam, case, or_, select, update

from app.store.schema import UtcDateTime, incidents, node_repairs


class Queue:
    """The claim statements of one table with ``id``, ``next_run_at``, ``claimed_by`` and ``claim_expires_at``."""

    def __init__(self, table: Table):
        c = table.c
        now = bindparam("now_", type_=UtcDateTime())
        due = and_(
            c.next_run_at.is_not(None),
            c.next_run_at <= now,
            or_(c.claim_expires_at.is_(None), c.claim_expires_at < now),
        )
        mine = and_(c.id == bindparam("id_"), c.claimed_by == bindparam("worker_"))
        until = bindparam("until_", type_=UtcDateTime())
        self.name = table.name
        self._any_due = select(c.id).where(due).limit(1)
        self._candidate = (
            select(c.id).where(due).order_by(c.next_run_at).limit(1).with_for_update(skip_locked=True)
        )
        self._claim = update(table).where(c.id == bindparam("id_"), due).values(claimed_by=bindparam("worker_"),
                                                                                 claim_expires_at=until,
                                                                                 poked=False)  # fmt: skip
        self._renew = update(table).where(mine).values(claim_expires_at=until)
        self._release = (
            update(table)
            .where(mine)
            .values(
                claimed_by=None,
                claim_expires_at=None,
                next_run_at=case((c.poked, now), else_=c.next_run_at),
                poked=False,
            )
        )
        self._release_to = (
            update(table)
            .where(mine)
            .values(
                claimed_by=None,
                claim_expires_at=None,
                next_run_at=case((c.poked, now), else_=bindparam("next_run_at_", type_=UtcDateTime())),
                poked=False,
            )
        )
        self._poke = update(table).where(c.id == bindparam("id_")).values(next_run_at=now, poked=True)

    def any_due(self, conn: Connection, now: datetime) -> bool:
        """Whether a row is due and unclaimed: a cheap read that spares idle workers a write transaction."""
        return conn.execute(self._any_due, {"now_": now}).first() is not None

    def claim_next(self, conn: Connection, worker: str, now: datetime, lease: timedelta) -> int | None:
        """Claim the most overdue row no live worker holds, for ``lease``. Its id, or None when none is due."""
        candidate = conn.execute(self._candidate, {"now_": now}).first()
        if candidate is None:
            return None
        claimed = conn.execute(
            self._claim, {"id_": candidate.id, "now_": now, "worker_": worker, "until_": now + lease}
        )
        return int(candidate.id) if claimed.rowcount == 1 else None

    def renew(self, conn: Connection, row_id: int, worker: str, until: datetime) -> bool:
        """Extend ``worker``'s claim to ``until``; False when it holds the row no longer."""
        return conn.execute(self._renew, {"id_": row_id, "worker_": worker, "until_": until}).rowcount == 1

    def release(self, conn: Connection, row_id: int, worker: str, now: datetime) -> None:
        """Give the row up, leaving the schedule its tick wrote (``now`` if it was poked meanwhile)."""
        conn.execute(self._release, {"id_": row_id, "worker_": worker, "now_": now})

    def release_to(
        self, conn: Connection, row_id: int, worker: str, next_run_at: datetime | None, now: datetime
    ) -> None:
        """Give the row up, due again at ``next_run_at`` (None: not due until something schedules it; ``now`` if
        it was poked meanwhile)."""
        conn.execute(
            self._release_to, {"id_": row_id, "worker_": worker, "next_run_at_": next_run_at, "now_": now}
        )

    def poke(self, conn: Connection, row_id: int, now: datetime) -> None:
        """Look at the row now: it changed from outside its worker (one holding it looks again when it lets go)."""
        conn.execute(self._poke, {"id_": row_id, "now_": now})


INCIDENTS = Queue(incidents)
REPAIRS = Queue(node_repairs)
