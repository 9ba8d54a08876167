"""Who is training, read from the environment the scheduler gives the process (pure: the environment is a
parameter).

Labels (Nightshift's training metric contract, ``rules/README.md`` of the Nightshift repository):

==============  ==============================================================================================
``train_job``   the name given to :func:`identity_from_env`, else ``NIGHTSHIFT_TRAIN_JOB``, else Slurm's
                ``SLURM_JOB_NAME``, else ``"training"``
``slurm_job_id`` ``SLURM_JOB_ID`` (empty outside Slurm)
``namespace``   ``POD_NAMESPACE`` (Kubernetes downward API ``metadata.namespace``)
``pod``         ``POD_NAME`` (downward API ``metadata.name``)
``Hostname``    the node: ``SLURMD_NODENAME`` under Slurm; ``NODE_NAME`` (downward API ``spec.nodeName``) on
                Kubernetes, never the pod's own host name, which names the pod, not the node; the host name only
                outside both
==============  ==============================================================================================

Which process serves: one endpoint per node, from the process whose local rank is 0 (``LOCAL_RANK``, else
``SLURM_LOCALID``; a process without either is rank 0), or with ``per_node=False`` only global rank 0
(``RANK``, else ``SLURM_PROCID``).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

LABELS = ("train_job", "slurm_job_id", "namespace", "pod", "Hostname")
# Bound on every label value: a runaway environment variable must not make every sample huge.
MAX_LABEL_LENGTH = 256


@dataclass(frozen=True)
class Identity:
    """The label values of one training process, plus its ranks; ``warnings`` says what was missing."""

    train_job: str
    slurm_job_id: str = ""
    namespace: str = ""
    pod: str = ""
    hostname: str = ""
    rank: int = 0
    local_rank: int = 0
    warnings: tuple[str, ...] = ()

    def labels(self) -> dict[str, str]:
        return {
            "train_job": self.train_job,
            "slurm_job_id": self.slurm_job_id,
            "namespace": self.namespace,
            "pod": self.pod,
            "Hostname": self.hostname,
        }

    def serves(self, per_node: bool = True) -> bool:
        """Whether this process serves the endpoint: local rank 0 (``per_node``), else global rank 0."""
        return (self.local_rank if per_node else self.rank) == 0


def _rank(env: Mapping[str, str], *names: str) -> int:
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def _bounded(value: str) -> str:
    return value[:MAX_LABEL_LENGTH]


def identity_from_env(
    env: Mapping[str, str], job: str | None = None, hostname: str | None = None
) -> Identity:
    """The :class:`Identity` of a process with environment ``env``; ``job``/``hostname`` override it."""
    warnings: list[str] = []
    on_kubernetes = bool(env.get("POD_NAME") or env.get("KUBERNETES_SERVICE_HOST"))
    node = hostname or env.get("SLURMD_NODENAME") or env.get("NODE_NAME", "")
    if not node:
        if on_kubernetes:
            warnings.append(
                "on Kubernetes without NODE_NAME: set it from the downward API (fieldRef spec.nodeName); "
                "Hostname stays empty rather than naming the pod"
            )
        else:
            node = socket.gethostname()
    name = job or env.get("NIGHTSHIFT_TRAIN_JOB") or env.get("SLURM_JOB_NAME") or "training"
    return Identity(
        train_job=_bounded(name),
        slurm_job_id=_bounded(env.get("SLURM_JOB_ID", "")),
        namespace=_bounded(env.get("POD_NAMESPACE", "")),
        pod=_bounded(env.get("POD_NAME", "")),
        hostname=_bounded(node),
        rank=_rank(env, "RANK", "SLURM_PROCID"),
        local_rank=_rank(env, "LOCAL_RANK", "SLURM_LOCALID"),
        warnings=tuple(warnings),
    )
