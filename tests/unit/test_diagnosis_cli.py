"""``nightshift diagnose LOGFILE... [--label k=v]`` as users run it, and the settings' confidence floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.config import DiagnosisSettings, Settings
from app.domain.diagnosis import MAX_LOG_CHARS, for_settings
from app.domain.errors import ConfigError
from app.logfiles import label_pairs, read_tails
from tests.fixtures.procs import nightshift_cli as nightshift

ROOT = Path(__file__).parents[2]
CORPUS = ROOT / "tests" / "data" / "diagnosis"


def test_diagnose_prints_verdict_culprit_and_evidence():
    result = nightshift(
        "diagnose",
        str(CORPUS / "pyspy_one_rank_in_io.log"),
        "--label",
        "alertname=TrainingHang",
        "-l",
        "Hostname=gpu-s1",
    )
    assert result.returncode == 1, result.stderr  # a fault found: "problems found" (README, exit codes)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("verdict: storage_io (") and lines[0].endswith(", act)")
    assert "The alert came from gpu-s1; the log points at gpu-s2." in lines[1]
    assert "culprit: node gpu-s2, rank 6, gpu -" in lines
    assert "evidence:" in lines


def test_diagnose_reads_several_files_in_order_and_prints_json(tmp_path):
    job = tmp_path / "job.out"
    job.write_text(
        "[rank0]: step 100 loss 2.0\n[rank0]: RuntimeError: CUDA error: unspecified launch failure\n"
    )
    dmesg = tmp_path / "dmesg.txt"
    dmesg.write_text(
        "[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
    )
    result = nightshift("diagnose", str(job), str(dmesg), "--json", "-l", "Hostname=n1")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert (data["category"], data["xid"], data["actionable"]) == ("gpu_hardware", 79, True)


def test_diagnose_healthy_log_says_do_not_act():
    result = nightshift("diagnose", str(CORPUS / "healthy_megatron.log"))
    assert result.returncode == 0, result.stderr  # benign: nothing to act on
    assert result.stdout.startswith("verdict: benign (")
    assert "do not act" in result.stdout.splitlines()[0]


@pytest.mark.parametrize("label", ["noequals", "1abc=x", "a b=c"])
def test_diagnose_rejects_a_bad_label(label):
    result = nightshift("diagnose", str(CORPUS / "healthy_megatron.log"), "--label", label)
    assert result.returncode == 2
    assert "Invalid value for --label" in result.stderr and "is not NAME=VALUE" in result.stderr


def test_diagnose_missing_file_is_a_clear_error():
    result = nightshift("diagnose", "no/such/file.log")
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_read_tails_reads_at_most_the_diagnosed_tail_of_each_file(tmp_path):
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * (MAX_LOG_CHARS + 100) + b"\nlast line\n")
    small = tmp_path / "small.log"
    small.write_text("small\n")
    text = read_tails([big, small])
    assert len(text) <= 2 * MAX_LOG_CHARS
    assert text.endswith("last line\n\nsmall\n")


def test_label_pairs_bounds():
    assert label_pairs(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ValueError, match="at most 64"):
        label_pairs([f"l{i}=v" for i in range(65)])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        label_pairs(["a=" + "v" * 1025])


def test_confidence_floor_setting_decides_between_a_verdict_and_unknown(tmp_path):
    weak = "Traceback (most recent call last):\n  File 'x.py', line 1\nValueError: bad value"
    assert for_settings(Settings())({}, weak).category == "application_error"
    strict = Settings(diagnosis=DiagnosisSettings(confidence_floor=0.99))
    result = for_settings(strict)({}, weak)
    assert result.category == "unknown"
    assert "Weak evidence only: unhandled Python exception (application_error" in result.summary
    with pytest.raises(ConfigError, match=r"diagnosis\.confidence_floor"):
        DiagnosisSettings(confidence_floor=1.5)
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"diagnosis": {"confidence_floor": 0.99}}))
    result = nightshift("diagnose", str(CORPUS / "hf_keyerror.log"), "--config", str(settings))
    assert result.stdout.startswith("verdict: unknown"), result.stdout + result.stderr
