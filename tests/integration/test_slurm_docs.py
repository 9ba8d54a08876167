"""docs/slurm.md followed as written, on the test Slurm: the management host's commands (section 3) and its
settings file verbatim (only the login host's name and SSH port, and the /etc/nightshift and /var/lib/nightshift
roots, moved into the test's directory), `nightshift serve` as the unit starts it, from `/`; then the checks of
section 5 give an advisory incident whose ledger holds the exact commands, and nothing on the cluster changed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.fixtures.procs import Daemon, free_port, wait_until
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "slurm.md").read_text()
NIGHTSHIFT = Path(sys.executable).parent / "nightshift"


def _block_after(marker: str, language: str) -> str:
    """The first ```language block after ``marker`` in docs/slurm.md."""
    start = DOC.index(marker)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(DOC, start)
    assert match, f"no {language} block after {marker!r}"
    return match.group(1)


def test_docs_slurm_gives_a_running_advisory_service(
    least_privilege, clean_slurm: SlurmCluster, tmp_path: Path
):
    etc, state = tmp_path / "etc", tmp_path / "state"
    state.mkdir()

    def moved(text: str) -> str:
        return text.replace("/etc/nightshift", str(etc)).replace("/var/lib/nightshift", str(state))

    # Section 3, the commands after the checkout: the directory, the key, the host key, the tokens.
    commands = _block_after("## 3. The management host", "bash").splitlines()
    kept = [
        line
        for line in commands
        if "/etc/nightshift" in line and "ssh_key" not in line and "keyscan" not in line
    ]
    assert [line.split()[0] for line in kept] == ["install", "for", "chgrp"], kept
    subprocess.run(["bash", "-euc", moved("\n".join(kept).replace("-o root -g nightshift ", ""))], check=True)
    shutil.copy(least_privilege.slurm.key_file or "", etc / "ssh_key")  # install ... nightshift_ed25519
    shutil.copy(least_privilege.slurm.known_hosts_file or "", etc / "known_hosts")  # ssh-keyscan
    settings = moved(_block_after("`/etc/nightshift/settings.yaml`", "yaml"))
    assert "playbook_paths" not in settings  # the default: the shipped playbooks, from anywhere
    settings = settings.replace(
        "host: slurm-login.example", f"host: 127.0.0.1\n  port: {clean_slurm.ssh_port}"
    )
    (etc / "settings.yaml").write_text(settings)
    tokens = {name: (etc / f"{name}.token").read_text().strip() for name in ("webhook", "viewer", "operator")}
    assert len(set(tokens.values())) == 3

    job = clean_slurm.sbatch("sleep 600", "--nodelist=node1")
    wait_until(lambda: clean_slurm.squeue_state(job) == "RUNNING", 30, f"job {job} to run")
    port = free_port()
    unit = (ROOT / "deploy" / "slurm" / "nightshift.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)  # type: ignore[union-attr]
    argv = exec_start.replace("/opt/nightshift/.venv/bin/nightshift", str(NIGHTSHIFT)).split()
    argv[argv.index("0.0.0.0:8080")] = f"127.0.0.1:{port}"
    daemon = Daemon(
        "nightshift", argv, tmp_path, cwd=Path("/"), env={"NIGHTSHIFT_CONFIG": str(etc / "settings.yaml")}
    )
    url = f"http://127.0.0.1:{port}"
    viewer = {"Authorization": f"Bearer {tokens['viewer']}"}
    try:
        wait_until(lambda: _ready(url), 60, f"nightshift serve from / (log: {daemon.log_path})")
        # Section 5.
        lint = subprocess.run(
            [str(NIGHTSHIFT), "lint", str(ROOT / "playbooks")], capture_output=True, text=True, cwd="/"
        )
        assert lint.returncode == 0 and lint.stdout.splitlines()[-1].startswith("ok: "), (
            lint.stdout + lint.stderr
        )
        # Discovery answers 503 until its first refresh (off the request threads) has read Slurm, then the list.
        sd = wait_until(
            lambda: (r := requests.get(f"{url}/api/v1/sd/training", headers=viewer, timeout=30)).ok and r,
            60,
            "service discovery's first refresh",
        )
        assert isinstance(sd.json(), list)
        payload = (ROOT / "alerts" / "examples" / "gpu-xid-79.json").read_text().replace('"4242"', f'"{job}"')
        posted = requests.post(
            f"{url}/api/v1/alerts",
            data=payload,
            headers={"Authorization": f"Bearer {tokens['webhook']}", "Content-Type": "application/json"},
            timeout=10,
        )
        assert posted.status_code == 200, posted.text

        def closed() -> dict | None:
            incidents = requests.get(f"{url}/api/v1/incidents", headers=viewer, timeout=10).json()[
                "incidents"
            ]
            done = [i for i in incidents if i.get("outcome")]
            return done[0] if done else None

        incident = wait_until(closed, 90, f"the incident to close (log: {daemon.log_path})")
        detail = requests.get(f"{url}/api/v1/incidents/{incident['id']}", headers=viewer, timeout=10).json()
        assert incident["outcome"] == "advisory", json.dumps(detail)[:3000]
        assert f"scontrol requeue {job}" in json.dumps(detail)
        assert clean_slurm.squeue_state(job) == "RUNNING" and clean_slurm.job_restarts(job) == 0
        assert "drain" not in clean_slurm.node_state("node1")
        assert list(state.iterdir()), "the store lives in data_dir"
        log = daemon.log_path.read_text()
        assert (
            "INFO app.domain.startup: mode: advisory" in log
            and "reads: with viewer token, operator token" in log
        )
        assert f"INFO app.ledger: incident {incident['id']}: step: " in log  # the decisions reach the log
    finally:
        daemon.stop()
        print(daemon.log_tail())


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/readyz", timeout=2).status_code == 200
    except requests.RequestException:
        return False
