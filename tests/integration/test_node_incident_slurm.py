"""A node incident on the real Slurm goes through the guard chain before its node is taken out (issue 20).

An alert on an idle node (no job label) opens a node incident. Before, it went straight to the repair lifecycle: an
alert with a 1970 timestamp, or one Prometheus no longer fires, drained the node. Now the incident is decided by the
same policy as a job incident: the live re-check and the stale signal stop it, and the node stays in service. The
control: the same alert, still firing, drains, validates and resumes the node.

Prometheus is the fake at the client seam (the re-check's answer is what the test is about); Slurm, its nodes,
scontrol over SSH and the validation command are real.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.clients import Clients
from app.domain.alertmanager import parse_notification
from app.domain.clock import SystemClock
from app.domain.states import IncidentOutcome
from app.store import repairs
from tests.fakes import FakePrometheus, FakeSample, node_repair_playbook
from tests.fixtures.procs import wait_until
from tests.fixtures.slurm import SlurmCluster
from tests.payloads import alert, payload
from tests.worlds import World

pytestmark = pytest.mark.integration

GRANTS = ("slurm.drain_node", "slurm.validate_node", "slurm.resume_node")
RECHECK = 'ALERTS{alertname="GpuXidError",alertstate="firing",Hostname="node3"}'
PLAYBOOK = (
    node_repair_playbook(
        "xid-node",
        "slurm",
        '{validate: {action: slurm.validate_node, with: {node: "{{ node.name }}", '
        'command: "test -e VERDICTS/healthy-{{ node.name }}", timeout_seconds: 20}}}',
    )
    + 'recheck: \'ALERTS{alertname="GpuXidError",alertstate="firing",Hostname="{{ labels.Hostname }}"}\'\n'
    + "cooldown: 0s\nbudget: {attempts: 3, window: 24h, backoff: 0s}\n"
)


def xid_on_idle_node(starts_at: datetime, fingerprint: str) -> dict[str, Any]:
    labels = {"alertname": "GpuXidError", "Hostname": "node3", "xid": "79", "xid_class": "reboot", "gpu": "0"}
    return {**alert(labels, starts_at=starts_at), "fingerprint": fingerprint}


class Bench(World):
    prometheus: FakePrometheus
    verdicts: Path

    def send(self, *alerts: dict[str, Any]) -> list[int]:
        return self.engine.ingest(parse_notification(json.dumps(payload(*alerts)))).opened

    def settle(self, incident_id: int, timeout: float = 90) -> dict[str, Any]:
        """Work (real clock) until the incident has closed and no repair is due."""

        def closed() -> dict[str, Any] | None:
            self.engine.work_once("it")
            detail = self.engine.incident(incident_id)
            assert detail is not None
            inc = detail["incident"]
            return inc if inc["open_key"] is None and not inc["finalize_pending"] else None

        row = wait_until(closed, timeout, f"incident {incident_id} closed", interval=0.2)
        assert isinstance(row, dict)
        return row


@pytest.fixture
def bench(clean_slurm: SlurmCluster, tmp_path: Path) -> Iterator[Bench]:
    settings = copy.deepcopy(clean_slurm.settings)
    settings.data_dir = str(tmp_path / "var")
    settings.slurm.node_ssh_host = "127.0.0.1"  # every node of the test cluster is this host
    settings.repair.poll_seconds = 1
    settings.repair.return_timeout_seconds = 30
    settings.guards.defer_seconds = 1
    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    verdicts.chmod(0o755)
    prometheus = FakePrometheus()
    clients = Clients(settings, prometheus=prometheus)
    b = Bench(
        settings,
        playbooks=PLAYBOOK.replace("VERDICTS", str(verdicts)),
        grants=GRANTS,
        clients=clients,
        clock=SystemClock(),
    )
    b.prometheus, b.verdicts = prometheus, verdicts
    yield b
    clients.close()
    b.close()


def in_service(cluster: SlurmCluster, node: str) -> bool:
    base, *flags = cluster.node_state(node).split("+")
    return base == "idle" and "drain" not in flags


def repairs_of(b: Bench, node: str) -> list[dict[str, Any]]:
    with b.store.read() as conn:
        return [row.as_dict() for row in repairs.list_repairs(conn, node=node)]


def guards_of(b: Bench, incident_id: int) -> list[str]:
    detail = b.engine.incident(incident_id)
    assert detail is not None
    return [row["message"] for row in detail["ledger"] if row["kind"] == "guard"]


def test_an_alert_from_1970_prometheus_does_not_fire_never_drains_the_node(
    clean_slurm: SlurmCluster, bench: Bench
) -> None:
    (incident_id,) = bench.send(xid_on_idle_node(datetime(1970, 1, 1, tzinfo=UTC), "1970000000000001"))
    inc = bench.settle(incident_id)
    assert (inc["kind"], inc["outcome"]) == ("node", IncidentOutcome.RESOLVED), inc
    assert RECHECK in bench.prometheus.queries
    assert guards_of(bench, incident_id)[-1].startswith("recheck: stop: condition no longer holds")
    assert repairs_of(bench, "node3") == []
    assert in_service(clean_slurm, "node3")


def test_the_same_alert_still_firing_is_repaired_and_an_older_one_after_it_is_stale(
    clean_slurm: SlurmCluster, bench: Bench
) -> None:
    bench.prometheus.answers[RECHECK] = [FakeSample({"Hostname": "node3"}, 1)]
    (bench.verdicts / "healthy-node3").touch()
    fault = datetime.now(UTC) - timedelta(minutes=5)
    (first,) = bench.send(xid_on_idle_node(fault, "00000000000000a1"))
    inc = bench.settle(first)
    assert inc["outcome"] == IncidentOutcome.RECOVERED, inc  # drained, validated, resumed: the control
    assert [r["state"] for r in repairs_of(bench, "node3")] == ["returned"]
    assert in_service(clean_slurm, "node3")
    drains = [c for c in bench.rows("repair_step") if "State=DRAIN" in (c["data"]["step"]["command"] or "")]
    assert len(drains) == 1
    # A second instance of the fault that started before the repair took the node out: the fault repaired.
    (second,) = bench.send(xid_on_idle_node(fault - timedelta(minutes=1), "00000000000000a2"))
    inc = bench.settle(second)
    assert inc["outcome"] == IncidentOutcome.IGNORED, inc
    assert guards_of(bench, second)[-1].startswith("stale_signal: stop")
    assert len(repairs_of(bench, "node3")) == 1  # never handed to a second repair
    assert in_service(clean_slurm, "node3")
