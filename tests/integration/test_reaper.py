"""A test session killed outright (SIGKILL: its teardown never runs) leaves no daemon behind: the reaper it
started kills what the session started (tests/fixtures/reaper.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sim.procs import wait_until
from tests.fixtures.reaper import MARK, alive

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# A session whose one test starts a daemon in a session of its own (as the fixtures do), says its PID, and waits.
SESSION = textwrap.dedent(
    """
    import time
    from pathlib import Path

    from sim.procs import Daemon


    def test_starts_a_daemon_and_waits(tmp_path):
        daemon = Daemon("sleeper", ["sleep", "600"], tmp_path)
        Path({pid_file!r}).write_text(str(daemon.proc.pid))
        time.sleep(600)
    """
)


def test_a_killed_session_s_daemons_are_killed_by_its_reaper(tmp_path: Path):
    pid_file = tmp_path / "daemon.pid"
    test_file = tmp_path / "test_session.py"
    test_file.write_text(SESSION.format(pid_file=str(pid_file)))
    env = {key: value for key, value in os.environ.items() if key != MARK}  # a session of its own, not ours
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.fixtures.reaper", "-p", "no:cacheprovider",
         "-c", os.devnull, "--rootdir", str(tmp_path), str(test_file)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60, "the inner session's daemon")
        daemon = int(pid_file.read_text())
        assert alive(daemon)
        session.send_signal(signal.SIGKILL)  # no teardown: the daemon would outlive it
        session.wait(10)
        wait_until(lambda: not alive(daemon), 30, f"the reaper to kill the orphaned daemon {daemon}")
    finally:
        if session.poll() is None:
            session.kill()
            session.wait(10)
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
