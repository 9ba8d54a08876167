"""The fleet's topology read live: `scontrol show topology` and the nodes' NodeAddr from a real Slurm 22.05 over SSH
(its topology/tree: leaf0 = node[1-2], leaf1 = node[3-4] under a spine, sim/stack.py), and rack labels with the
InternalIP addresses of Nodes on a real kube-apiserver; a topology file naming nodes the scheduler does not know is
refused with where and why."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from app import build_engine
from app.clients import Clients
from app.config import Settings
from app.engine.fleet_topology import TopologySource
from app.store import records
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration


def engine_on(settings: Settings, tmp_path: Path):
    settings = dataclasses.replace(settings, data_dir=str(tmp_path / "data"))
    return build_engine(settings, clients=Clients(settings))


def test_the_slurm_topology_and_node_addresses_are_read_over_ssh(slurm_cluster: SlurmCluster, tmp_path: Path):
    settings = dataclasses.replace(slurm_cluster.settings)
    settings.fleet = dataclasses.replace(settings.fleet, slurm_topology=True)
    engine = engine_on(settings, tmp_path)
    topology = engine.fleet.topology
    assert topology.domains[("switch", "leaf0")].nodes == {"node1", "node2"}
    assert topology.domains[("switch", "leaf1")].nodes == {"node3", "node4"}
    assert topology.smallest_covering(["node1", "node4"]).name == "spine"  # type: ignore[union-attr]
    assert topology.addresses["127.0.0.3"] == "node3"  # its NodeAddr: a peer address a log may name
    assert engine.fleet.source.view()["error"] is None


def test_a_topology_file_naming_nodes_slurm_does_not_know_is_refused(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    path = tmp_path / "topology.conf"
    path.write_text("SwitchName=leaf0 Nodes=node[1-2]\nSwitchName=leaf9 Nodes=node9,node10\n")
    settings = dataclasses.replace(slurm_cluster.settings)
    settings.fleet = dataclasses.replace(settings.fleet, topology_file=str(path))
    engine = engine_on(settings, tmp_path)
    assert (
        engine.fleet.topology.domains == {}
    )  # refused whole: never a blame on what the scheduler does not know
    error = engine.fleet.source.view()["error"]
    assert f"{path}:2: 2 node(s) the scheduler does not know: node10, node9" in error
    with engine.deps.store.read() as conn:
        assert [r.kind for r in records.iter_ledger(conn)] == ["fleet_topology"]


def test_kubernetes_node_labels_make_racks_and_their_internal_ips_map_to_the_nodes(
    kube_cluster, kube_admin, tmp_path
):
    rack = f"r-{uuid.uuid4().hex[:6]}"
    names = []
    for index in range(3):
        name = kube_admin.create_node("rackmate")
        kube_admin.merge_patch("v1", "Node", name, patch={"metadata": {"labels": {"example.com/rack": rack}}})
        address = {"type": "InternalIP", "address": f"10.77.{index}.{len(rack)}"}
        kube_admin.merge_patch("v1", "Node", name, status=True, patch={"status": {"addresses": [address]}})
        names.append(name)
    settings = kube_cluster.settings()
    settings.fleet = dataclasses.replace(settings.fleet, node_labels={"rack": "example.com/rack"})
    engine = engine_on(settings, tmp_path)
    source: TopologySource = engine.fleet.source
    topology = source.current()
    assert topology.domains[("rack", rack)].nodes == set(names)
    assert topology.addresses[f"10.77.1.{len(rack)}"] == names[1]
    assert source.view()["sources"] == ["kubernetes node labels"]
