"""The durable store: SQLAlchemy 2 Core on SQLite (WAL, default) or PostgreSQL (HA replicas).

``Store`` owns the engine and transactions and translates driver errors into :class:`app.domain.errors.StoreUnavailable`
once; the query functions live in :mod:`app.store.records`, each taking an open connection so that the engine can
compose them into one transaction.

Every wait for the store is bounded (``StoreSettings``): the writer lock and SQLite's busy handler by
``lock_timeout_seconds``, and on PostgreSQL ``lock_timeout`` (a row or table lock another connection holds), the
connection pool's wait, ``connect_timeout`` and ``statement_timeout``. Each ends in StoreUnavailable, which the webhook
answers 503 and the worker backs off from.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, DefaultClause, create_engine, event, func, insert, inspect, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.config import StoreSettings
from app.domain.clock import Clock, SystemClock
from app.domain.errors import ConfigError, StoreUnavailable
from app.store.schema import (
    ADDED_COLUMNS,
    ADDED_INDEXES,
    SCHEMA_VERSION,
    inbox,
    inbox_counter,
    metadata,
    schema_version,
    store_probe,
)
from app.store.writer_lock import WriterLock

log = logging.getLogger(__name__)

# The worker finishes a checkpoint under the writer lock once the log holds this many pages (SQLite's own default
# threshold); SQLite checkpoints itself, inside a commit, only past the backstop (40 MiB at 4 KiB pages).
WAL_RESTART_PAGES = 1_000
WAL_AUTOCHECKPOINT_PAGES = 10_000
# A file-backed store is not ready with less free space than this beside the database: SQLite reuses a log it has
# started over, so a small write may still succeed on a full disk while the next burst of alerts cannot grow the log.
MIN_FREE_BYTES = 16 * 1024 * 1024
PG_CONNECT_TIMEOUT_S = 5
PG_POOL_SIZE = 5  # connections per process, and as many again past it while busy (max_overflow)


class Store:
    """Connections and transactions; schema creation and version check."""

    def __init__(
        self,
        engine: Engine,
        clock: Clock | None = None,
        writer_lock: Path | None = None,
        lock_timeout_s: float = StoreSettings.lock_timeout_seconds,
    ):
        """``writer_lock``: the file that queues writers across processes (SQLite on a file; see WriterLock), which
        a writer waits for at most ``lock_timeout_s``."""
        self.engine = engine
        self.clock = clock or SystemClock()
        self.dialect = engine.dialect.name
        self._writers: AbstractContextManager[Any] = nullcontext()
        if self.dialect == "sqlite":  # writer_lock None: in memory, one process, threads only
            self._writers = WriterLock(writer_lock, lock_timeout_s)
        self._free_space_dir = writer_lock.parent if writer_lock is not None else None
        self._last_checkpoint: float | None = None  # monotonic; None: never (monotonic time may start near 0)

    @classmethod
    def unread(cls) -> Store:
        """A store nobody reads or writes: in memory, with no schema (``nightshift explain`` decides with an empty
        history and writes nothing; a query on it fails)."""
        return cls(create_engine("sqlite://"))

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None, settings: StoreSettings | None = None) -> Store:
        settings = settings or StoreSettings()
        lock_timeout = settings.lock_timeout_seconds
        if url.startswith("sqlite"):
            db_path = url.split("///", 1)[-1]
            writer_lock = None
            if db_path and db_path != ":memory:":
                Path(db_path).parent.mkdir(parents=True, exist_ok=True)
                writer_lock = Path(f"{db_path}-writer.lock")
            engine = create_engine(
                url,
                connect_args={"timeout": lock_timeout, "check_same_thread": False},  # busy handler
                pool_timeout=lock_timeout,
            )
            _configure_sqlite(engine)
            return cls(engine, clock, writer_lock, lock_timeout)
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        options = (
            f"-c lock_timeout={round(lock_timeout * 1000)} "
            f"-c statement_timeout={round(settings.statement_timeout_seconds * 1000)}"
        )
        engine = create_engine(
            url,
            pool_pre_ping=True,
            pool_size=PG_POOL_SIZE,
            max_overflow=PG_POOL_SIZE,
            pool_timeout=lock_timeout,
            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S, "options": options},
        )
        return cls(engine, clock, lock_timeout_s=lock_timeout)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One atomic unit of work that may write; driver-level outages surface as StoreUnavailable."""
        with self._writers, _translated(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A consistent read-only snapshot. On SQLite it does not queue behind writers (WAL readers never block)."""
        with _translated(), self.engine.connect() as conn:
            conn.execution_options(nightshift_read_only=True)
            with conn.begin():
                yield conn

    def create_schema(self) -> None:
        """Create missing tables and record the schema version; refuse a store written by a newer version."""
        with self.transaction() as conn:
            metadata.create_all(conn)
            found = conn.execute(
                select(schema_version.c.version).order_by(schema_version.c.version.desc())
            ).first()
            if found is None:
                conn.execute(
                    insert(schema_version).values(version=SCHEMA_VERSION, applied_at=self.clock.now())
                )
            elif found.version > SCHEMA_VERSION:
                raise ConfigError(
                    f"store schema version {found.version} is newer than this Nightshift ({SCHEMA_VERSION}); upgrade"
                )
            elif found.version < SCHEMA_VERSION:
                # New tables come from create_all above; new columns and indexes of existing tables are added here.
                _add_columns(conn, found.version)
                _add_indexes(conn, found.version)
                conn.execute(
                    insert(schema_version).values(version=SCHEMA_VERSION, applied_at=self.clock.now())
                )
            _count_backlog(conn)

    def checkpoint(self, min_interval_s: float = 0.1) -> None:
        """Copy SQLite's write-ahead log into the database, at most once every ``min_interval_s`` (PostgreSQL:
        nothing to do). The worker calls this, so that the webhook's commits do not.

        SQLite's own checkpoint runs inside whichever commit pushes the log past its threshold, holding the write
        lock. Here a passive checkpoint first copies what it can outside the writer lock, blocking nobody; writers
        keep appending meanwhile, so it rarely finishes, and a log it cannot finish would only grow. Once the log
        holds ``WAL_RESTART_PAGES``, a second pass under the writer lock copies the remainder, and the next writer
        starts the log over. ``wal_autocheckpoint`` stays as a backstop for a store with no worker.
        """
        now = time.monotonic()
        if self.dialect != "sqlite" or (
            self._last_checkpoint is not None and now - self._last_checkpoint < min_interval_s
        ):
            return
        self._last_checkpoint = now
        if self._passive_checkpoint() >= WAL_RESTART_PAGES:
            with self._writers:
                self._passive_checkpoint()

    def _passive_checkpoint(self) -> int:
        """One ``PRAGMA wal_checkpoint(PASSIVE)``; the log's size in pages (0 when it failed)."""
        with _translated():
            raw = self.engine.raw_connection()  # outside a transaction: a BEGIN would take the write lock
        try:
            assert raw.driver_connection is not None  # a pooled connection, just checked out
            _busy, log_pages, _copied = raw.driver_connection.execute(
                "PRAGMA wal_checkpoint(PASSIVE)"
            ).fetchone()
            return int(log_pages)
        except sqlite3.Error as exc:  # housekeeping: the next one, or SQLite's own, catches up
            log.warning("store: WAL checkpoint failed: %s", exc)
            return 0
        finally:
            raw.close()

    def auto_vacuum(self) -> str | None:
        """SQLite's auto_vacuum mode (``none``, ``full``, ``incremental``); None on PostgreSQL. A database created
        before Nightshift set ``incremental`` keeps ``none`` until a VACUUM (docs/reliability.md, "Retention")."""
        if self.dialect != "sqlite":
            return None
        with self.read() as conn:
            mode = conn.exec_driver_sql("PRAGMA auto_vacuum").scalar_one()
        return {0: "none", 1: "full", 2: "incremental"}.get(int(mode), str(mode))

    def reclaim(self, max_pages: int) -> int:
        """SQLite in incremental auto-vacuum: hand up to ``max_pages`` free pages (left by deletions) back to the
        file system, under the writer lock; returns the free pages left. Elsewhere 0: PostgreSQL's autovacuum
        makes dead rows' space reusable, and SQLite without it reuses free pages without shrinking the file."""
        if self.dialect != "sqlite":
            return 0
        with _translated():
            raw = self.engine.raw_connection()
        try:
            driver = raw.driver_connection
            assert driver is not None  # a pooled connection, just checked out
            if driver.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
                return 0
            with self._writers:
                # One step of the statement frees one page and yields a row that Python's sqlite3 does not
                # fetch; executescript steps it to the end (autocommit: its own write transaction).
                driver.executescript(f"PRAGMA incremental_vacuum({int(max_pages)});")
            return int(driver.execute("PRAGMA freelist_count").fetchone()[0])
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        finally:
            raw.close()

    def check_writable(self) -> None:
        """Commit one small write (the ``store_probe`` row), as any writer would, within the same bounded waits;
        on SQLite on a file, also refuse when the disk beside it is (nearly) full. StoreUnavailable says why."""
        if self._free_space_dir is not None:
            try:
                fs = os.statvfs(self._free_space_dir)
            except OSError as exc:
                raise StoreUnavailable(f"store unavailable: {self._free_space_dir}: {exc.strerror}") from exc
            free = fs.f_bavail * fs.f_frsize
            if free < MIN_FREE_BYTES:
                raise StoreUnavailable(
                    f"store cannot write: {free} bytes free in {self._free_space_dir} (needs {MIN_FREE_BYTES})"
                )
        upsert = (postgresql.insert if self.dialect == "postgresql" else sqlite.insert)(store_probe)
        now = self.clock.now()
        with self.transaction() as conn:
            conn.execute(
                upsert.values(id=1, written_at=now).on_conflict_do_update(
                    index_elements=[store_probe.c.id], set_={"written_at": now}
                )
            )

    def dispose(self) -> None:
        self.engine.dispose()


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except OperationalError as exc:
        raise StoreUnavailable(f"store unavailable: {_first_line(exc)}") from exc
    except PoolTimeout as exc:
        raise StoreUnavailable(f"store busy: no free connection: {_first_line(exc)}") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailable(f"store connection lost: {_first_line(exc)}") from exc
        raise


def _configure_sqlite(engine: Engine) -> None:
    """WAL for concurrent readers; writers BEGIN IMMEDIATE so that two writers queue instead of failing to upgrade."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        # Before anything creates a table: a new database gives the pages retention frees back to the file system
        # (Store.reclaim); an existing one keeps its mode (switching it needs a VACUUM: docs/reliability.md).
        cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        read_only = conn.get_execution_options().get("nightshift_read_only", False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _first_line(exc: Exception) -> str:
    return str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# The alerts a queue holds and has not ingested (set-aside notifications not counted), summed from its index.
BACKLOG_SUM = select(func.coalesce(func.sum(inbox.c.alert_count - inbox.c.next_alert), 0)).where(
    inbox.c.failed_at.is_(None)
)


def _count_backlog(conn: Connection) -> None:
    """Create the backlog's counter where it is missing (a new store, or one older than version 12), holding what
    is queued."""
    if conn.execute(select(inbox_counter.c.id)).first() is None:
        queued = conn.execute(BACKLOG_SUM).scalar_one()
        try:
            with conn.begin_nested():
                conn.execute(insert(inbox_counter).values(id=1, alerts=queued))
        except IntegrityError:
            pass  # another replica starting at the same time created it


def _add_indexes(conn: Connection, from_version: int) -> None:
    """CREATE INDEX for every index added to an existing table after ``from_version`` (where it is missing)."""
    for version, names in sorted(ADDED_INDEXES.items()):
        if version <= from_version:
            continue
        for name in names:
            index = next(i for table in metadata.tables.values() for i in table.indexes if i.name == name)
            index.create(conn, checkfirst=True)


def _add_columns(conn: Connection, from_version: int) -> None:
    """ALTER TABLE ... ADD COLUMN for every column added to an existing table after ``from_version``."""
    dialect = conn.dialect
    inspector = inspect(conn)
    for version, columns in sorted(ADDED_COLUMNS.items()):
        if version <= from_version:
            continue
        for table_name, column_name in columns:
            if column_name in {c["name"] for c in inspector.get_columns(table_name)}:
                continue  # created with the table by create_all just now
            column = metadata.tables[table_name].c[column_name]
            ddl = f"ALTER TABLE {table_name} ADD COLUMN {column_name} {column.type.compile(dialect=dialect)}"
            if isinstance(column.server_default, DefaultClause):
                ddl += f" NOT NULL DEFAULT '{column.server_default.arg}'"
            conn.execute(text(ddl))
