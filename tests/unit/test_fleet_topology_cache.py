"""The live topology's cache (app/engine/fleet_topology.py), with a fake clock and the Slurm host at our command
seam: read once a refresh interval, a failed read keeps the last good topology and says why once, the scheduler's
nodes check a topology file. (Read from the real Slurm and kube-apiserver: tests/integration/test_fleet_topology.py.)"""

from __future__ import annotations

from app import build_engine
from app.clients import Clients
from app.clients.slurm import SlurmClient
from app.config import Settings
from app.store import records
from tests.fakes import FakeClock, FakeSlurmHost

LEAVES = "SwitchName=leaf0 Level=0 Nodes=n[1-2]\nSwitchName=leaf1 Level=0 Nodes=n[3-4]\n"


def engine_with(tmp_path, host: FakeSlurmHost, **fleet):
    settings = Settings(data_dir=str(tmp_path / "data"))
    settings.slurm.host = "slurm-login"
    for key, value in fleet.items():
        setattr(settings.fleet, key, value)
    clients = Clients(settings, slurm=SlurmClient(host))
    return build_engine(settings, clock=FakeClock(), clients=clients)


def ledger(engine) -> list[str]:
    with engine.deps.store.read() as conn:
        return [r.message for r in records.iter_ledger(conn) if r.kind == "fleet_topology"]


def test_the_slurm_topology_is_read_once_a_refresh_interval_and_a_failed_read_keeps_the_last(tmp_path):
    host = FakeSlurmHost("n1", "n2", "n3", "n4", topology=LEAVES)
    engine = engine_with(tmp_path, host, slurm_topology=True, topology_refresh_seconds=600)
    topology = engine.fleet.topology
    assert topology.domains[("switch", "leaf1")].nodes == {"n3", "n4"}
    assert topology.addresses["10.1.0.2"] == "n2"  # sinfo's NodeAddr
    reads = len(host.commands)
    engine.deps.clock.advance(599)  # type: ignore[attr-defined]
    assert engine.fleet.topology == topology and len(host.commands) == reads  # cached
    host.down = True
    for _ in range(3):
        engine.deps.clock.advance(601)  # type: ignore[attr-defined]
        assert engine.fleet.topology == topology  # the last good one
    (refused,) = ledger(engine)  # said once, not once a read
    assert "fleet topology not read, the last one kept (2 domains)" in refused
    assert "connection refused" in engine.fleet.source.view()["error"]
    host.down = False
    engine.deps.clock.advance(601)  # type: ignore[attr-defined]
    assert engine.fleet.topology.domains == topology.domains and engine.fleet.source.view()["error"] is None
    assert ledger(engine)[-1] == "fleet topology read again: 2 domains"


def test_without_a_topology_plugin_slurm_gives_no_domains_and_no_error(tmp_path):
    engine = engine_with(tmp_path, FakeSlurmHost("n1"), slurm_topology=True)
    assert engine.fleet.topology.domains == {} and engine.fleet.source.view()["error"] is None


def test_a_topology_file_is_checked_against_the_nodes_slurm_knows(tmp_path):
    path = tmp_path / "topology.conf"
    path.write_text("SwitchName=leaf0 Nodes=n[1-2]\nSwitchName=leaf1 Nodes=n[3-5]\n")
    engine = engine_with(tmp_path, FakeSlurmHost("n1", "n2", "n3", "n4"), topology_file=str(path))
    assert engine.fleet.topology.domains == {}  # refused whole: n5 is unknown
    (refused,) = ledger(engine)
    assert refused == (
        f"fleet.topology_file refused, its switches not used: {path}:2: 1 node(s) the scheduler does not know: n5"
    )
