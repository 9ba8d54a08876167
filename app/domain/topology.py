"""The fleet's topology (which nodes share a leaf switch, a rack, a block) and blame by it. Pure: no I/O.

Read from Slurm's ``topology.conf`` (topology/tree: ``SwitchName=s0 Nodes=gpu[00-63]``, ``SwitchName=s2
Switches=s[0-1]``; topology/block: ``BlockName=b1 Nodes=gpu[00-17]``, ``BlockSizes=...``), from ``scontrol show
topology`` (the same keys, plus ``Level`` and, on upper switches, every node below them; blocks as
``BlockName=b1 BlockIndex=0 Nodes=... BlockSize=18`` and ``AggregatedBlock=...`` for the larger blocks made of
them), or from Kubernetes node labels named by settings (rack, block, switch). Every node is in at most one
*domain* of each kind (its leaf switch, its rack, its base block); upper switches are domains of kind ``switch``
too, holding the nodes of the switches below them, and aggregated blocks of kind ``block``.

Blame (:func:`blame`) names the smallest set that explains the evidence: the nodes that failed themselves (an Xid,
a node down, a silent exporter) and the peers that ranks lost (their addresses mapped to nodes by
:func:`peer_nodes`). The nodes of ranks that merely *logged* a peer's failure are never suspects. A few suspects
are excluded as nodes; more, all behind one domain, make the domain the culprit (a leaf's or a rack's nodes); more
still, or a domain larger than the limit, and nothing is excluded: one fleet incident, and a person.

Bad input is refused when the topology is read, with ``source:line``: a switch naming an unknown switch, switches
that loop, a node under two leaves, a leaf with more nodes than ``max_switch_nodes``, nodes the scheduler does not
know (when the caller passes the known nodes).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from app.domain.hostlist import expand_hostlist

# A leaf (or rack) holding more nodes than this is refused at load: a blamed domain is excluded whole.
MAX_SWITCH_NODES = 1024
MAX_SWITCHES = 100_000
MAX_LINE = 100_000  # characters of one topology line


class TopologyError(ValueError):
    """A topology that cannot be used, with where (``source:line``) and why."""


@dataclass(frozen=True)
class Domain:
    kind: str  # "switch", "rack" or "block"
    name: str
    nodes: frozenset[str]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Topology:
    """Domains by (kind, name), and each node's domains, smallest first."""

    domains: Mapping[tuple[str, str], Domain] = field(default_factory=dict)
    addresses: Mapping[str, str] = field(default_factory=dict)  # IP, GID or "node:mlx5_N" -> node

    def of(self, node: str) -> list[Domain]:
        """The domains ``node`` is in, smallest first."""
        return sorted(
            (d for d in self.domains.values() if node in d.nodes),
            key=lambda d: (len(d.nodes), d.kind, d.name),
        )

    def smallest_covering(self, nodes: Iterable[str]) -> Domain | None:
        """The smallest domain holding every one of ``nodes``, or None."""
        wanted = set(nodes)
        if not wanted:
            return None
        first = next(iter(wanted))
        return next((d for d in self.of(first) if wanted <= d.nodes), None)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset().union(*(d.nodes for d in self.domains.values())) if self.domains else frozenset()


EMPTY = Topology()


# --- reading -----------------------------------------------------------------------------------------------------

_PAIR = re.compile(r"(\w+)=(\S+)")


def parse_slurm(
    text: str,
    source: str = "topology.conf",
    known_nodes: Iterable[str] | None = None,
    max_switch_nodes: int = MAX_SWITCH_NODES,
) -> Topology:
    """A topology from ``topology.conf`` or ``scontrol show topology`` output (the same ``key=value`` lines):
    switches (topology/tree) and blocks (topology/block). Raises :class:`TopologyError` with ``source:line``."""
    direct: dict[str, frozenset[str]] = {}
    children: dict[str, tuple[str, ...]] = {}
    blocks: dict[str, frozenset[str]] = {}
    aggregated: dict[str, frozenset[str]] = {}
    where: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        at = f"{source}:{number}"
        if len(raw) > MAX_LINE:
            raise TopologyError(f"{at}: line longer than {MAX_LINE} characters")
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pairs = {k.lower(): v for k, v in _PAIR.findall(line)}
        if set(pairs) == {"blocksizes"}:
            continue  # the block plugin's sizes: no domain
        kind = next((k for k in ("switchname", "blockname", "aggregatedblock") if k in pairs), None)
        if kind is None:
            raise TopologyError(f"{at}: expected SwitchName= or BlockName=..., got {line[:80]!r}")
        name = pairs[kind]
        key = name if kind == "switchname" else f"block {name}"
        if key in where:
            raise TopologyError(f"{at}: {_what(kind)} {name} defined twice (first at {where[key]})")
        if len(where) >= MAX_SWITCHES:
            raise TopologyError(f"{at}: more than {MAX_SWITCHES} switches and blocks")
        where[key] = at
        if kind != "switchname":
            members = _members(pairs, at, name, _what(kind), max_switch_nodes, base=kind == "blockname")
            (blocks if kind == "blockname" else aggregated)[name] = members
            continue
        below = pairs.get("switches")
        if below:
            try:
                children[name] = tuple(expand_hostlist(below))
            except ValueError as exc:
                raise TopologyError(f"{at}: Switches={below[:80]}: {exc}") from None
            continue  # an upper switch: its nodes are those of the switches below (scontrol lists them too)
        if not pairs.get("nodes"):
            raise TopologyError(f"{at}: switch {name} has neither Nodes= nor Switches=")
        direct[name] = _members(pairs, at, name, "switch", max_switch_nodes, base=True)
    topology = _assemble(direct, children, where, known_nodes, max_switch_nodes)
    return _with_blocks(topology, blocks, aggregated, where, known_nodes)


def _what(kind: str) -> str:
    return {"switchname": "switch", "blockname": "block", "aggregatedblock": "aggregated block"}[kind]


def _members(
    pairs: Mapping[str, str], at: str, name: str, what: str, limit: int, base: bool
) -> frozenset[str]:
    """The nodes of one switch or block line. A leaf or a base block holds at most ``limit`` nodes; an aggregated
    block, made of base blocks, may hold more (it is never excluded whole past the limit: :func:`blame`)."""
    nodes = pairs.get("nodes")
    if not nodes:
        raise TopologyError(f"{at}: {what} {name} has no Nodes=")
    try:
        return frozenset(expand_hostlist(nodes, limit=limit if base else 16 * limit))
    except ValueError as exc:
        raise TopologyError(
            f"{at}: {what} {name}: Nodes={nodes[:80]}: {exc} (at most {limit} nodes a leaf)"
        ) from None


def _with_blocks(
    topology: Topology,
    blocks: Mapping[str, frozenset[str]],
    aggregated: Mapping[str, frozenset[str]],
    where: Mapping[str, str],
    known_nodes: Iterable[str] | None,
) -> Topology:
    """``topology`` with the block plugin's blocks (kind ``block``): a node in at most one base block."""
    block_of: dict[str, str] = {}
    for name, members in blocks.items():
        for node in members:
            if node in block_of:
                raise TopologyError(
                    f"{where['block ' + name]}: node {node} is in blocks {block_of[node]} and {name}"
                )
            block_of[node] = name
    if known_nodes is not None:
        known = set(known_nodes)
        for name, members in [*blocks.items(), *aggregated.items()]:
            unknown = sorted(members - known)
            if unknown:
                raise TopologyError(
                    f"{where['block ' + name]}: {len(unknown)} node(s) the scheduler does not know: "
                    f"{', '.join(unknown[:8])}"
                )
    domains = dict(topology.domains)
    for name, members in [*blocks.items(), *aggregated.items()]:
        domains[("block", name)] = Domain("block", name, members)
    return Topology(domains, topology.addresses)


def _assemble(
    direct: Mapping[str, frozenset[str]],
    children: Mapping[str, tuple[str, ...]],
    where: Mapping[str, str],
    known_nodes: Iterable[str] | None,
    max_switch_nodes: int,
) -> Topology:
    leaf_of: dict[str, str] = {}
    for name, members in direct.items():
        if len(members) > max_switch_nodes:
            raise TopologyError(
                f"{where[name]}: switch {name} has {len(members)} nodes (at most {max_switch_nodes})"
            )
        for node in members:
            if node in leaf_of:
                raise TopologyError(f"{where[name]}: node {node} is under {leaf_of[node]} and {name}")
            leaf_of[node] = name
    for name, below in children.items():
        for child in below:
            if child not in direct and child not in children:
                raise TopologyError(f"{where[name]}: switch {name} names unknown switch {child}")
    resolved: dict[str, frozenset[str]] = dict(direct)

    def nodes_of(name: str, path: tuple[str, ...]) -> frozenset[str]:
        if name in path:
            loop = " -> ".join([*path[path.index(name) :], name])
            raise TopologyError(f"{where[name]}: switches loop: {loop}")
        if name not in resolved:
            resolved[name] = frozenset().union(*(nodes_of(c, (*path, name)) for c in children[name]))
        return resolved[name]

    for name in children:
        nodes_of(name, ())
    if known_nodes is not None:
        unknown = sorted(set(leaf_of) - set(known_nodes))
        if unknown:
            raise TopologyError(
                f"{where[leaf_of[unknown[0]]]}: {len(unknown)} node(s) the scheduler does not know: "
                f"{', '.join(unknown[:8])}"
            )
    return Topology({("switch", n): Domain("switch", n, members) for n, members in resolved.items()})


def from_labels(
    nodes: Mapping[str, Mapping[str, str]],
    label_names: Mapping[str, str],
    max_domain_nodes: int = MAX_SWITCH_NODES,
) -> Topology:
    """A topology from Kubernetes node labels: ``label_names`` maps a kind (rack, block, switch) to the label that
    holds it, e.g. ``{"rack": "topology.kubernetes.io/rack"}``. A domain larger than ``max_domain_nodes`` is refused."""
    members: dict[tuple[str, str], set[str]] = {}
    for node, labels in nodes.items():
        for kind, label in label_names.items():
            value = labels.get(label)
            if value:
                members.setdefault((kind, value), set()).add(node)
    for (kind, name), held in members.items():
        if len(held) > max_domain_nodes:
            raise TopologyError(
                f"node label {label_names[kind]}={name}: {len(held)} nodes (at most {max_domain_nodes} a {kind})"
            )
    return Topology({key: Domain(key[0], key[1], frozenset(held)) for key, held in members.items()})


def with_addresses(topology: Topology, addresses: Mapping[str, str]) -> Topology:
    """``topology`` with a map of peer addresses (IP, GID, ``node:mlx5_N``) to node names."""
    return Topology(topology.domains, {_normal(a): n for a, n in addresses.items()})


# --- peers named in logs ------------------------------------------------------------------------------------------

_IPV4 = re.compile(r"(?<![\w.:])(\d{1,3}(?:\.\d{1,3}){3})(?=[<:\]\s,;)]|$)")
_IPV6 = re.compile(r"(?<![\w:])((?:[0-9a-fA-F]{1,4}:){2,7}[0-9a-fA-F]{1,4})(?![\w:])")
_PEER_CONTEXT = re.compile(r"peer|remote|connect|rank|address|\[[0-9a-fA-F:.]+\]", re.IGNORECASE)
_MLX = re.compile(r"\b([\w.-]+):(mlx5_\d+)(?::\d+)?\b")


def _normal(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address


_LOGGER = re.compile(r"^\s*([A-Za-z0-9][\w.-]*):\d+:\d+ ")  # NCCL's "host:pid:tid " line prefix


def loggers(log: str) -> set[str]:
    """The hosts that wrote NCCL lines of ``log`` (their ``host:pid:tid`` prefix): reporters, never culprits for
    what they report."""
    return {m.group(1) for line in log.splitlines() if (m := _LOGGER.match(line))}


def peer_nodes(log: str, topology: Topology, reporters: Iterable[str] = ()) -> list[str]:
    """The nodes whose addresses the lines of ``log`` that speak of a peer name (NCCL's ``Got completion from
    peer 10.0.1.7<47534>``, gloo's ``[10.0.1.7]:29500``, a GID, ``node:mlx5_3``), in order, known ones only,
    never one of ``reporters`` nor the host that wrote the line."""
    own = set(reporters)
    found: list[str] = []
    for line in log.splitlines():
        if not _PEER_CONTEXT.search(line):
            continue
        writer = _LOGGER.match(line)
        line_own = own | ({writer.group(1)} if writer else set())
        candidates = [m.group(1) for m in _IPV4.finditer(line)] + [m.group(1) for m in _IPV6.finditer(line)]
        candidates += [f"{m.group(1)}:{m.group(2)}" for m in _MLX.finditer(line)]
        for address in candidates:
            node = topology.addresses.get(_normal(address))
            if node and node not in line_own and node not in found:
                found.append(node)
    return found


# --- blame ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blame:
    """What to exclude and why; ``domain`` set: the suspects share it, and it is the culprit (a fleet cause)."""

    nodes: tuple[str, ...] = ()
    domain: Domain | None = None
    refused: str | None = None  # set: exclude nothing, one fleet incident and a person
    reason: str = ""

    @property
    def shared(self) -> bool:
        return self.domain is not None or self.refused is not None


def blame(
    failed: Iterable[str],
    lost_peers: Iterable[str],
    topology: Topology,
    max_nodes: int,
    max_domain_nodes: int = MAX_SWITCH_NODES,
) -> Blame:
    """The smallest set that explains the evidence: up to ``max_nodes`` suspect nodes as themselves; more, all
    behind one domain of at most ``max_domain_nodes`` nodes, that domain; else nothing, and a person."""
    suspects = sorted(set(failed) | set(lost_peers))
    if not suspects:
        return Blame(reason="no node failed and no peer was lost")
    if len(suspects) <= max_nodes:
        return Blame(nodes=tuple(suspects), reason=f"{len(suspects)} suspect node(s): {', '.join(suspects)}")
    domain = topology.smallest_covering(suspects)
    if domain is None:
        return Blame(
            refused=f"{len(suspects)} suspect nodes ({', '.join(suspects[:8])}) share no leaf, rack or block "
            f"in the topology: excluding none"
        )
    if len(domain.nodes) > max_domain_nodes:
        return Blame(
            refused=f"{len(suspects)} suspect nodes are all behind {domain.label}, whose {len(domain.nodes)} "
            f"nodes exceed the limit ({max_domain_nodes}): excluding none"
        )
    return Blame(
        nodes=tuple(sorted(domain.nodes)),
        domain=domain,
        reason=f"{len(suspects)} suspect nodes, all behind {domain.label} ({len(domain.nodes)} nodes)",
    )
