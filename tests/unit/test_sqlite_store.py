"""SQLite specifics of the store: writers queue across processes (WriterLock), the worker's WAL checkpoints."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from werkzeug.serving import make_server

from app import create_app
from app.config import Settings, StoreSettings
from app.domain.errors import StoreUnavailable
from app.metrics import Metrics
from app.store import WAL_RESTART_PAGES, Store
from app.store.writer_lock import STUCK_WAIT_S, WriterLock
from tests.bounded import MARGIN_S, store_unavailable_after
from tests.fixtures.procs import IN_CI, require_binary
from tests.payloads import alert, body, xid

REPO = Path(__file__).resolve().parents[2]
LONG = 60.0  # seconds: a lock timeout that the tests of queueing never reach

HOLD_UNTIL_STDIN_CLOSES = """
import sys
from pathlib import Path
from app.store.writer_lock import WriterLock
with WriterLock(Path(sys.argv[1]), timeout_s=60):
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


@contextmanager
def _held_by_another_process(path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holds the writer lock at ``path`` until its stdin is closed (or the block ends)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_UNTIL_STDIN_CLOSES, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_writer_lock_makes_another_process_wait_until_released(tmp_path: Path) -> None:
    path = tmp_path / "db-writer.lock"
    with _held_by_another_process(path) as holder:
        entered, thread = _enter_in_thread(WriterLock(path, LONG))
        assert not entered.wait(0.3), "entered while another process held the lock"
        assert holder.stdin is not None
        holder.stdin.close()
        assert entered.wait(10), "still waiting after the other process released the lock"
        thread.join(5)


def test_a_forked_child_does_not_share_the_parents_lock(tmp_path: Path) -> None:
    """flock belongs to the open file; a child using its parent's descriptor would walk through the lock."""
    lock = WriterLock(tmp_path / "db-writer.lock", LONG)
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
    lock = WriterLock(tmp_path / "db-writer.lock", LONG)
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


def _store_with_probe_table(tmp_path: Path, settings: StoreSettings | None = None) -> tuple[Store, Path]:
    db = tmp_path / "nightshift.db"
    store = Store.from_url(f"sqlite:///{db}", settings=settings)
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
    """The first checkpoint runs however long ago the machine booted: monotonic time starts near 0 at boot, so an
    interval longer than the uptime (here, always) must not be measured from 0."""
    store, db = _store_with_probe_table(tmp_path)
    interval = time.monotonic() + 3600
    store.checkpoint(min_interval_s=interval)
    assert _row_count_in_main_file(db, tmp_path / "first.db") == 0  # the table reached the file: it ran
    with store.transaction() as conn:
        conn.execute(text("INSERT INTO probe VALUES (1)"))
    store.checkpoint(min_interval_s=interval)
    assert _row_count_in_main_file(db, tmp_path / "copy.db") == 0


def test_checkpoint_neither_waits_for_nor_blocks_a_writer(tmp_path: Path) -> None:
    store, db = _store_with_probe_table(tmp_path, StoreSettings(lock_timeout_seconds=30))
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


# --- bounded waits ----------------------------------------------------------------------------------------------


def test_a_writer_lock_held_by_another_process_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "db-writer.lock"
    lock = WriterLock(path, timeout_s=0.5)
    with _held_by_another_process(path), store_unavailable_after(0.5, "another process"):
        lock.__enter__()
    with lock:  # released by the failed wait: usable at once
        pass


def test_once_a_wait_timed_out_the_next_writers_give_up_quickly_until_one_gets_through(
    tmp_path: Path,
) -> None:
    """A lock held for minutes must not cost every request the whole timeout (each holds a server thread)."""
    path = tmp_path / "db-writer.lock"
    lock = WriterLock(path, timeout_s=1.0)
    with _held_by_another_process(path) as holder:
        with store_unavailable_after(1.0, "another process"):
            lock.__enter__()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="another process"):
            lock.__enter__()
        assert time.monotonic() - started < STUCK_WAIT_S + MARGIN_S / 3
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(10) == 0
    with lock:  # the holder is gone: through at once
        pass
    with _held_by_another_process(path), store_unavailable_after(1.0, "another process"):
        lock.__enter__()  # held anew: the whole timeout again


def test_a_writer_lock_held_by_another_thread_is_given_up_after_the_timeout() -> None:
    lock = WriterLock(None, timeout_s=0.3)  # an in-memory store: threads only
    gave_up = threading.Event()

    def wait() -> None:
        with store_unavailable_after(0.3, "another thread"):
            lock.__enter__()
        gave_up.set()

    with lock:
        thread = threading.Thread(target=wait)
        thread.start()
        thread.join(0.3 + MARGIN_S)
    assert gave_up.is_set()


def test_sqlite_busy_handler_gives_up_after_the_lock_timeout(tmp_path: Path) -> None:
    """A writer outside the writer lock (an operator's sqlite3 shell) holds SQLite's own lock."""
    store, db = _store_with_probe_table(tmp_path, StoreSettings(lock_timeout_seconds=0.5))
    shell = sqlite3.connect(db, isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    try:
        with store_unavailable_after(0.5, "database is locked"), store.transaction() as conn:
            conn.execute(text("INSERT INTO probe VALUES (1)"))
    finally:
        shell.execute("ROLLBACK")
        shell.close()


@contextmanager
def _serving(settings: Settings) -> Iterator[str]:
    """The app on a real threaded HTTP server on a free port: its base URL."""
    server = make_server("127.0.0.1", 0, create_app(settings, metrics=Metrics()), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(5)


def _request(url: str, data: bytes | None = None) -> tuple[int, dict[str, Any], float]:
    """Status, JSON body and seconds taken of one HTTP request."""
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, json.loads(raw), time.monotonic() - started


def _settings(tmp_path: Path, lock_timeout_s: float = 5.0) -> Settings:
    (tmp_path / "playbooks").mkdir(exist_ok=True)
    settings = Settings(
        data_dir=str(tmp_path / "var"),
        playbook_paths=[str(tmp_path / "playbooks")],
        embedded_worker=False,
        store=StoreSettings(lock_timeout_seconds=lock_timeout_s),
    )
    settings.webhook.auth_disabled = True
    return settings


def test_a_held_writer_lock_gives_the_webhook_a_prompt_503_and_healthz_answers_at_once(
    tmp_path: Path,
) -> None:
    """Another process (a stuck worker, say) holds the writer lock far longer than the timeout: the webhook answers
    503, which Alertmanager retries, after the lock timeout; /healthz does not wait at all; /readyz says why."""
    timeout = 2.0
    settings = _settings(tmp_path, timeout)
    lock_file = Path(settings.data_dir) / "nightshift.db-writer.lock"
    notification = body(alert(xid()))
    with _serving(settings) as base, _held_by_another_process(lock_file) as holder:
        posted: list[tuple[int, dict[str, Any], float]] = []
        webhook = threading.Thread(
            target=lambda: posted.append(_request(f"{base}/api/v1/alerts", notification))
        )
        webhook.start()
        status, answer, seconds = _request(f"{base}/healthz")
        assert (status, answer) == (200, {"status": "ok"}) and seconds < 0.5, seconds
        webhook.join(timeout + MARGIN_S)
        assert posted, "the webhook was still waiting after the lock timeout"
        status, answer, seconds = posted[0]
        assert status == 503 and answer["status"] == "error", answer
        assert "store busy" in answer["message"] and "write lock" in answer["message"], answer
        assert timeout * 0.95 <= seconds < timeout + MARGIN_S, seconds
        status, answer, seconds = _request(f"{base}/readyz")
        assert status == 503 and "write lock" in answer["message"] and seconds < 1, (
            answer
        )  # known stuck: prompt
        status, answer, seconds = _request(f"{base}/api/v1/alerts", notification)  # Alertmanager's retry
        assert status == 503 and seconds < 1, (answer, seconds)
        assert holder.stdin is not None
        holder.stdin.close()  # released: the retry succeeds
        assert holder.wait(10) == 0
        assert _request(f"{base}/api/v1/alerts", notification)[0] == 200
        assert _request(f"{base}/readyz")[0] == 200


# Runs in a mount namespace of its own (unshare), where it may mount a small tmpfs and fill it: a real full disk.
FULL_DISK = """
import json, os, subprocess, sys
from pathlib import Path
from app import create_app
from app.config import Settings
from app.metrics import Metrics
from tests.payloads import alert, body, xid

mount = Path(sys.argv[1])
mount_tmpfs = ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)]
mounted = subprocess.run(mount_tmpfs, capture_output=True, text=True)
if mounted.returncode:
    print(json.dumps({"mount": mounted.stderr.strip()}))
    sys.exit()
(mount / "playbooks").mkdir()
settings = Settings(data_dir=str(mount / "var"), playbook_paths=[str(mount / "playbooks")], embedded_worker=False)
settings.webhook.auth_disabled = True
client = create_app(settings, metrics=Metrics()).test_client()
headers = {"Content-Type": "application/json"}

def answers():
    ready = client.get("/readyz")
    webhook = client.post("/api/v1/alerts", data=body(alert(xid())), headers=headers)
    return [ready.status_code, ready.json.get("message"), webhook.status_code]

seen = {"empty": answers()}
with open(mount / "filler", "wb", buffering=0) as filler:
    try:
        while True:
            filler.write(bytes(65536))
    except OSError as exc:
        seen["filled"] = exc.strerror
seen["full"] = answers()
os.remove(mount / "filler")
seen["freed"] = answers()
print(json.dumps(seen))
"""


def test_readyz_and_the_webhook_fail_while_the_disk_is_full(tmp_path: Path) -> None:
    """A real full disk: a 24 MiB tmpfs filled to the last block, in a mount namespace of the test's own (unshare,
    as root or, where user namespaces are allowed, as anyone). Ready means the store can take a write."""
    unshare = require_binary("unshare", "util-linux")
    mount = tmp_path / "disk"
    mount.mkdir()
    child = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", sys.executable, "-c", FULL_DISK, str(mount)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    if (child.returncode and "unshare:" in child.stderr) or '"mount"' in child.stdout:
        message = f"no tmpfs in a mount namespace of our own: {child.stdout}{child.stderr}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout)
    assert seen["empty"] == [200, None, 200]
    assert seen["filled"] == "No space left on device"
    status, message, webhook = seen["full"]
    assert status == 503 and "bytes free" in message, seen["full"]
    assert webhook == 503, "a webhook on a full disk should not be acknowledged"
    assert seen["freed"] == [200, None, 200]
