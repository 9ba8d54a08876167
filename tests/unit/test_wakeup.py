"""Wakeup: an accept in one process wakes a worker waiting in another; without a listener nothing breaks."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from app.wakeup import Wakeup

LISTEN_THEN_REPORT = """
import sys
from pathlib import Path
from app.wakeup import Wakeup
wakeup = Wakeup(Path(sys.argv[1]))
print("listening" if wakeup.listen() else "not listening", flush=True)
print("woken" if wakeup.wait(30) else "timed out", flush=True)
wakeup.close()
"""


def test_set_in_one_process_wakes_a_listener_in_another(tmp_path: Path) -> None:
    path = tmp_path / "worker.sock"
    worker = subprocess.Popen(
        [sys.executable, "-c", LISTEN_THEN_REPORT, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "listening\n"
        Wakeup(path).set()
        assert worker.stdout.readline() == "woken\n"  # long before its 30 s wait is over
        assert worker.wait(10) == 0
        assert not path.exists()  # the listener removed its socket file
    finally:
        worker.kill()
        worker.wait()


def test_a_listener_is_woken_by_its_own_set_and_clear_forgets_it(tmp_path: Path) -> None:
    wakeup = Wakeup(tmp_path / "worker.sock")
    assert wakeup.listen()
    try:
        assert not wakeup.wait(0.05)
        wakeup.set()  # e.g. a signal handler asking the worker to stop
        assert wakeup.wait(0)
        wakeup.clear()
        assert not wakeup.wait(0.05)
        Wakeup(tmp_path / "worker.sock").set()
        Wakeup(tmp_path / "worker.sock").set()
        wakeup.clear()  # both datagrams drained
        assert not wakeup.wait(0.05)
    finally:
        wakeup.close()


def test_setting_without_any_listener_is_harmless(tmp_path: Path) -> None:
    wakeup = Wakeup(tmp_path / "nobody.sock")
    wakeup.set()
    assert wakeup.wait(0)  # the in-process event still works
    Wakeup(None).set()
    Wakeup(Path("/" + "x" * 200) / "worker.sock").set()  # too long for a Unix socket: ignored


def test_a_second_listener_on_the_host_polls_and_a_dead_ones_file_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "worker.sock"
    first = Wakeup(path)
    assert first.listen()
    assert not Wakeup(path).listen()  # the first one is alive
    first._listener.close()  # dies without cleaning up: its socket file stays
    first._listener = None
    assert path.exists()
    second = Wakeup(path)
    assert second.listen()
    try:
        Wakeup(path).set()
        assert second.wait(5)
    finally:
        second.close()


def test_a_path_too_long_for_a_socket_falls_back_to_polling(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    wakeup = Wakeup(deep / "worker.sock")
    assert not wakeup.listen()
    wakeup.set()
    assert wakeup.wait(0)


def test_a_full_buffer_does_not_block_the_webhook(tmp_path: Path) -> None:
    path = tmp_path / "worker.sock"
    listener = Wakeup(path)
    assert listener.listen()
    try:
        sender = Wakeup(path)
        done = threading.Event()

        def flood() -> None:
            for _ in range(100_000):
                sender.set()
            done.set()

        threading.Thread(target=flood, daemon=True).start()
        assert done.wait(30), "set() blocked on a full socket buffer"
    finally:
        listener.close()
