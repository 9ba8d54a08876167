"""SshRunner against a real sshd (the Slurm fixture): quoting, login environment, errors, reuse."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.clients.ssh import MAX_STREAM_BYTES, SshRunner
from app.config import Settings
from app.errors import CredentialRejected, OutcomeUnknown, Unavailable
from tests.fixtures.procs import free_port
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
