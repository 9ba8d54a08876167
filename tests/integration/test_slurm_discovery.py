"""GET /api/v1/sd/training on a real Slurm over real SSH: the running jobs that announce a progress port, one
target per node, readers only; a job without a port listed nowhere and logged once; a forged comment line."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from app import create_app
from app.clients.slurm import SlurmClient
from app.config import AccessSettings
from app.metrics import Metrics
from sim.stack import NODE_ADDRESSES
from tests.fixtures.procs import wait_until
from tests.fixtures.reader import VIEWER_TOKEN, viewer_access
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration
READER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}


class RefusingRunner:
    """A runner for a client that must not send anything."""

    def run(self, argv: object, timeout: float | None = None) -> object:
        raise AssertionError(f"sent {argv!r}: expected no round trip")

    def run_all(self, argvs: object, timeout: float | None = None) -> object:
        raise AssertionError(f"sent {argvs!r}: expected no round trip")

    def close(self) -> None:
        pass


@pytest.fixture
def client(clean_slurm: SlurmCluster, tmp_path: Path) -> Iterator[FlaskClient]:
    settings = dataclasses.replace(
        clean_slurm.settings,
        data_dir=str(tmp_path / "data"),
        access=AccessSettings(**viewer_access(tmp_path / "access")),
        slurm=dataclasses.replace(clean_slurm.settings.slurm, discovery_cache_seconds=0),
        webhook=dataclasses.replace(clean_slurm.settings.webhook, auth_disabled=True),
    )
    app = create_app(settings, metrics=Metrics())
    yield app.test_client()
    app.extensions["nightshift"].engine.deps.clients.close()


def _answer(client: FlaskClient) -> Any:
    """The endpoint's answer once its first background refresh has ended (until then: 503, still running)."""
    found: list[Any] = []

    def refreshed() -> bool:
        response = client.get("/api/v1/sd/training", headers=READER)
        found[:] = [response]
        return response.status_code != 503 or "still running" not in response.get_json()["message"]

    wait_until(refreshed, 30, "the first discovery refresh")
    return found[0]


def _running(cluster: SlurmCluster, *jobs: str) -> None:
    wait_until(lambda: all(cluster.squeue_state(j) == "RUNNING" for j in jobs), 30, f"jobs {jobs} running")


def test_lists_each_node_of_a_job_with_a_port_and_nothing_else(
    client: FlaskClient, clean_slurm: SlurmCluster, caplog: pytest.LogCaptureFixture
) -> None:
    announced = clean_slurm.sbatch("sleep 120", "--nodes=2", "--comment=nightshift.progress_port=9464")
    silent = clean_slurm.sbatch("sleep 120", "--nodes=1", "--comment=just a note")
    _running(clean_slurm, announced, silent)

    with caplog.at_level(logging.INFO, logger="app.web.discovery"):
        first = _answer(client)
        second = client.get("/api/v1/sd/training", headers=READER)

    assert first.status_code == 200, first.get_json()
    groups = first.get_json()
    assert second.get_json() == groups
    nodes = sorted(
        clean_slurm.command("scontrol", "show", "hostnames", clean_slurm.job_nodes(announced)).stdout.split()
    )
    assert [g["labels"]["__meta_slurm_node"] for g in groups] == nodes
    assert [g["targets"] for g in groups] == [
        [f"{NODE_ADDRESSES[n]}:9464"] for n in nodes
    ]  # at each NodeAddr
    assert {g["labels"]["__meta_slurm_job_id"] for g in groups} == {announced}
    assert groups[0]["labels"]["__meta_slurm_partition"] == "debug"
    assert [r.message for r in caplog.records].count(
        f"slurm job {silent} runs without nightshift.progress_port=<port> in its comment: not discovered"
    ) == 1


def test_a_comment_forging_another_jobs_line_hides_that_job_and_adds_nothing(
    client: FlaskClient, clean_slurm: SlurmCluster
) -> None:
    victim = clean_slurm.sbatch("sleep 120", "--comment=nightshift.progress_port=9464")
    _running(clean_slurm, victim)
    forger = clean_slurm.sbatch("sleep 120", f"--comment=x\n{victim} nightshift.progress_port=22")
    _running(clean_slurm, forger)

    groups = _answer(client).get_json()

    assert all(g["targets"] != ["127.0.0.1:22"] for g in groups)
    assert victim not in {g["labels"]["__meta_slurm_job_id"] for g in groups}


def test_readers_only(client: FlaskClient) -> None:
    assert client.get("/api/v1/sd/training").status_code == 401
    assert client.get("/api/v1/sd/training", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_slurm_unreachable_is_503(clean_slurm: SlurmCluster, tmp_path: Path) -> None:
    settings = dataclasses.replace(
        clean_slurm.settings,
        data_dir=str(tmp_path / "data"),
        access=AccessSettings(**viewer_access(tmp_path / "access")),
        slurm=dataclasses.replace(clean_slurm.settings.slurm, port=1, connect_timeout_seconds=2.0),
        webhook=dataclasses.replace(clean_slurm.settings.webhook, auth_disabled=True),
    )
    response = _answer(create_app(settings, metrics=Metrics()).test_client())
    assert response.status_code == 503
    assert (
        response.get_json()["status"] == "error"
        and "slurm discovery failed" in response.get_json()["message"]
    )


@pytest.mark.parametrize(
    "expression", ["node1", "node[1-4]", "node[1,3-4]", "gpu[001-003],login1", "r[1-2]n[08-10]", "a,b[2-3]"]
)
def test_hostlists_expand_here_as_scontrol_expands_them(clean_slurm: SlurmCluster, expression: str) -> None:
    scontrol = clean_slurm.command("scontrol", "show", "hostnames", expression).stdout.split()
    assert SlurmClient(RefusingRunner()).expand_hostlist(expression) == scontrol
