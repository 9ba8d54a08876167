"""SQLite specifics of the store: writers queue across processes (WriterLock), the worker's WAL checkpoints."""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

from sqlalchemy import text

from app.store import WAL_RESTART_PAGES, Store
from app.store.writer_lock import WriterLock

HOLD_UNTIL_STDIN_CLOSES = """
import sys
from pathlib import Path
from app.store.writer_lock import WriterLock
with WriterLock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def _enter_in_thread(lock: WriterLock) -> tuple[threading.Event, threading.Thread]:
    entered = threading.Event()

    def enter() -> None:
        with lock:
            entered.set()

    thread = threading.Thread(target=enter, daemon=True)
    thread.start()
    return entered, thread


def test_writer_lock_makes_another_process_wait_until_released(tmp_path: Path) -> None:
    path = tmp_path / "db-writer.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_UNTIL_STDIN_CLOSES, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        entered, thread = _enter_in_thread(WriterLock(path))
        assert not entered.wait(0.3), "entered while another process held the lock"
        assert holder.stdin is not None
        holder.stdin.close()
        assert entered.wait(10), "still waiting after the other process released the lock"
        thread.join(5)
    finally:
        holder.kill()
        holder.wait()


def test_a_forked_child_does_not_share_the_parents_lock(tmp_path: Path) -> None:
    """flock belongs to the open file; a child using its parent's descriptor would walk through the lock."""
    lock = WriterLock(tmp_path / "db-writer.lock")
    fork = multiprocessing.get_context("fork")
    with lock:
        parent_end, child_end = fork.Pipe()
        child = fork.Process(target=_child_tries_inherited, args=(lock, child_end))
        child.start()
        assert parent_end.poll(10)
        assert parent_end.recv() is False, "the forked child entered while the parent held the lock"
    child.join(10)


def _child_tries_inherited(lock: WriterLock, conn: multiprocessing.connection.Connection) -> None:
    # The parent holds `lock` (its threading.Lock too, copied held): a fresh thread lock, the inherited flock state.
    lock._threads = threading.Lock()
    entered, _ = _enter_in_thread(lock)
    conn.send(entered.wait(0.3))


def test_threads_of_one_process_queue_on_the_lock(tmp_path: Path) -> None:
    lock = WriterLock(tmp_path / "db-writer.lock")
    with lock:
        entered, thread = _enter_in_thread(lock)
        assert not entered.wait(0.2)
    assert entered.wait(5)
    thread.join(5)


def test_a_file_store_queues_writers_on_a_lock_file_beside_the_database(tmp_path: Path) -> None:
    store = Store.from_url(f"sqlite:///{tmp_path / 'nightshift.db'}")
    store.create_schema()
    assert (tmp_path / "nightshift.db-writer.lock").exists()
    assert (tmp_path / "nightshift.db-writer.lock").stat().st_mode & 0o777 == 0o600


def _store_with_probe_table(tmp_path: Path) -> tuple[Store, Path]:
    db = tmp_path / "nightshift.db"
    store = Store.from_url(f"sqlite:///{db}")
    with store.transaction() as conn:
        conn.execute(text("CREATE TABLE probe (n INTEGER)"))
    return store, db


def _row_count_in_main_file(db: Path, copy: Path) -> int:
    """Rows of ``probe`` that have reached the database file itself (a copy without its -wal file)."""
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as conn:
        return conn.execute("SELECT count(*) FROM probe").fetchone()[0]


def test_checkpoint_copies_the_log_into_the_database(tmp_path: Path) -> None:
    store, db = _store_with_probe_table(tmp_path)
    store.checkpoint(min_interval_s=0)
    with store.transaction() as conn:
        conn.execute(text("INSERT INTO probe VALUES (1), (2), (3)"))
    assert _row_count_in_main_file(db, tmp_path / "before.db") == 0  # still only in the log
    store.checkpoint(min_interval_s=0)
    assert _row_count_in_main_file(db, tmp_path / "after.db") == 3


def test_checkpoint_runs_at_most_once_per_interval(tmp_path: Path) -> None:
    store, db = _store_with_probe_table(tmp_path)
    store.checkpoint(min_interval_s=3600)
    with store.transaction() as conn:
        conn.execute(text("INSERT INTO probe VALUES (1)"))
    store.checkpoint(min_interval_s=3600)
    assert _row_count_in_main_file(db, tmp_path / "copy.db") == 0


def test_checkpoint_neither_waits_for_nor_blocks_a_writer(tmp_path: Path) -> None:
    store, db = _store_with_probe_table(tmp_path)
    with store.transaction() as conn:
        conn.execute(text("INSERT INTO probe VALUES (1)"))
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # SQLite's write lock held by another connection
    try:
        done = threading.Event()
        thread = threading.Thread(
            target=lambda: (store.checkpoint(min_interval_s=0), done.set()), daemon=True
        )
        thread.start()
        assert done.wait(10), "the checkpoint waited for the writer (busy_timeout is 30 s)"
        writer.execute("INSERT INTO probe VALUES (2)")
    finally:
        writer.execute("COMMIT")
        writer.close()
    assert _row_count_in_main_file(db, tmp_path / "copy.db") == 1


def test_a_long_log_is_finished_under_the_writer_lock(tmp_path: Path, monkeypatch) -> None:
    """Writers append during the first, lock-free pass, so it may not finish; past WAL_RESTART_PAGES a second pass
    runs with the writers held off, so that the log can start over."""
    store, _ = _store_with_probe_table(tmp_path)
    writers = store._writers
    assert isinstance(writers, WriterLock)
    passes: list[tuple[int, bool]] = []

    def passive(log_pages: int) -> int:
        passes.append((log_pages, writers._threads.locked()))
        return log_pages

    monkeypatch.setattr(store, "_passive_checkpoint", lambda: passive(WAL_RESTART_PAGES - 1))
    store.checkpoint(min_interval_s=0)
    assert passes == [(WAL_RESTART_PAGES - 1, False)]  # short enough: no second pass
    passes.clear()
    monkeypatch.setattr(store, "_passive_checkpoint", lambda: passive(WAL_RESTART_PAGES))
    store.checkpoint(min_interval_s=0)
    assert passes == [(WAL_RESTART_PAGES, False), (WAL_RESTART_PAGES, True)]


def test_after_a_checkpoint_of_a_long_log_the_next_writer_starts_it_over(tmp_path: Path) -> None:
    store, db = _store_with_probe_table(tmp_path)
    with store.transaction() as conn:
        conn.execute(text("CREATE TABLE blobs (b BLOB)"))
        for _ in range(WAL_RESTART_PAGES + 200):
            conn.execute(text("INSERT INTO blobs VALUES (randomblob(4000))"))
    store.checkpoint(min_interval_s=0)
    with store.transaction() as conn:
        conn.execute(text("INSERT INTO probe VALUES (1)"))
    with sqlite3.connect(db) as conn:
        _busy, log_pages, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert log_pages < 10, log_pages  # the small write went to the start of the log, not after 1,200 pages
