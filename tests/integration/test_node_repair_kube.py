"""The node repair lifecycle on a real kube-apiserver: cordon -> a validation pod pinned to the node (the test plays
its kubelet: tests/fixtures/fake_kubelet.py) -> uncordon, or held cordoned; a node someone else cordoned is never
uncordoned; the share of the node pool bounds how many are out at once."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.clients import Clients
from app.domain.clock import SystemClock
from app.domain.states import RepairState
from tests.fakes import node_repair_playbook
from tests.fixtures.fake_kubelet import FakeKubelet
from tests.fixtures.kube import KubeAdmin, KubeCluster
from tests.worlds import World

pytestmark = pytest.mark.integration

GRANTS = ("kubernetes.cordon_node", "kubernetes.validate_node", "kubernetes.uncordon_node")
POOL_LABEL = "nightshift.test/pool"
# As the shipped gpu-xid playbook writes it: no `run`, which the repair sets to its id (the pod's name).
PLAYBOOK = node_repair_playbook(
    "xid-k8s",
    "kubernetes",
    '{validate: {action: kubernetes.validate_node, with: {node: "{{ node.name }}", timeout_seconds: 30}}}',
)


class Repairs(World):
    """The repair worker on the test apiserver; the test plays the kubelet of the nodes in ``exit_codes``."""

    admin: KubeAdmin
    kubelet: FakeKubelet
    namespace: str
    exit_codes: dict[str, int]

    def request(self, node: str, playbook: str | None = None) -> int:  # type: ignore[override]
        return super().request(node, "kubernetes", playbook)

    def settle(self, *repair_ids: int, timeout: float = 60) -> list[dict[str, Any]]:
        """Work (and play the kubelet) until every repair is held or settled, or is waiting on a guard."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.worker.work_once("it")
            self.kubelet.finish_validation_pods(self.admin, self.namespace, self.exit_codes)
            rows = [self.row(r) for r in repair_ids]
            if all(r["next_run_at"] is None or r["state"] == RepairState.REQUESTED for r in rows):
                return rows
            time.sleep(0.2)
        raise AssertionError(
            f"repairs {repair_ids} did not settle: {[self.row(r)['state'] for r in repair_ids]}"
        )


@pytest.fixture
def node_repairs(
    kube_cluster: KubeCluster,
    kube_admin: KubeAdmin,
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
    tmp_path: Path,
) -> Iterator[Repairs]:
    settings = kube_cluster.settings()
    settings.data_dir = str(tmp_path / "var")
    settings.repair.validation_namespace = kube_namespace
    settings.repair.poll_seconds = 1
    settings.repair.return_timeout_seconds = 30
    settings.guards.node_pool_label = POOL_LABEL
    settings.guards.blast_radius_max_share = 0.5
    clients = Clients(settings)
    bench = Repairs(settings, playbooks=PLAYBOOK, grants=GRANTS, clients=clients, clock=SystemClock())
    bench.admin, bench.kubelet, bench.namespace, bench.exit_codes = (
        kube_admin,
        fake_kubelet,
        kube_namespace,
        {},
    )
    yield bench
    clients.close()
    bench.close()


def make_node(admin: KubeAdmin, kubelet: FakeKubelet, pool: str, **options: Any) -> str:
    name = admin.create_node("gpu", kubelet_port=kubelet.port, **options)
    admin.merge_patch("v1", "Node", name, patch={"metadata": {"labels": {POOL_LABEL: pool}}})
    return name


def cordon_state(admin: KubeAdmin, node: str) -> tuple[bool, Mapping[str, str]]:
    found = admin.node(node)
    return bool(found["spec"].get("unschedulable")), found["metadata"].get("annotations") or {}


def test_validation_passes_and_the_node_is_uncordoned(node_repairs: Repairs) -> None:
    node = make_node(node_repairs.admin, node_repairs.kubelet, "pool-a")
    node_repairs.exit_codes[node] = 0
    [repair] = node_repairs.settle(node_repairs.request(node, playbook="xid-k8s"))
    assert repair["state"] == RepairState.RETURNED, repair
    assert [s["step"] for s in repair["steps"]] == ["take_out", "validate", "return"]
    validation = repair["validation"]
    assert (validation["verdict"], validation["exit_code"]) == ("pass", 0)
    assert validation["output"] == "validation output\n"  # read through the apiserver from the kubelet
    unschedulable, annotations = cordon_state(node_repairs.admin, node)
    assert not unschedulable and "nightshift.io/cordoned-by" not in annotations
    # The pod ran pinned to the node, with the default command, and was deleted once read.
    pod = f"nightshift-validate-{node}-{repair['id']}"
    assert f" {pod} spec.nodeName={node} " in validation["command"]
    assert node_repairs.admin.pod_or_none(node_repairs.namespace, pod) is None


def test_validation_fails_and_the_node_stays_cordoned(node_repairs: Repairs) -> None:
    node = make_node(node_repairs.admin, node_repairs.kubelet, "pool-a")
    node_repairs.exit_codes[node] = 226
    [repair] = node_repairs.settle(node_repairs.request(node))
    assert repair["state"] == RepairState.HELD, repair
    assert repair["held_reason"] == (
        f"validation failed: validation pod nightshift-validate-{node}-{repair['id']} failed on {node}: exit code 226"
    )
    unschedulable, annotations = cordon_state(node_repairs.admin, node)
    assert unschedulable and annotations["nightshift.io/cordoned-by"] == "nightshift"


def test_a_node_cordoned_by_someone_else_is_never_uncordoned(node_repairs: Repairs) -> None:
    node = make_node(
        node_repairs.admin, node_repairs.kubelet, "pool-a", unschedulable=True,
        annotations={"ops.example/why": "firmware"},
    )  # fmt: skip
    node_repairs.exit_codes[node] = 0
    [repair] = node_repairs.settle(node_repairs.request(node))
    assert repair["state"] == RepairState.NOT_OURS, repair
    unschedulable, annotations = cordon_state(node_repairs.admin, node)
    assert unschedulable and "nightshift.io/cordoned-by" not in annotations


def test_the_pool_share_holds_the_second_node_of_a_pool_of_two(node_repairs: Repairs) -> None:
    pool = f"pool-{time.monotonic_ns()}"
    first, second = (make_node(node_repairs.admin, node_repairs.kubelet, pool) for _ in range(2))
    node_repairs.exit_codes.update({first: 226, second: 0})
    first_id = node_repairs.request(first)
    node_repairs.settle(first_id)
    second_id = node_repairs.request(second)
    [waiting] = node_repairs.settle(second_id)
    assert waiting["state"] == RepairState.REQUESTED
    assert waiting["held_reason"].startswith(f"1 of the 2 nodes of pool {POOL_LABEL}={pool} taken out")
    assert not cordon_state(node_repairs.admin, second)[0]
