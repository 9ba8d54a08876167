"""Query functions over ``ui_sessions``: UI logins that the server can end (logout, expiry). No decisions here."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, insert, select, update

from app.store.schema import ui_sessions

Row = dict[str, object]


def insert_session(
    conn: Connection, session_hash: str, name: str, role: str, now: datetime, expires_at: datetime
) -> None:
    conn.execute(
        insert(ui_sessions).values(
            id=session_hash, name=name, role=role, created_at=now, expires_at=expires_at, revoked_at=None
        )
    )


def live_session(conn: Connection, session_hash: str, now: datetime) -> Row | None:
    """The session row when it exists, is not revoked and has not expired at ``now``; else None."""
    row = conn.execute(
        select(ui_sessions).where(
            ui_sessions.c.id == session_hash,
            ui_sessions.c.revoked_at.is_(None),
            ui_sessions.c.expires_at > now,
        )
    ).first()
    return dict(row._mapping) if row is not None else None


def revoke_session(conn: Connection, session_hash: str, now: datetime) -> None:
    conn.execute(
        update(ui_sessions)
        .where(ui_sessions.c.id == session_hash, ui_sessions.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )


def purge_sessions(conn: Connection, now: datetime) -> int:
    """Delete sessions expired before ``now`` (revoked ones go once expired too): the table stays small."""
    return conn.execute(delete(ui_sessions).where(ui_sessions.c.expires_at <= now)).rowcount
