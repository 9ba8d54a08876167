"""SshRunner against a real sshd (the Slurm fixture): quoting, login environment, errors, reuse."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from app.clients import Clients
from app.clients.ssh import MAX_STREAM_BYTES, SshRunner
from app.config import Settings
from app.domain.errors import CredentialRejected, OutcomeUnknown, Unavailable
from tests.fixtures.procs import free_port, wait_until
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration


def _settings(cluster: SlurmCluster, **changes: object) -> Settings:
    return dataclasses.replace(cluster.settings, slurm=dataclasses.replace(cluster.settings.slurm, **changes))


@pytest.fixture
def runner(slurm_cluster: SlurmCluster) -> Iterator[SshRunner]:
    runner = SshRunner.from_settings(slurm_cluster.settings)
    yield runner
    runner.close()


def _accepted_logins(cluster: SlurmCluster) -> int:
    return cluster.daemons["sshd"].log_path.read_text(errors="replace").count("Accepted publickey for root")


def test_argv_elements_reach_the_command_verbatim(runner: SshRunner) -> None:
    hostile = ["$(id)", "a;b", "`id`", "x y", "it's", "new\nline", "*"]

    result = runner.run(["printf", "%s|", *hostile])

    assert result.exit_code == 0
    assert result.stdout == "|".join(hostile) + "|"
    assert result.command.startswith("bash -lc ")
    assert result.argv == ("printf", "%s|", *hostile)


def test_login_shell_sees_sshd_setenv(runner: SshRunner, slurm_cluster: SlurmCluster) -> None:
    result = runner.run(["sinfo", "--noheader", "--format=%P"])

    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "debug*"
    assert runner.run(["printenv", "SLURM_CONF"]).stdout.strip() == slurm_cluster.env["SLURM_CONF"]


def test_all_output_of_both_streams_arrives(runner: SshRunner) -> None:
    # About 2.6 MB: more than the SSH window, and stdout more than the kept tail; stderr written last.
    result = runner.run(["sh", "-c", "seq 1 300000; seq 1 100000 >&2; echo done >&2"])

    assert result.exit_code == 0
    assert result.stdout.endswith("299999\n300000\n")
    assert len(result.stdout) == MAX_STREAM_BYTES  # the tail is kept, the head dropped
    assert result.stderr.endswith("99999\n100000\ndone\n")
    assert result.stderr.startswith("1\n2\n")


def test_non_zero_exit_is_a_result_with_stderr(runner: SshRunner) -> None:
    result = runner.run(["ls", "/nonexistent-nightshift"])

    assert result.exit_code == 2
    assert "No such file or directory" in result.stderr
    assert result.stdout == ""


def test_two_commands_share_one_connection_and_close_reconnects(
    runner: SshRunner, slurm_cluster: SlurmCluster
) -> None:
    before = _accepted_logins(slurm_cluster)

    runner.run(["true"])
    runner.check()
    logins_for_two = _accepted_logins(slurm_cluster) - before
    runner.close()
    runner.run(["true"])

    assert logins_for_two == 1
    assert _accepted_logins(slurm_cluster) - before == 2


def test_command_timeout_is_an_unknown_outcome(runner: SshRunner) -> None:
    started = time.monotonic()

    with pytest.raises(OutcomeUnknown, match="may have run"):
        runner.run(["sleep", "5"], timeout=1)

    assert time.monotonic() - started < 4
    assert runner.run(["echo", "still usable"]).stdout == "still usable\n"


def test_a_connection_lost_while_a_command_starts_is_an_unknown_outcome(
    runner: SshRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paramiko answers an exec request whose connection then ends with the transport's EOFError (seen: the Slurm
    discovery refresh, as the test's sshd went away). The request was sent, so the command may have run: an
    unknown outcome, never an exception outside the backend errors. The runner stays usable."""
    runner.run(["true"])

    def lost(channel: paramiko.Channel, command: str) -> None:
        raise EOFError()  # what Channel._wait_for_event raises once the transport's reader saw the end

    with monkeypatch.context() as patch:
        patch.setattr(paramiko.Channel, "exec_command", lost)
        with pytest.raises(OutcomeUnknown, match="connection lost while starting, it may have run"):
            runner.run(["scontrol", "requeue", "42"])
        with pytest.raises(OutcomeUnknown):
            runner.run_all([["squeue"], ["sinfo"]])

    assert runner.run(["echo", "still usable"]).stdout == "still usable\n"


def test_unknown_host_key_is_refused(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    runner = SshRunner.from_settings(_settings(slurm_cluster, known_hosts_file=str(empty)))

    with pytest.raises(CredentialRejected, match="host key verification failed"):
        runner.run(["true"])


def test_changed_host_key_is_refused(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = Path(f"{other}.pub").read_text().split()[:2]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{slurm_cluster.ssh_port} {kind} {key}\n")
    runner = SshRunner.from_settings(_settings(slurm_cluster, known_hosts_file=str(known_hosts)))

    with pytest.raises(CredentialRejected, match="host key verification failed"):
        runner.check()


def test_wrong_key_is_refused(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    runner = SshRunner.from_settings(_settings(slurm_cluster, key_file=str(wrong)))

    with pytest.raises(CredentialRejected, match="authentication failed"):
        runner.check()


def test_connection_refused_is_unavailable(slurm_cluster: SlurmCluster) -> None:
    runner = SshRunner.from_settings(_settings(slurm_cluster, port=free_port()))

    with pytest.raises(Unavailable, match="cannot connect"):
        runner.run(["true"])


def test_independent_commands_run_at_once_each_with_its_own_result(runner: SshRunner) -> None:
    runner.run(["true"])  # connected
    started = time.monotonic()

    results = runner.run_all([["sleep", "1"], ["sh", "-c", "echo out; echo err >&2; exit 3"], ["sleep", "1"]])

    assert time.monotonic() - started < 1.9  # the two sleeps overlapped
    assert [r.exit_code for r in results] == [0, 3, 0]
    assert (results[1].stdout, results[1].stderr) == ("out\n", "err\n")
    assert results[1].argv == ("sh", "-c", "echo out; echo err >&2; exit 3")
    with pytest.raises(ValueError, match="at most"):
        runner.run_all([["true"]] * 7)


def test_a_command_costs_no_delayed_ack_wait(runner: SshRunner) -> None:
    """With Nagle on, every channel open waited out the server's delayed ACK (40 ms): 20 commands took at least
    0.8 s. With TCP_NODELAY they take about 20 ms each on loopback."""
    runner.run(["true"])
    started = time.monotonic()
    for _ in range(20):
        runner.run(["true"])
    assert time.monotonic() - started < 0.75


def _connection_processes(cluster: SlurmCluster) -> list[int]:
    """PIDs of the sshd processes serving connections (children of the fixture's sshd)."""
    daemon = cluster.daemons["sshd"].proc.pid
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == daemon:
            children.append(int(stat.parent.name))
    return children


def test_a_connection_that_died_is_reopened_for_the_next_command(
    runner: SshRunner, slurm_cluster: SlurmCluster
) -> None:
    runner.run(["true"])
    before = _accepted_logins(slurm_cluster)
    for pid in _connection_processes(slurm_cluster):
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not _connection_processes(slurm_cluster), 10, "the connection's sshd gone")

    assert runner.run(["echo", "again"]).stdout == "again\n"
    assert _accepted_logins(slurm_cluster) - before == 1


def test_warm_up_connects_before_the_first_command(slurm_cluster: SlurmCluster) -> None:
    clients = Clients(slurm_cluster.settings)
    before = _accepted_logins(slurm_cluster)
    try:
        clients.warm_up()
        assert _accepted_logins(slurm_cluster) - before == 1
        clients.slurm.run(["true"])
        assert _accepted_logins(slurm_cluster) - before == 1
    finally:
        clients.close()


def test_warm_up_of_an_unreachable_host_only_logs(slurm_cluster: SlurmCluster, caplog) -> None:
    clients = Clients(_settings(slurm_cluster, port=free_port(), connect_timeout_seconds=2.0))
    clients.warm_up()
    assert "could not open the SSH connection ahead of time" in caplog.text
