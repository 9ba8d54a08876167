"""What Nightshift asks a scheduler: a training job's status and allocation, a node's partition or pool.

The facts that need no asking (job identity, default repair steps, our mark, target rules) are
:mod:`app.domain.schedulers` (pure); each backend here is the I/O half of one of them, reading through ``app.clients``.
Errors are the clients' :mod:`app.domain.errors` types; the caller decides (a job's status unread is asked again; a pool
unknown leaves only the blast radius's absolute limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.clients import Clients
from app.config import Settings
from app.domain import schedulers
from app.domain.errors import BackendError, ConfigError
from app.domain.job_phase import JobStatus, slurm_phase
from app.engine.deps import EngineDeps
from app.workloads import kubernetes_job_status


@dataclass(frozen=True)
class Pool:
    """The nodes a node is counted with by the blast radius's share limit (a Slurm partition, a node pool)."""

    name: str
    nodes: frozenset[str]


class NoPool(Exception):
    """The node belongs to no partition or pool (the message says why)."""


class Backend(Protocol):
    """One scheduler, asked."""

    scheduler: schedulers.Scheduler

    def job_status(self, target: Mapping[str, str]) -> JobStatus:
        """The phase of the job ``target`` names, and its allocation. Raises BackendError/ConfigError."""

    def pool(self, node: str) -> Pool:
        """The partition or pool of ``node``. Raises NoPool, BackendError, ConfigError."""

    def in_service(self, node: str) -> bool:
        """Whether jobs may run on ``node`` now. Raises BackendError, ConfigError."""


class SlurmBackend:
    scheduler = schedulers.SLURM

    def __init__(self, clients: Clients, settings: Settings):
        self.clients = clients

    @staticmethod
    def configured(settings: Settings) -> bool:
        return bool(settings.slurm.host)

    def job_status(self, target: Mapping[str, str]) -> JobStatus:
        slurm = self.clients.slurm
        info = slurm.job_info(target["job"])
        nodes = tuple(slurm.expand_hostlist(info.nodes)) if info.nodes else ()
        return JobStatus(slurm_phase(info.state), nodes, info.state)

    def in_service(self, node: str) -> bool:
        """Not drained or draining, not down, responding."""
        info = self.clients.slurm.node_info(node)
        return not info.drained and info.state != "down" and "not_responding" not in info.flags

    def pool(self, node: str) -> Pool:
        slurm = self.clients.slurm
        partitions = slurm.node_info(node).partitions
        if not partitions:
            raise NoPool(f"node {node} is in no partition")
        return Pool(f"partition {partitions[0]}", frozenset(slurm.partition_nodes(partitions[0])))


class KubernetesBackend:
    scheduler = schedulers.KUBERNETES

    def __init__(self, clients: Clients, settings: Settings):
        self.clients = clients
        self.pool_label = settings.guards.node_pool_label

    @staticmethod
    def configured(settings: Settings) -> bool:
        return True  # in-cluster credentials need no setting

    def job_status(self, target: Mapping[str, str]) -> JobStatus:
        return kubernetes_job_status(self.clients.kube, target)

    def in_service(self, node: str) -> bool:
        """Schedulable (not cordoned) and Ready."""
        found = self.clients.kube.get_node(node)
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (found.get("status") or {}).get("conditions") or ()
        )
        return ready and not (found.get("spec") or {}).get("unschedulable")

    def pool(self, node: str) -> Pool:
        kube, label = self.clients.kube, self.pool_label
        value = (kube.get_node(node)["metadata"].get("labels") or {}).get(label)
        if not value:
            raise NoPool(f"node {node} has no label {label}")
        return Pool(f"pool {label}={value}", frozenset(kube.node_names(f"{label}={value}")))


BACKENDS: Mapping[str, type[SlurmBackend] | type[KubernetesBackend]] = {
    b.scheduler.name: b for b in (SlurmBackend, KubernetesBackend)
}


def backend(deps: EngineDeps, scheduler: str) -> Backend:
    """The backend of the scheduler called ``scheduler``."""
    return BACKENDS[scheduler](deps.clients, deps.settings)


def job_status(deps: EngineDeps, target: Mapping[str, str]) -> JobStatus:
    """What the scheduler of ``target`` says of its job. Raises the clients' BackendError/ConfigError (a target
    that names no scheduler: ConfigError)."""
    scheduler = schedulers.of(target)
    if scheduler is None:
        raise ConfigError("the target names no scheduler: no job to ask about")
    return backend(deps, scheduler.name).job_status(target)


def pool_facts(
    deps: EngineDeps, scheduler: schedulers.Scheduler | None, node: str
) -> tuple[dict[str, Any], str]:
    """The blast-radius inputs about the node's partition (Slurm) or node pool (Kubernetes label
    ``guards.node_pool_label``): ``pool``, ``pool_nodes``, ``blast_max_share`` for
    :class:`app.domain.guards.GuardFacts`, and a note. Unknown (no scheduler, lookup failed, no partition, no label): no
    facts, so only the absolute limit applies."""
    if scheduler is None:
        return {}, f"node {node}: the target names no scheduler"
    try:
        pool = backend(deps, scheduler.name).pool(node)
    except NoPool as exc:
        return {}, str(exc)
    except (BackendError, ConfigError) as exc:
        return {}, f"partition/pool of {node} unknown: {exc}"
    share = deps.settings.guards.blast_radius_max_share
    facts = {"pool": pool.name, "pool_nodes": pool.nodes, "blast_max_share": share}
    return facts, f"{pool.name}: {len(pool.nodes)} nodes"


def hold_default(settings: Settings) -> str:
    """The scheduler a node with no repair is held on when the operator names none: the first one configured
    here (Slurm when a Slurm host is set, else Kubernetes)."""
    return next(name for name, b in BACKENDS.items() if b.configured(settings))
