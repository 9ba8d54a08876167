"""Settings files: relative paths mean relative to the file, whatever the current directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.config import Settings, load_settings, shipped_playbooks

ROOT = Path(__file__).resolve().parents[2]


def test_relative_paths_resolve_against_the_settings_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "settings.yaml").write_text(
        yaml.safe_dump(
            {
                "data_dir": "state",
                "playbook_paths": ["books", "/abs/books"],
                "webhook": {"token_file": "webhook.token"},
                "slurm": {"key_file": "keys/ssh", "known_hosts_file": "~/kh"},
                "kubernetes": {"kubeconfig": "kube.conf"},
                "checkpoint": {"allowed_roots": ["ckpt"]},  # paths on the cluster, not here: left alone
            }
        )
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_settings("../etc/settings.yaml", env={"NIGHTSHIFT_OPERATOR_TOKEN_FILE": "op.token"})
    assert settings.data_dir == str(etc / "state")
    assert settings.playbook_paths == [str(etc / "books"), "/abs/books"]
    assert settings.webhook.token_file == str(etc / "webhook.token")
    assert settings.slurm.key_file == str(etc / "keys" / "ssh")
    assert settings.slurm.known_hosts_file == str(Path("~/kh").expanduser())
    assert settings.kubernetes.kubeconfig == str(etc / "kube.conf")
    assert settings.checkpoint.allowed_roots == ["ckpt"]
    assert settings.operator_token_file == "op.token"  # the environment's: relative to the current directory


def test_the_default_playbooks_are_the_shipped_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Settings().playbook_paths == [shipped_playbooks()] == [str(ROOT / "playbooks")]


def test_the_example_settings_work_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(ROOT / "examples" / "settings.yaml", env={})
    assert settings.playbook_paths == [str(ROOT / "playbooks")]
    assert Path(settings.webhook.token_file or "").is_file()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "worker:\n  lease_seconds: 1.9\n",
            "settings.yaml:2: worker.lease_seconds: expected an integer, got 1.9",
        ),
        (
            "guards:\n  blast_radius_max_nodes: -1\n",
            "settings.yaml:2: guards.blast_radius_max_nodes: must be at least 0",
        ),
        ("guards:\n  defer_seconds: 0\n", "settings.yaml:2: guards.defer_seconds: must be positive, got 0"),
        ("log_level: verbose\n", "settings.yaml:1: log_level: 'verbose' is not a level"),
        ("log_level: INFOO\n", "(did you mean 'INFO'?)"),
        (
            "playbook_path: [x]\n",
            "settings.yaml:1: playbook_path: unknown setting (did you mean 'playbook_paths'?",
        ),
        (
            "data_dir: x\nslurm:\n  hots: a\n",
            "settings.yaml:3: slurm.hots: unknown setting (did you mean 'host'?",
        ),
        ("slurm:\n  port: 70000\n", "settings.yaml:2: slurm.port: a port is 1..65535"),
        ("webhook: {token_file: a, token_file: b}\n", "settings.yaml:1: webhook.token_file: duplicate key"),
        (
            "repair:\n  validation_gpus: some\n",
            "settings.yaml:2: repair.validation_gpus: 'all' or a positive number, got 'some'",
        ),
        (
            "repair:\n  validation_gpus: 0\n",
            "settings.yaml:2: repair.validation_gpus: 'all' or a positive number",
        ),
    ],
)
def test_settings_errors_name_file_line_and_what_to_write(tmp_path, monkeypatch, text, expected):
    from app.domain.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "settings.yaml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings("settings.yaml", env={})
    assert expected in str(caught.value)


def test_an_environment_number_is_checked_too():
    from app.domain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"worker\.lease_seconds: expected an integer, got '1\.9'"):
        load_settings(env={"NIGHTSHIFT_WORKER__LEASE_SECONDS": "1.9"})
    assert load_settings(env={"NIGHTSHIFT_WORKER__LEASE_SECONDS": "30"}).worker.lease_seconds == 30
