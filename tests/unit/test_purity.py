"""Every module that says it is pure (no I/O: its docstring) loads no network, database or process library."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The modules whose docstring promises no I/O: parsing, matching, templating, guards, planning, decisions.
PURE = (
    "app.alertmanager",
    "app.matchers",
    "app.playbooks",
    "app.config_documents",
    "app.templates",
    "app.params",
    "app.permissions",
    "app.guards",
    "app.planning",
    "app.diagnosis",
    "app.episodes",
    "app.promql_window",
    "app.playbook_warnings",
    "app.states",
    "app.repair_policy",
    "app.incident_policy",
    "app.job_phase",
    "app.framing",
    "app.checkpoint_layouts",
    "app.outcome",
    "app.discovery",
    "app.hostlist",
)
IO = (
    "flask",
    "requests",
    "sqlalchemy",
    "socket",
    "urllib.request",
    "paramiko",
    "kubernetes",
    "psycopg",
    "smtplib",
)


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_no_io_library(module: str) -> None:
    code = f"import sys, {module}; bad = [m for m in {IO!r} if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
