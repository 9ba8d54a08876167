"""The schedulers Nightshift acts on, as facts: everything that differs between Slurm and Kubernetes. Pure: no I/O.

A :class:`Scheduler` says how a rendered playbook target names its training job (the job identity, an incident's
open key), what the target's values must look like, which of its actions take a node out of service, validate it and
return it (the default steps of a node repair, and their parameters), how a take-out that changed nothing tells our
own mark from someone else's, and how Prometheus labels its jobs. What has to ask the scheduler itself (a job's status
and allocation, a node's partition or pool) is :mod:`app.engine.scheduler_backends`. Nothing else compares a
scheduler's name: a third scheduler is one more class here and one more backend there.

A target that names no scheduler is :data:`DEFAULT`'s; one that names ``none`` has none (no job to recover, no node
to repair: its playbook's own steps act on what it names).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from app.domain.params import (
    K8S_NAMESPACE,
    SLURM_JOB_ID,
    SLURM_NODE_NAME,
    SLURM_RESERVED,
    Param,
    validate_params,
)
from app.domain.repair_policy import RETURN, TAKE_OUT, VALIDATE

if TYPE_CHECKING:
    from app.config import Settings

# The value a playbook target's ``scheduler`` takes for "no scheduler" (allowed beside the schedulers' names).
NO_SCHEDULER = "none"
# What Nightshift writes on what it takes out, where the scheduler keeps a mark (a Kubernetes node's annotation).
OUR_MARK = "nightshift"

NODE = "{{ node.name }}"  # the node being repaired, in a node repair's step templates
# Kubernetes' in-cluster credentials: the service account token the kubelet mounts.
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
# Credential states (GET /readyz, nightshift_backend_credentials): unset (nothing configured), configured (the
# files are there and readable, not proven yet), credential_error (unreadable, or rejected when used).
CREDENTIAL_STATES = ("unset", "configured", "credential_error")


class Scheduler(Protocol):
    """What Nightshift knows of one scheduler without asking it."""

    name: str  # as a playbook target's ``scheduler`` and the setting ``schedulers`` spell it
    # The target's keys that name one training job, outermost first (``kubernetes/<namespace>/<job>``).
    identity: tuple[str, ...]
    # The job identity's values as an API request gives them (GET /api/v1/checkpoint-advice).
    identity_params: Mapping[str, Param]
    # PromQL label matchers of one job's series (the progress library's labels), over ``target.<identity key>``
    # (app/engine/checkpoint_facts.py, app/domain/episodes.progress_query).
    job_selector: str
    # Whether the Kubernetes API is asked which job an alert's pod belongs to (app/workloads.py).
    resolves_workloads: bool

    def check_target(self, target: Mapping[str, str]) -> None:
        """Raise :class:`app.domain.errors.ParamError` when a rendered target's values break this scheduler's rules."""

    def default_steps(self) -> dict[str, tuple[str, dict[str, str]]]:
        """The take-out, validation and return steps of a node repair: marker -> (action, parameter templates)."""

    def took_out_ours(self, data: Mapping[str, Any]) -> bool:
        """Whether a take-out that changed nothing (``data``: its outcome's data) found the node out by us."""

    def connection(self, settings: Settings) -> str:
        """How Nightshift reaches it with ``settings``, for the startup summary (:mod:`app.domain.startup`)."""

    def credentials(self, settings: Settings, readable: Callable[[str], bool]) -> tuple[str, str]:
        """(state, why) of its credentials before any use (:data:`CREDENTIAL_STATES`); ``readable(path)``: whether
        this process can read the file (GET /readyz, ``nightshift_backend_credentials``)."""


class Slurm:
    name = "slurm"
    identity: tuple[str, ...] = ("job",)
    identity_params: Mapping[str, Param] = {"job": Param(pattern=SLURM_JOB_ID, description="Slurm job id")}
    job_selector = 'slurm_job_id="{{ target.job }}"'
    resolves_workloads = False
    # A job id is numeric (an array or het-job suffix allowed), never a name (``all`` passes the generic job pattern
    # as a Kubernetes name); a node is one node and never the reserved ``ALL`` in any case (app/actions/slurm.py).
    target_params: Mapping[str, Param] = {
        "job": Param(required=False, pattern=SLURM_JOB_ID, description="Slurm job id"),
        "node": Param(
            required=False,
            pattern=SLURM_NODE_NAME,
            reserved=SLURM_RESERVED,
            description="Slurm node (not ALL)",
        ),
    }

    def check_target(self, target: Mapping[str, str]) -> None:
        validate_params(
            "target", self.target_params, {k: v for k, v in target.items() if k in self.target_params}
        )

    def default_steps(self) -> dict[str, tuple[str, dict[str, str]]]:
        return {
            TAKE_OUT: ("slurm.drain_node", {"node": NODE, "reason": "{{ node.reason }}"}),
            VALIDATE: ("slurm.validate_node", {"node": NODE}),
            RETURN: ("slurm.resume_node", {"node": NODE}),
        }

    def took_out_ours(self, data: Mapping[str, Any]) -> bool:
        # slurm.drain_node drains again over our own drain (changed); unchanged means someone else's reason.
        return False

    def connection(self, settings: Settings) -> str:
        s = settings.slurm
        if not s.host:
            return "unset (slurm.host): Slurm actions cannot run"
        return f"{s.user}@{s.host}:{s.port}" + (" (sudo -n)" if s.sudo and s.user != "root" else "")

    def credentials(self, settings: Settings, readable: Callable[[str], bool]) -> tuple[str, str]:
        s = settings.slurm
        if not s.host:
            return "unset", "slurm.host is not set"
        if s.key_file:
            return _file_state("slurm.key_file", s.key_file, readable)
        return "configured", "the SSH agent" if s.use_agent else "the account's default SSH keys"


class Kubernetes:
    name = "kubernetes"
    identity: tuple[str, ...] = ("namespace", "job")
    identity_params: Mapping[str, Param] = {
        "job": Param(pattern=r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}", description="Kubernetes job name"),
        "namespace": Param(pattern=K8S_NAMESPACE, description="Kubernetes namespace name"),
    }
    job_selector = 'namespace="{{ target.namespace }}",train_job="{{ target.job }}"'
    resolves_workloads = True

    def check_target(self, target: Mapping[str, str]) -> None:
        return None

    def default_steps(self) -> dict[str, tuple[str, dict[str, str]]]:
        return {
            TAKE_OUT: ("kubernetes.cordon_node", {"node": NODE}),
            VALIDATE: ("kubernetes.validate_node", {"node": NODE}),
            RETURN: ("kubernetes.uncordon_node", {"node": NODE}),
        }

    def took_out_ours(self, data: Mapping[str, Any]) -> bool:
        # kubernetes.cordon_node reports who cordoned an already cordoned node (its cordoned-by annotation).
        return data.get("cordoned_by") == OUR_MARK

    def connection(self, settings: Settings) -> str:
        k = settings.kubernetes
        if k.kubeconfig:
            return f"kubeconfig {k.kubeconfig}" + (f" (context {k.context})" if k.context else "")
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return "in-cluster service account"
        return "default kubeconfig (~/.kube/config), if any: Kubernetes actions fail without one"

    def credentials(self, settings: Settings, readable: Callable[[str], bool]) -> tuple[str, str]:
        if settings.kubernetes.kubeconfig:
            return _file_state("kubernetes.kubeconfig", settings.kubernetes.kubeconfig, readable)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return _file_state("the in-cluster service account token", SERVICE_ACCOUNT_TOKEN, readable)
        if readable(os.path.expanduser("~/.kube/config")):
            return "configured", "the default kubeconfig (~/.kube/config), readable; not used yet"
        return "unset", "no kubeconfig: kubernetes.kubeconfig unset, no ~/.kube/config, not in a pod"


def _file_state(what: str, path: str, readable: Callable[[str], bool]) -> tuple[str, str]:
    if readable(path):
        return "configured", f"{what} {path} readable; not used yet"
    return "credential_error", f"{what} {path} cannot be read by this user"


SLURM: Scheduler = Slurm()
KUBERNETES: Scheduler = Kubernetes()
SCHEDULERS: Mapping[str, Scheduler] = {s.name: s for s in (SLURM, KUBERNETES)}
NAMES: tuple[str, ...] = tuple(SCHEDULERS)
DEFAULT: Scheduler = SLURM  # a playbook target that names no scheduler is Slurm's: the one default, here


def named(name: str) -> Scheduler:
    """The scheduler called ``name``. Raises KeyError for any other name."""
    return SCHEDULERS[name]


def of(target: Mapping[str, str]) -> Scheduler | None:
    """The scheduler a playbook target (rendered, or as written) or an incident's ``target`` belongs to: the one it
    names, :data:`DEFAULT` when it names none, None for ``none`` (or a name that is not a scheduler's)."""
    return SCHEDULERS.get(target.get("scheduler") or DEFAULT.name)


def job_identity(target: Mapping[str, str]) -> str | None:
    """The training job a rendered target names: ``slurm/<job id>`` or ``kubernetes/<namespace>/<job>``; None when
    it names none (no job, a key of the identity missing, or no scheduler)."""
    scheduler = of(target)
    if scheduler is None:
        return None
    values = [target.get(key) for key in scheduler.identity]
    if not all(values):
        return None
    return "/".join([scheduler.name, *(str(v) for v in values)])


def of_incident(target: Mapping[str, str]) -> Scheduler:
    """The scheduler of a job or node incident's target (one always names a scheduler: :func:`job_identity`,
    :func:`app.domain.episodes.episode_of`). Raises ValueError for a target that names none."""
    scheduler = of(target)
    if scheduler is None:
        raise ValueError(f"target {dict(target)} names no scheduler")
    return scheduler
