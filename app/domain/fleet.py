"""Fleet incidents: when the failing jobs of a window share one cause, one incident for the cause. Pure: no I/O.

A storage outage under 125 jobs is one fault, not 125: requeueing each job restarts it into the outage. The jobs'
incidents that fail within ``fleet.window_seconds`` of each other are compared (:func:`shared_cause`): the same
shared-cause diagnosis (storage I/O, an object store, the file system) in ``fleet.min_jobs`` jobs or more, or
culprits that are all behind one leaf switch, rack or block (a :class:`app.domain.topology.Domain`). Such a cause gets
one fleet record (:class:`FleetRecord`), one diagnosis (read from the logs of ``fleet.diagnosis_sample`` member jobs,
adopted by the others), one notice and at most one page; the jobs' recoveries are held (never requeued into the
outage) until the cause clears or a person releases it, then released together, each after a jitter
(:func:`release_delay`) so that they do not restart in one stampede.

The cause has cleared when its check says so, never because the held jobs' own alerts resolved (a dead job's error
rate falls to zero whether or not the storage is back). The check is the cause's ``fleet.clear_queries`` PromQL
expression where one is set (series: the cause persists; none: it cleared; an error: it persists), else a probe:
``fleet.probe_after_seconds`` after the fleet incident opened, one held job is restarted alone; its recovery
verified, the cause cleared; it failing again (a new alert, a failed attempt, or its incident closed otherwise), the
cause persists and the next probe waits twice as long, at most ``fleet.probe_max_seconds``
(:func:`probe_verdict`, :func:`next_probe_wait`). Meanwhile the fleet incident stays held, its state in the API.

Culprits too many to exclude (more than ``episodes.max_culprits``) that no domain within ``fleet.max_domain_nodes``
covers are a fleet incident too (key ``unexplained``): the jobs wait for a person, who is told once; a person's
release lets them restart without excluding those nodes.

The storm guard (:func:`storm_tripped`) counts job restarts across the fleet within ``fleet.storm_window_seconds``:
past ``fleet.storm_max_restarts`` no job is restarted until the window allows one again (a person may act).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from app.domain.culprits import Culprit
from app.domain.errors import ConfigError
from app.domain.params import MAX_NODE_LIST
from app.domain.topology import Domain, Topology

# Diagnosis categories whose cause lies outside the job's nodes, shared by every job that uses it.
SHARED_CATEGORIES = frozenset({"storage_io", "object_store_timeout"})
UNEXPLAINED = "unexplained"  # the key of too many culprits that no domain explains
DOMAIN_KINDS = ("switch", "rack", "block")
MAX_QUERY = 2000  # characters of a clear query
# A Kubernetes label key: an optional DNS prefix and a name (kubernetes.io/docs: labels and selectors).
LABEL_KEY = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


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
    # Per shared cause (storage_io, object_store_timeout): a PromQL expression that returns series while the cause
    # lasts (a storage health probe). Unset: a probe job tells (probe_after_seconds).
    clear_queries: dict[str, str] = field(default_factory=dict)
    # Without a clear query: one held job is restarted alone this long after the fleet incident opened; each
    # failed probe doubles the wait, up to probe_max_seconds.
    probe_after_seconds: int = 300
    probe_max_seconds: int = 3600
    # Jobs of a fleet incident whose logs are read for its diagnosis; the others adopt it (their logs unread).
    diagnosis_sample: int = 3
    # Read the topology from the Slurm host: `scontrol show topology` (switches, blocks) and the nodes' addresses
    # (`sinfo` NodeAddr: peers named in logs), cached topology_refresh_seconds.
    slurm_topology: bool = False
    # Kubernetes node labels that name each node's domains: {rack: <label>, block: <label>, switch: <label>}; the
    # nodes (and their InternalIP addresses) are listed from the API, cached topology_refresh_seconds.
    node_labels: dict[str, str] = field(default_factory=dict)
    topology_refresh_seconds: int = 600

    def __post_init__(self) -> None:
        for name in (
            "window_seconds",
            "recheck_seconds",
            "storm_window_seconds",
            "probe_after_seconds",
            "probe_max_seconds",
            "topology_refresh_seconds",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= 86_400:
                raise ConfigError(f"fleet.{name}: 1..86400 seconds, got {value!r}")
        if not isinstance(self.min_jobs, int) or not 2 <= self.min_jobs <= 100_000:
            raise ConfigError(f"fleet.min_jobs: 2..100000, got {self.min_jobs!r}")
        if not isinstance(self.release_jitter_seconds, int) or not 0 <= self.release_jitter_seconds <= 3600:
            raise ConfigError(f"fleet.release_jitter_seconds: 0..3600, got {self.release_jitter_seconds!r}")
        if not isinstance(self.storm_max_restarts, int) or self.storm_max_restarts < 0:
            raise ConfigError(f"fleet.storm_max_restarts: must be >= 0, got {self.storm_max_restarts!r}")
        if not isinstance(self.max_domain_nodes, int) or not 1 <= self.max_domain_nodes <= MAX_NODE_LIST:
            raise ConfigError(f"fleet.max_domain_nodes: 1..{MAX_NODE_LIST}, got {self.max_domain_nodes!r}")
        if self.probe_max_seconds < self.probe_after_seconds:
            raise ConfigError(
                f"fleet.probe_max_seconds: at least probe_after_seconds ({self.probe_after_seconds}), "
                f"got {self.probe_max_seconds!r}"
            )
        if not isinstance(self.diagnosis_sample, int) or not 1 <= self.diagnosis_sample <= 100:
            raise ConfigError(f"fleet.diagnosis_sample: 1..100, got {self.diagnosis_sample!r}")
        _check_mapping("fleet.clear_queries", self.clear_queries, SHARED_CATEGORIES, _promql)
        _check_mapping("fleet.node_labels", self.node_labels, DOMAIN_KINDS, _label_key)


def _promql(value: str) -> str | None:
    return (
        None
        if value.strip() and len(value) <= MAX_QUERY
        else f"a PromQL expression of 1..{MAX_QUERY} characters"
    )


def _label_key(value: str) -> str | None:
    return None if LABEL_KEY.fullmatch(value) and len(value) <= 316 else "a Kubernetes label key"


def _check_mapping(name: str, value: Any, keys: Iterable[str], check: Any) -> None:
    allowed = sorted(keys)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}: a mapping of {', '.join(allowed)} to values, got {value!r}")
    for key, item in value.items():
        if key not in allowed:
            raise ConfigError(f"{name}: unknown key {key!r} (known: {', '.join(allowed)})")
        problem = check(item) if isinstance(item, str) else "a string"
        if problem:
            raise ConfigError(f"{name}.{key}: {problem}, got {item!r}")


@dataclass(frozen=True)
class JobFailure:
    """One job incident as the fleet sees it."""

    incident_id: int
    job: str
    opened_at: datetime
    category: str | None  # the diagnosis category (before it, the alert's error_class), None: unknown
    culprits: frozenset[str] = frozenset()
    diagnosed: bool = True

    @classmethod
    def of(
        cls,
        incident_id: int,
        job: str | None,
        opened_at: datetime,
        category: str | None,
        error_class: str | None,
        culprits: Iterable[Culprit],
    ) -> JobFailure:
        """A job incident from its columns: its diagnosis's ``category`` (before it, its alert's ``error_class``),
        and its culprits that its allocation does not rule out."""
        return cls(
            incident_id,
            job or "",
            opened_at,
            category or error_class,
            frozenset(c.node for c in culprits if c.confirmed is not False),
            diagnosed=category is not None,
        )


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


@dataclass
class FleetRecord:
    """One fleet incident, as stored (a control row ``fleet:<key>``, the cause's current one; its earlier ones under
    ``fleet-history:<key>#<number>``): its member job incidents, its sampled diagnosis, how its cause is checked,
    and whether (when, by whom) it cleared."""

    key: str  # "storage_io", "switch:leaf1", "unexplained"
    kind: str  # "storage", a domain's kind, or "unexplained"
    summary: str
    opened_at: datetime
    # its jobs' recoveries wait for it (a domain's jobs are requeued off the domain instead)
    held: bool = True
    number: int = 1  # the how-manieth fleet incident of its cause: a cause that comes back opens the next
    incidents: list[int] = field(default_factory=list)
    diagnosis: dict[str, Any] | None = None  # read from the logs of the ``sampled`` members
    sampled: list[int] = field(default_factory=list)
    cleared_at: datetime | None = None
    cleared_by: str = ""  # "query", "probe", or "operator <name>"
    why: str = ""  # why it cleared, or what the last check said
    checked_at: datetime | None = None
    probe: int | None = None  # the incident of the job restarted alone to test the cause
    probe_at: datetime | None = None
    probe_attempt: int = 0  # the probe incident's attempt count when it was chosen
    probed: list[int] = field(default_factory=list)  # every incident probed so far (each job at most once)
    probes_failed: int = 0
    next_probe_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.isoformat() if isinstance(value, datetime) else value
        return out

    @classmethod
    def from_json(cls, key: str, value: Mapping[str, Any]) -> FleetRecord:
        """A stored record (older ones carry only summary, opened_at, incidents and cleared_at)."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {"key": key, "kind": value.get("kind") or _kind_of(key)}
        for name, raw in value.items():
            if name in ("key", "kind") or name not in known:
                continue
            is_time = name in ("opened_at", "cleared_at", "checked_at", "probe_at", "next_probe_at")
            kwargs[name] = datetime.fromisoformat(raw) if is_time and raw else raw
        kwargs.setdefault("summary", "")
        return cls(**kwargs)

    @property
    def probing(self) -> bool:
        return self.probe is not None


def _kind_of(key: str) -> str:
    if key in SHARED_CATEGORIES:
        return "storage"
    return key.split(":", 1)[0]


@dataclass(frozen=True)
class ProbeView:
    """The probe job's incident as it stands: open or closed (with what outcome), its attempt count, whether an
    attempt is under way (acting, verifying, waiting for resources), and the start of the newest alert of its job
    that began after the probe did (None: none)."""

    incident_id: int
    open: bool
    outcome: str | None
    attempt: int
    recovering: bool = False
    failed_again_at: datetime | None = None


def probe_verdict(record: FleetRecord, view: ProbeView | None) -> tuple[str, str]:
    """("cleared" | "failed" | "running", why) for the fleet incident's probe job."""
    if view is None:
        return "failed", f"the probe's incident #{record.probe} is gone"
    job = f"probe job (incident #{view.incident_id})"
    if view.failed_again_at is not None:
        return "failed", f"{job} failed again at {view.failed_again_at:%H:%M:%S}"
    if not view.open:
        if view.outcome == "recovered":
            return "cleared", f"{job} recovered: it trains again"
        return "failed", f"{job} closed {view.outcome} without recovering"
    if view.attempt > record.probe_attempt and not view.recovering:
        return "failed", f"{job}: its restart did not recover it"
    return "running", f"{job} restarting"


def next_probe_wait(failed: int, settings: FleetSettings) -> timedelta:
    """How long after a failed probe the next one starts: the first wait doubled per failure, at most the max."""
    seconds = settings.probe_after_seconds * 2 ** min(failed, 20)
    return timedelta(seconds=min(seconds, settings.probe_max_seconds))


def may_share_domain(
    failure: JobFailure, others: Iterable[JobFailure], topology: Topology, settings: FleetSettings
) -> bool:
    """Whether ``failure``'s culprits could still turn out to be one domain's fault once the other jobs of its
    window are diagnosed: they are all behind one domain, and the undiagnosed jobs with those already behind it
    could make ``min_jobs``."""
    domain = topology.smallest_covering(failure.culprits) if failure.culprits else None
    if domain is None:
        return False
    window = timedelta(seconds=settings.window_seconds)
    near = [f for f in others if f.job != failure.job and abs(f.opened_at - failure.opened_at) <= window]
    pending = [f for f in near if not f.diagnosed]
    behind = [f for f in near if f.diagnosed and f.culprits and f.culprits <= domain.nodes]
    return bool(pending) and len(pending) + len(behind) + 1 >= settings.min_jobs


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
