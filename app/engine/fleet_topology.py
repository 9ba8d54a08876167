"""Where the fleet's topology comes from (:mod:`app.domain.topology` parses): files, the Slurm host, Kubernetes node
labels.

``fleet.topology_file`` and ``fleet.addresses_file`` are read at start (a bad one is a :class:`ConfigError` with
its ``file:line``). The live sources are read by the worker when the topology is needed and the last read is older
than ``fleet.topology_refresh_seconds``, one read at a time (another thread meanwhile uses the last one):

- ``fleet.slurm_topology``: ``scontrol show topology`` (switches, blocks) and ``sinfo`` (every node, and its
  ``NodeAddr``: a peer address a log may name) over the Slurm client's SSH, in one round trip;
- ``fleet.node_labels``: the Kubernetes nodes (their labels: rack, block, switch; their ``InternalIP``), listed in
  pages of :data:`NODE_PAGE`, at most :data:`MAX_NODES`.

The nodes the scheduler knows check every topology read, the file's too: a topology naming a node the scheduler
does not know is refused whole, with where and why, and the last good one (or none) is kept; the refusal is in
the ledger (``fleet_topology``), in the log and in ``GET /api/v1/fleet``. A source that cannot be read keeps the last
good topology too. Bounded: every read by the client's timeouts, the nodes by :data:`MAX_NODES`, a leaf by
``fleet.max_domain_nodes``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from app.domain import fleet
from app.domain.errors import BackendError, ConfigError
from app.domain.states import LedgerKind
from app.domain.topology import (
    EMPTY,
    Domain,
    Topology,
    TopologyError,
    from_labels,
    parse_slurm,
    with_addresses,
)
from app.engine import transitions
from app.engine.deps import EngineDeps

log = logging.getLogger(__name__)

MAX_ADDRESSED_NODES = 100_000  # nodes in fleet.addresses_file
MAX_NODES = 100_000  # nodes listed from Kubernetes
NODE_PAGE = 1000


@dataclass
class TopologyStatus:
    """What the topology was read from, when, how large it is, and why the last read was refused (None: it was
    not)."""

    sources: list[str] = field(default_factory=list)
    refreshed_at: datetime | None = None
    error: str | None = None

    def view(self, topology: Topology) -> dict[str, Any]:
        return {
            "sources": self.sources,
            "domains": len(topology.domains),
            "nodes": len(topology.nodes),
            "addresses": len(topology.addresses),
            "refreshed_at": self.refreshed_at.isoformat() if self.refreshed_at else None,
            "error": self.error,
        }


class TopologySource:
    """The topology the settings name, read live where they say so, cached ``fleet.topology_refresh_seconds``."""

    def __init__(self, deps: EngineDeps):
        self.deps = deps
        settings = deps.settings.fleet
        self._file_text = _read(settings.topology_file) if settings.topology_file else None
        self._static = load_topology(settings)
        self.status = TopologyStatus(
            sources=[
                *(["topology_file"] if settings.topology_file else []),
                *(["addresses_file"] if settings.addresses_file else []),
                *(["scontrol show topology"] if settings.slurm_topology else []),
                *(["kubernetes node labels"] if settings.node_labels else []),
            ]
        )
        self._topology = self._static
        self._lock = threading.Lock()

    @property
    def live(self) -> bool:
        """Whether a scheduler is read: for its topology, or for the nodes it knows (the file's are checked)."""
        settings = self.deps.settings
        fleet_settings = settings.fleet
        checks_file = bool(fleet_settings.topology_file and settings.slurm.host)
        return fleet_settings.slurm_topology or bool(fleet_settings.node_labels) or checks_file

    def current(self) -> Topology:
        """The topology now: the last read, read again first when it is older than the refresh interval."""
        if not self.live:
            return self._static
        now = self.deps.clock.now()
        refresh = timedelta(seconds=self.deps.settings.fleet.topology_refresh_seconds)
        due = self.status.refreshed_at is None or now >= self.status.refreshed_at + refresh
        if due and self._lock.acquire(blocking=False):
            try:
                self._refresh(now)
            finally:
                self._lock.release()
        return self._topology

    def _refresh(self, now: datetime) -> None:
        self.status.refreshed_at = now
        try:
            topology, refused = self._read()
        except (BackendError, ConfigError, TopologyError) as exc:
            kept = len(self._topology.domains)
            self._tell(f"fleet topology not read, the last one kept ({kept} domains): {exc}")
            return
        if refused is not None:
            self._tell(f"fleet.topology_file refused, its switches not used: {refused}")
        elif self.status.error is not None:
            read = f"fleet topology read again: {len(topology.domains)} domains"
            self._ledger(read)
            self.status.error = None
        self._topology = topology

    def _tell(self, error: str) -> None:
        """Log and ledger ``error`` once (not again while it stays the same); the API shows it."""
        if error != self.status.error:
            log.warning("%s", error)
            self._ledger(error, {"error": error})
        self.status.error = error

    def _ledger(self, message: str, data: Mapping[str, Any] | None = None) -> None:
        with self.deps.store.transaction() as conn:
            transitions.note(conn, self.deps.clock.now(), None, LedgerKind.FLEET_TOPOLOGY, message, data)

    def _read(self) -> tuple[Topology, str | None]:
        """The topology from every live source and the file checked against the nodes they know; and why the
        file was refused (None: it was not, or there is none)."""
        settings = self.deps.settings.fleet
        domains: dict[tuple[str, str], Domain] = {}
        addresses: dict[str, str] = dict(self._static.addresses)
        known: set[str] = set()
        if settings.slurm_topology or (self._file_text is not None and self.deps.settings.slurm.host):
            text, nodes = self.deps.clients.slurm.topology(switches=settings.slurm_topology)
            known |= set(nodes)
            domains |= parse_slurm(
                text, "scontrol show topology", known_nodes=known, max_switch_nodes=settings.max_domain_nodes
            ).domains
            addresses |= {address: node for node, address in nodes.items() if address and address != node}
        if settings.node_labels:
            listed = self.deps.clients.kube.nodes_topology(MAX_NODES, NODE_PAGE)
            known |= set(listed)
            labelled = from_labels(
                {name: node["labels"] for name, node in listed.items()},
                settings.node_labels,
                settings.max_domain_nodes,
            )
            domains |= labelled.domains
            addresses |= {a: name for name, node in listed.items() for a in node["addresses"] if a != name}
        refused = None
        if self._file_text is not None:
            assert settings.topology_file is not None
            try:
                domains |= parse_slurm(
                    self._file_text,
                    settings.topology_file,
                    known_nodes=known,
                    max_switch_nodes=settings.max_domain_nodes,
                ).domains
            except TopologyError as exc:
                refused = str(exc)
        return with_addresses(Topology(domains), addresses), refused

    def view(self) -> dict[str, Any]:
        return self.status.view(self._topology)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"fleet.topology_file: {path}: {exc.strerror}") from None


def load_topology(settings: fleet.FleetSettings) -> Topology:
    """The topology the settings' files name (``fleet.topology_file``, ``fleet.addresses_file``), or none. A file
    that cannot be read or is malformed is a :class:`ConfigError` at start, with the file and line."""
    topology = EMPTY
    if settings.topology_file:
        text = _read(settings.topology_file)
        try:
            topology = parse_slurm(text, settings.topology_file, max_switch_nodes=settings.max_domain_nodes)
        except TopologyError as exc:
            raise ConfigError(f"fleet.topology_file: {exc}") from None
    if settings.addresses_file:
        topology = with_addresses(topology, _addresses(settings.addresses_file))
    return topology


def _addresses(path: str) -> Mapping[str, str]:
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"fleet.addresses_file: {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"fleet.addresses_file: {path}: invalid YAML: {exc}") from None
    if not isinstance(loaded, dict) or len(loaded) > MAX_ADDRESSED_NODES:
        raise ConfigError(f"fleet.addresses_file: {path}: a mapping of at most {MAX_ADDRESSED_NODES} nodes")
    addresses: dict[str, str] = {}
    for node, values in loaded.items():
        listed = values if isinstance(values, list) else [values]
        if not isinstance(node, str) or not all(isinstance(v, str) for v in listed) or len(listed) > 16:
            raise ConfigError(f"fleet.addresses_file: {path}: {node!r}: a node name and up to 16 addresses")
        for value in listed:
            if value in addresses and addresses[value] != node:
                raise ConfigError(
                    f"fleet.addresses_file: {path}: {value} is both {addresses[value]} and {node}"
                )
            addresses[value] = node
    return addresses
