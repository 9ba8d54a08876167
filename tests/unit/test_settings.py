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
