"""app/domain/topology.py: topology.conf and `scontrol show topology` read, bad topologies refused, blame by
topology."""

from __future__ import annotations

import pytest

from app.domain.topology import (
    Topology,
    TopologyError,
    blame,
    from_labels,
    loggers,
    parse_slurm,
    peer_nodes,
    with_addresses,
)

CONF = """\
# two leaves under one spine
SwitchName=leaf0 Nodes=gpu[00-03] LinkSpeed=100
SwitchName=leaf1 Nodes=gpu[04-07]
SwitchName=spine Switches=leaf[0-1]
"""

# `scontrol show topology`: Level, and the upper switch's nodes listed too.
SHOW = """\
SwitchName=leaf0 Level=0 LinkSpeed=1 Nodes=gpu[00-03]
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu[04-07]
SwitchName=spine Level=1 LinkSpeed=1 Switches=leaf[0-1] Nodes=gpu[00-07]
"""


@pytest.mark.parametrize("text", [CONF, SHOW])
def test_switches_and_the_nodes_below_them(text):
    topo = parse_slurm(text)
    assert topo.domains[("switch", "leaf1")].nodes == {f"gpu0{i}" for i in range(4, 8)}
    assert topo.domains[("switch", "spine")].nodes == {f"gpu0{i}" for i in range(8)}
    assert [d.name for d in topo.of("gpu05")] == ["leaf1", "spine"]
    assert topo.smallest_covering(["gpu04", "gpu06"]).name == "leaf1"
    assert topo.smallest_covering(["gpu01", "gpu06"]).name == "spine"


@pytest.mark.parametrize(
    ("text", "known", "message"),
    [
        (
            "SwitchName=a Switches=b\nSwitchName=b Switches=a\n",
            None,
            "topology.conf:1: switches loop: a -> b -> a",
        ),
        ("SwitchName=a Switches=zz\n", None, "topology.conf:1: switch a names unknown switch zz"),
        (
            "SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n2\n",
            None,
            "topology.conf:2: node n2 is under a and b",
        ),
        (
            "SwitchName=a Nodes=n[1-2]\nSwitchName=a Nodes=n3\n",
            None,
            "topology.conf:2: switch a defined twice",
        ),
        ("Nodes=n1\n", None, "topology.conf:1: expected SwitchName= or BlockName="),
        (
            "BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n2\n",
            None,
            "topology.conf:2: node n2 is in blocks b1 and b2",
        ),
        ("BlockName=b1 BlockSize=4\n", None, "topology.conf:1: block b1 has no Nodes="),
        ("BlockName=b1 Nodes=n[1-2]\n", {"n1"}, "topology.conf:1: 1 node(s) the scheduler does not know: n2"),
        (
            "BlockName=b1 Nodes=n[1-2]\nBlockName=b1 Nodes=n3\n",
            None,
            "topology.conf:2: block b1 defined twice",
        ),
        ("SwitchName=a LinkSpeed=1\n", None, "topology.conf:1: switch a has neither Nodes= nor Switches="),
        (
            "SwitchName=a Nodes=n[1-3]\n",
            {"n1", "n2"},
            "topology.conf:1: 1 node(s) the scheduler does not know: n3",
        ),
        ("SwitchName=huge Nodes=n[0000-4999]\n", None, "topology.conf:1: switch huge"),
    ],
)
def test_bad_topologies_are_refused_at_load_with_where_and_why(text, known, message):
    with pytest.raises(TopologyError) as err:
        parse_slurm(text, known_nodes=known, max_switch_nodes=1024)
    assert str(err.value).startswith(message)


# topology/block: topology.conf, and `scontrol show topology` (plugins/topology/block: BlockName or AggregatedBlock,
# BlockIndex, Nodes, BlockSize).
BLOCKS_CONF = """\
BlockName=b1 Nodes=gpu[00-03]
BlockName=b2 Nodes=gpu[04-07]
BlockSizes=4,8
"""
BLOCKS_SHOW = """\
BlockName=b1 BlockIndex=0 Nodes=gpu[00-03] BlockSize=4
BlockName=b2 BlockIndex=1 Nodes=gpu[04-07] BlockSize=4
AggregatedBlock=b[1-2] BlockIndex=0 Nodes=gpu[00-07] BlockSize=8
"""


@pytest.mark.parametrize("text", [BLOCKS_CONF, BLOCKS_SHOW])
def test_slurm_blocks_are_domains(text):
    topo = parse_slurm(text)
    assert topo.domains[("block", "b2")].nodes == {f"gpu0{i}" for i in range(4, 8)}
    assert topo.smallest_covering(["gpu04", "gpu07"]).label == "block b2"
    covering = topo.smallest_covering(["gpu01", "gpu07"])
    assert (covering.label if covering else None) == ("block b[1-2]" if "Aggregated" in text else None)


def test_kubernetes_labels_make_racks_and_blocks_and_refuse_a_rack_of_thousands():
    labels = {f"n{i}": {"example.com/rack": f"r{i // 2}", "example.com/block": "b0"} for i in range(4)}
    topo = from_labels(labels, {"rack": "example.com/rack", "block": "example.com/block"})
    assert topo.smallest_covering(["n0", "n1"]).label == "rack r0"
    assert topo.smallest_covering(["n0", "n3"]).label == "block b0"
    many = {f"n{i}": {"rack": "r"} for i in range(3000)}
    with pytest.raises(TopologyError, match="rack=r: 3000 nodes"):
        from_labels(many, {"rack": "rack"})


TOPO = with_addresses(
    parse_slurm(CONF),
    {
        "10.0.0.4": "gpu04",
        "10.0.0.5": "gpu05",
        "fe80::a288:c2ff:fe00:6": "gpu06",
        "gpu07:mlx5_3": "gpu07",
        "10.0.0.1": "gpu01",
    },
)


@pytest.mark.parametrize(
    ("log", "reporters", "peers"),
    [
        # NCCL's lost IB completion names the peer, not the rank that logs it.
        (
            "gpu01:4242:4285 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
            "10.0.0.4<47534> with error 12, opcode 0, len 0, vendor err 129",
            ["gpu01"],
            ["gpu04"],
        ),
        # gloo's connection closed by the peer.
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[10.0.0.5]:29500",
            ["gpu01"],
            ["gpu05"],
        ),
        # a GID (IPv6 form) and an mlx5 port.
        ("NET/IB : peer GID fe80:0000:0000:0000:a288:c2ff:fe00:0006 unreachable", [], ["gpu06"]),
        ("NCCL WARN NET/IB : remote gpu07:mlx5_3:1 port error", [], ["gpu07"]),
        # the reporter's own address on the line is never its peer; unknown addresses are ignored.
        ("Got completion from peer 10.0.0.1<1> with error 12", ["gpu01"], []),
        ("Got completion from peer 192.168.9.9<1> with error 12", [], []),
        # a line that speaks of no peer names none (an IP in a URL of a checkpoint path).
        ("saved checkpoint to 10.0.0.4 share", [], []),
    ],
)
def test_peer_addresses_map_to_nodes(log, reporters, peers):
    assert peer_nodes(log, TOPO, reporters) == peers


@pytest.mark.parametrize(
    ("failed", "peers", "nodes", "domain", "refused"),
    [
        ([], [], (), None, False),
        # one lost peer: that node, never the rank that logged it
        ([], ["gpu05"], ("gpu05",), None, False),
        (["gpu05"], ["gpu05", "gpu06"], ("gpu05", "gpu06"), None, False),
        # more suspects than the limit, all behind leaf1: the leaf's nodes
        (["gpu04"], ["gpu05", "gpu06"], ("gpu04", "gpu05", "gpu06", "gpu07"), "leaf1", False),
        # behind two leaves: the spine is larger than the domain limit: nothing, a person
        (["gpu01"], ["gpu05", "gpu06"], (), None, True),
    ],
)
def test_blame_names_the_smallest_set_that_explains_the_evidence(failed, peers, nodes, domain, refused):
    result = blame(failed, peers, TOPO, max_nodes=2, max_domain_nodes=4)
    assert result.nodes == nodes
    assert (result.domain.name if result.domain else None) == domain
    assert (result.refused is not None) == refused
    assert result.shared == (domain is not None or refused)


def test_without_a_topology_many_suspects_exclude_nothing():
    result = blame(["a", "b", "c"], [], Topology(), max_nodes=2)
    assert result.nodes == () and "share no leaf" in result.refused


def test_the_host_that_wrote_a_line_is_a_reporter_never_its_own_peer():
    log = (
        "gpu05:4242:4285 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
        "10.0.0.4<47534> with error 12\n"
        "gpu04:4243:4286 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
        "10.0.0.5<47534> with error 12"
    )
    # Each names the other: both are peers someone lost, and both wrote lines.
    assert peer_nodes(log, TOPO) == ["gpu04", "gpu05"]
    assert loggers(log) == {"gpu04", "gpu05"}
    only = log.splitlines()[0]
    assert peer_nodes(only, TOPO) == ["gpu04"] and loggers(only) == {"gpu05"}
