"""Fleet incidents: when the failing jobs of a window share one cause, one incident for the cause. Pure: no I/O.

A storage outage under 125 jobs is one fault, not 125: requeueing each job restarts it into the outage. The jobs'
incidents that fail within ``fleet.window_seconds`` of each other are compared (:func:`shared_cause`): the same
shared-cause diagnosis (storage I/O, an object store, the file system) in ``fleet.min_jobs`` jobs or more, or
culprits that are all behind one leaf switch, rack or block (a :class:`app.topology.Domain`). Such a cause gets one
fleet record, one notice and at most one page; the jobs' recoveries are held (never requeued into the outage)
until the cause clears (their alerts resolve) or a person releases it, then released together, each after a
jitter (:func:`release_delay`) so that they do not restart in one stampede.

The storm guard (:func:`storm_tripped`) counts job restarts across the fleet within ``fleet.storm_window_seconds``:
past ``fleet.storm_max_restarts`` no job is restarted until the window allows one again (a person may act).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.errors import ConfigError
from app.topology import Domain, Topology

# Diagnosis categories whose cause lies outside the job's nodes, shared by every job that uses it.
SHARED_CATEGORIES = frozenset({"storage_io", "object_store_timeout"})


@dataclass
class FleetSettings:
    """When several jobs' failures are one fleet incident, and how many job restarts the fleet allows."""

    # Job failures this close together are compared for a shared cause.
    window_seconds: int = 300
    # This many jobs failing with the same shared-cause diagnosis in the window are one fleet incident.
    min_jobs: int = 3
    # Held jobs are released over this many seconds once the cause clears (each at a stable jitter).
    release_jitter_seconds: int = 120
    # A held job is looked at again this often (cause cleared? released by a person?).
    recheck_seconds: int = 30
    # Job restarts across the fleet within storm_window_seconds; past it no job is restarted (0: no limit).
    storm_max_restarts: int = 20
    storm_window_seconds: int = 600
    # Slurm's topology.conf (or saved `scontrol show topology` output): leaf switches for blame. None: none.
    topology_file: str | None = None
    # YAML mapping of node name to the addresses its peers log (IP, GID, "node:mlx5_N"): lost peers to nodes.
    addresses_file: str | None = None
    # A leaf or rack larger than this is refused at load (a blamed domain is excluded whole).
    max_domain_nodes: int = 1024

    def __post_init__(self) -> None:
        for name in ("window_seconds", "recheck_seconds", "storm_window_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= 86_400:
                raise ConfigError(f"fleet.{name}: 1..86400 seconds, got {value!r}")
        if not isinstance(self.min_jobs, int) or not 2 <= self.min_jobs <= 100_000:
            raise ConfigError(f"fleet.min_jobs: 2..100000, got {self.min_jobs!r}")
        if not isinstance(self.release_jitter_seconds, int) or not 0 <= self.release_jitter_seconds <= 3600:
            raise ConfigError(f"fleet.release_jitter_seconds: 0..3600, got {self.release_jitter_seconds!r}")
        if not isinstance(self.storm_max_restarts, int) or self.storm_max_restarts < 0:
            raise ConfigError(f"fleet.storm_max_restarts: must be >= 0, got {self.storm_max_restarts!r}")
        if not isinstance(self.max_domain_nodes, int) or not 1 <= self.max_domain_nodes <= 16_384:
            raise ConfigError(f"fleet.max_domain_nodes: 1..16384, got {self.max_domain_nodes!r}")


@dataclass(frozen=True)
class JobFailure:
    """One job incident as the fleet sees it."""

    incident_id: int
    job: str
    opened_at: datetime
    category: str | None  # the diagnosis category (before it, the alert's error_class), None: unknown
    culprits: frozenset[str] = frozenset()
    diagnosed: bool = True


@dataclass(frozen=True)
class SharedCause:
    """A cause several jobs share: ``key`` names it (one fleet record per key)."""

    key: str
    kind: str  # "storage" or the domain's kind ("switch", "rack", "block")
    summary: str
    incidents: tuple[int, ...]


def shared_cause(
    failure: JobFailure,
    others: Iterable[JobFailure],
    topology: Topology,
    settings: FleetSettings,
    max_culprits: int = 2,
) -> SharedCause | None:
    """The cause ``failure`` shares with the other open job failures of its window, or None. Culprits make a
    domain the cause when, with those of the other jobs behind it, they are more than ``max_culprits`` nodes or
    the jobs are ``min_jobs`` or more."""
    window = timedelta(seconds=settings.window_seconds)
    near = [f for f in others if f.job != failure.job and abs(f.opened_at - failure.opened_at) <= window]
    if failure.category in SHARED_CATEGORIES:
        same = [f for f in near if f.category == failure.category]
        if len(same) + 1 >= settings.min_jobs:
            members = tuple(sorted({failure.incident_id, *(f.incident_id for f in same)}))
            return SharedCause(
                key=f"{failure.category}",
                kind="storage",
                summary=f"{len(members)} jobs failed with {failure.category} within "
                f"{settings.window_seconds}s: one shared cause outside their nodes",
                incidents=members,
            )
    if not failure.culprits:
        return None
    domain = topology.smallest_covering(failure.culprits)
    if domain is None:
        return None
    same_domain = [f for f in near if f.culprits and f.culprits <= domain.nodes]
    suspects = failure.culprits.union(*(f.culprits for f in same_domain))
    if len(suspects) <= max_culprits and len(same_domain) + 1 < settings.min_jobs:
        return None  # a few nodes' own faults, excluded as nodes
    members = tuple(sorted({failure.incident_id, *(f.incident_id for f in same_domain)}))
    return SharedCause(
        key=f"{domain.kind}:{domain.name}",
        kind=domain.kind,
        summary=f"{len(members)} job(s) with culprits all behind {domain.label} ({len(domain.nodes)} nodes)",
        incidents=members,
    )


def node_domain(
    node: str, failing: Iterable[str], topology: Topology, max_nodes: int, max_domain_nodes: int
) -> Domain | None:
    """The smallest domain of ``node`` in which more than ``max_nodes`` of the ``failing`` nodes (``node``'s
    included) failed, no larger than ``max_domain_nodes``: then the domain (a leaf, a rack) is the suspect, not the
    nodes. None: the node's own fault."""
    down = {node, *failing}
    for domain in topology.of(node):
        if len(domain.nodes) > max_domain_nodes:
            return None
        if len(down & domain.nodes) > max_nodes:
            return domain
    return None


def may_share(failure: JobFailure, others: Iterable[JobFailure], settings: FleetSettings) -> bool:
    """Whether ``failure`` could still turn out to share its cause once the other jobs of its window are
    diagnosed: enough of them are undiagnosed, or diagnosed with its category, to make ``min_jobs``."""
    if failure.category not in SHARED_CATEGORIES:
        return False
    window = timedelta(seconds=settings.window_seconds)
    near = [f for f in others if f.job != failure.job and abs(f.opened_at - failure.opened_at) <= window]
    pending = [f for f in near if not f.diagnosed or f.category == failure.category]
    return any(not f.diagnosed for f in near) and len(pending) + 1 >= settings.min_jobs


def release_delay(incident_id: int, jitter_seconds: int) -> timedelta:
    """A stable delay in [0, jitter_seconds) for a held job's release, spread by its incident id."""
    if jitter_seconds <= 0:
        return timedelta(0)
    digest = hashlib.sha256(str(incident_id).encode()).digest()
    return timedelta(seconds=int.from_bytes(digest[:4], "big") % jitter_seconds)


def storm_tripped(restarts: Sequence[datetime], now: datetime, settings: FleetSettings) -> bool:
    """Whether the fleet has restarted ``storm_max_restarts`` jobs or more within the storm window."""
    if settings.storm_max_restarts == 0:
        return False
    since = now - timedelta(seconds=settings.storm_window_seconds)
    return sum(1 for at in restarts if at > since) >= settings.storm_max_restarts
