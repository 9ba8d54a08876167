"""The node repair lifecycle on a real Slurm 22.05 over real SSH: drain -> validate (a command run over SSH "on" the
node: every node of the test cluster is 127.0.0.1 behind the one sshd, ``slurm.node_ssh_host``) -> resume or hold.

The validation command is ``test -e <verdicts>/healthy-<node>``: the test decides the verdict by creating the file."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.clients import Clients
from app.domain.clock import SystemClock
from app.domain.states import RepairState
from sim import faults
from tests.fakes import node_repair_playbook
from tests.fixtures.procs import wait_until
from tests.fixtures.sim import SimCluster
from tests.fixtures.slurm import SlurmCluster
from tests.worlds import World

pytestmark = pytest.mark.integration

GRANTS = ("slurm.drain_node", "slurm.reboot_node", "slurm.validate_node", "slurm.resume_node")
VALIDATE = (
    '{validate: {action: slurm.validate_node, with: {node: "{{ node.name }}", command: "%s", '
    "timeout_seconds: %d}}}"
)
PLAYBOOKS = "---\n".join(
    [
        node_repair_playbook(
            "xid-validate", "slurm", VALIDATE % ("test -e VERDICTS/healthy-{{ node.name }}", 20)
        ),
        node_repair_playbook("xid-slow", "slurm", VALIDATE % ("sleep 37", 2)),
        node_repair_playbook("xid-dcgmi", "slurm", VALIDATE % ("dcgmi diag -r 2 --host {{ node.name }}", 20)),
        node_repair_playbook(
            "xid-reboot",
            "slurm",
            '{repair: [{action: slurm.reboot_node, with: {node: "{{ node.name }}", reason: Xid}}]}',
        ),
    ]
)


def resumed(cluster: SlurmCluster, node: str) -> bool:
    """Back in service: idle and not drained (slurmd may be late answering a ping on a loaded machine: the
    not_responding flag is not ours to assert)."""
    base, *flags = cluster.node_state(node).split("+")
    return base == "idle" and "drain" not in flags


def drained(cluster: SlurmCluster, node: str) -> bool:
    """Out of service and idle: drained, whatever a late ping adds."""
    base, *flags = cluster.node_state(node).split("+")
    return base == "idle" and "drain" in flags


class Repairs(World):
    """The repair worker on the test cluster; ``verdicts`` holds the files the validation command tests."""

    verdicts: Path

    def request(self, node: str, playbook: str = "xid-validate") -> int:  # type: ignore[override]
        return super().request(node, "slurm", playbook)

    def settle(self, repair_id: int, timeout: float = 60) -> dict[str, Any]:
        """Work until the repair is held or settled (a real clock: waits are the settings' poll seconds)."""

        def settled() -> dict[str, Any] | None:
            self.worker.work_once("it")
            row = self.row(repair_id)
            return row if row["next_run_at"] is None else None

        row = wait_until(settled, timeout, f"repair {repair_id} settled", interval=0.2)
        assert isinstance(row, dict)
        return row


@pytest.fixture
def node_repairs(clean_slurm: SlurmCluster, tmp_path: Path) -> Iterator[Repairs]:
    settings = copy.deepcopy(clean_slurm.settings)
    settings.data_dir = str(tmp_path / "var")
    settings.slurm.node_ssh_host = "127.0.0.1"  # every node of the test cluster is this host
    settings.repair.poll_seconds = 1
    settings.repair.return_timeout_seconds = 30
    settings.repair.lemon_repairs = 2
    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    verdicts.chmod(0o755)
    clients = Clients(settings)
    bench = Repairs(
        settings,
        playbooks=PLAYBOOKS.replace("VERDICTS", str(verdicts)),
        grants=GRANTS,
        clients=clients,
        clock=SystemClock(),
    )
    bench.verdicts = verdicts
    yield bench
    clients.close()
    bench.close()


def test_validation_passes_and_the_node_is_resumed(clean_slurm: SlurmCluster, node_repairs: Repairs) -> None:
    (node_repairs.verdicts / "healthy-node2").touch()
    repair = node_repairs.settle(node_repairs.request("node2"))
    assert repair["state"] == RepairState.RETURNED, repair
    assert [s["step"] for s in repair["steps"]] == ["take_out", "validate", "return"]
    assert "scontrol update NodeName=node2 State=DRAIN" in repair["steps"][0]["command"]
    assert repair["validation"]["verdict"] == "pass"
    assert resumed(clean_slurm, "node2")
    assert clean_slurm.node_state("node1").startswith("idle")


def test_validation_fails_and_the_node_is_held_drained(
    clean_slurm: SlurmCluster, node_repairs: Repairs
) -> None:
    repair = node_repairs.settle(node_repairs.request("node2"))
    assert repair["state"] == RepairState.HELD, repair
    assert repair["held_reason"].startswith("validation failed: validation `test -e ")
    assert repair["validation"]["exit_code"] == 1
    assert drained(clean_slurm, "node2")
    assert clean_slurm.node_reason("node2") == "nightshift: Xid 79 on GPU 3"
    # Released by a person: the node we drained is resumed.
    node_repairs.worker.release("node2", by="alice")
    assert node_repairs.settle(repair["id"])["state"] == RepairState.RELEASED
    assert resumed(clean_slurm, "node2")


def test_a_validation_past_its_timeout_is_stopped_and_fails(
    clean_slurm: SlurmCluster, node_repairs: Repairs
) -> None:
    repair = node_repairs.settle(node_repairs.request("node2", playbook="xid-slow"))
    assert repair["state"] == RepairState.HELD, repair
    assert (
        repair["held_reason"] == "validation failed: validation on node2 timed out after 2s: counts as failed"
    )
    assert drained(clean_slurm, "node2")
    # Stopped on the node: its process group is gone, and so is its directory.
    assert not Path(f"/tmp/nightshift-check-{repair['id']}").exists()
    assert not any(
        _cmdline(pid) == b"sleep\x0037\x00" for pid in Path("/proc").iterdir() if pid.name.isdigit()
    )


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_node_drained_by_someone_else_is_never_resumed(
    clean_slurm: SlurmCluster, node_repairs: Repairs
) -> None:
    clean_slurm.command(
        "scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=ops: reseating a cable"
    )
    (node_repairs.verdicts / "healthy-node2").touch()
    repair = node_repairs.settle(node_repairs.request("node2"))
    assert repair["state"] == RepairState.NOT_OURS, repair
    assert drained(clean_slurm, "node2")
    assert clean_slurm.node_reason("node2") == "ops: reseating a cable"


def test_lemon_rule_holds_the_node(clean_slurm: SlurmCluster, node_repairs: Repairs) -> None:
    (node_repairs.verdicts / "healthy-node1").touch()
    for _ in range(2):
        assert node_repairs.settle(node_repairs.request("node1"))["state"] == RepairState.RETURNED
    third = node_repairs.settle(node_repairs.request("node1"))
    assert third["state"] == RepairState.HELD
    assert third["held_reason"].startswith("lemon node: repaired 2 time(s) in the last 7d (limit 2)")
    assert drained(clean_slurm, "node1")
    assert node_repairs.worker.nodes()["held"][0]["node"] == "node1"


def test_a_reboot_slurm_refuses_holds_the_node(clean_slurm: SlurmCluster, node_repairs: Repairs) -> None:
    """The test cluster has no RebootProgram: slurmctld refuses `scontrol reboot`, and the node is held drained
    (never resumed unvalidated)."""
    repair = node_repairs.settle(node_repairs.request("node2", playbook="xid-reboot"))
    assert repair["state"] == RepairState.HELD, repair
    assert repair["held_reason"].startswith("repair step 1 failed: `scontrol reboot ASAP nextstate=DOWN")
    assert drained(clean_slurm, "node2")


def test_dcgmi_verdict_follows_the_injected_fault(
    clean_slurm: SlurmCluster, node_repairs: Repairs, sim_cluster: SimCluster
) -> None:
    """The simulator's dcgmi on the node (over SSH): an Xid 79 fails the software test and the node is held;
    once the fault is cleared (the GPU reset) the next repair validates and resumes it."""
    clean_slurm.attach_sim(sim_cluster.state_dir)
    try:
        faults.inject_xid(sim_cluster.state_dir, "node2", gpu=3, xid=79)
        held = node_repairs.settle(node_repairs.request("node2", playbook="xid-dcgmi"))
        assert held["state"] == RepairState.HELD, held
        assert held["validation"]["exit_code"] == 226
        assert "Detected XID 79 for GPU 3" in held["validation"]["output"]
        assert drained(clean_slurm, "node2")
        node_repairs.worker.release("node2", by="alice")
        node_repairs.settle(held["id"])
        faults.clear(sim_cluster.state_dir, node="node2")
        passed = node_repairs.settle(node_repairs.request("node2", playbook="xid-dcgmi"))
        assert passed["state"] == RepairState.RETURNED, passed
        assert "Successfully ran diagnostic" in passed["validation"]["output"]
        assert resumed(clean_slurm, "node2")
    finally:
        clean_slurm.attach_sim(None)
