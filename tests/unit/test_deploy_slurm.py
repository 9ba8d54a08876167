"""deploy/slurm/: the systemd unit passes systemd-analyze and keeps its hardening; the prolog/epilog is valid sh.
(The sudoers file and the prolog/epilog run for real in tests/integration/test_least_privilege.py and
test_hpc_job_mapping.py.)"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.procs import IN_CI

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} not found")
        pytest.skip(f"{name} not found")
    return path


def test_the_unit_verifies(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze")
    unit = (DEPLOY / "nightshift.service").read_text()
    # The unit's ExecStart names the installed path; verify against this checkout's entry point instead.
    here = Path(sys.executable).parent / "nightshift"
    (tmp_path / "nightshift.service").write_text(
        unit.replace("/opt/nightshift/.venv/bin/nightshift", str(here))
    )
    result = subprocess.run(
        [analyze, "verify", str(tmp_path / "nightshift.service")], capture_output=True, text=True
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_unit_runs_unprivileged_with_only_its_state_writable() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive in systemd
    parser.read(DEPLOY / "nightshift.service")
    service = parser["Service"]
    assert service["User"] == "nightshift" and "DynamicUser" not in service
    assert service["ProtectSystem"] == "strict" and service["ReadWritePaths"] == "/var/lib/nightshift"
    assert service["StateDirectory"] == "nightshift"
    assert service["NoNewPrivileges"] == "true" and service["CapabilityBoundingSet"] == ""
    assert service["ExecStart"].endswith("nightshift serve --bind 0.0.0.0:8080")


def test_the_prolog_is_posix_sh() -> None:
    subprocess.run([_tool("sh"), "-n", str(DEPLOY / "hpc-job-mapping.sh")], check=True)
