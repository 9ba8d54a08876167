"""Which training job a pod belongs to, read from the Kubernetes objects themselves.

dcgm-exporter in Kubernetes mode labels a GPU's series with the pod using it (``namespace``, ``pod``, ``container``),
never with a job name. The job is found from the pod: its controller owner references (``metadata.ownerReferences``
with ``controller: true``), followed up while the owner is a training kind, to the topmost one, which is what a
restart acts on (Pod → Job → JobSet → TrainJob: the TrainJob; Pod → PyTorchJob: the PyTorchJob). A pod with no
controller owner is matched by the well-known labels (:data:`JOB_LABELS`), and the object they name must exist.
The kind to restart is the object's own kind, never a playbook literal.

Bad input never reaches another job: a pod that does not exist in the alert's namespace, an owner that was replaced
(uid differs from the reference), an owner chain that loops or is deeper than :data:`MAX_OWNER_DEPTH`: the alert
names no job (node-level), and :attr:`Resolution.note` says why, for the ledger. Owner references are namespaced,
so every object of a chain is read in the pod's namespace.

An alert whose pod no longer exists (the operator replaced it after a crash; Prometheus still has the old pod's
series) and that carries ``train_job`` names the job of that name in the pod's namespace; when there is none, the
alert is node-level (:func:`resolve_pod_or_named`).

:func:`resolve_pod`, :func:`resolve_named` and :func:`resolve_pod_or_named` are pure: they read through the
``fetch`` callable they are given.
:class:`WorkloadResolver` does the reading (read-only GETs) with a bounded, expiring cache, before the ingestion's
transaction, so no network call is made inside one.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.domain import errors, schedulers
from app.domain.job_phase import JobStatus, workload_status
from app.domain.params import K8S_NAME, K8S_NAMESPACE

Json = Mapping[str, Any]
# fetch(kind, name) -> the object in the pod's namespace, or None when it does not exist.
Fetch = Callable[[str, str], Json | None]

MAX_OWNER_DEPTH = 4  # Pod → Job → JobSet → TrainJob is 3 hops; a longer chain is refused
# The training kinds, by (API group, kind): a chain is followed up through these only.
TRAINING_KINDS: dict[tuple[str, str], str] = {
    ("batch", "Job"): "Job",
    ("kubeflow.org", "PyTorchJob"): "PyTorchJob",
    ("jobset.x-k8s.io", "JobSet"): "JobSet",
    ("trainer.kubeflow.org", "TrainJob"): "TrainJob",
}
# Labels naming a pod's job, in the order they are trusted, and the kind each names. The Kubeflow training
# operator's label names a PyTorchJob unless ``training.kubeflow.org/operator-name`` says another kind.
JOB_LABELS: tuple[tuple[str, str], ...] = (
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("training.kubeflow.org/job-name", "PyTorchJob"),
    ("batch.kubernetes.io/job-name", "Job"),
    ("job-name", "Job"),
)
# What a lookup is cached by: ("pod", namespace, pod, train_job label or "") or ("job", namespace, train_job, "").
Key = tuple[str, str, str, str]
# By a name alone (an alert's train_job label), the kinds looked up, topmost first.
NAMED_KINDS = ("TrainJob", "PyTorchJob", "JobSet", "Job")
_NAME = re.compile(K8S_NAME)
_NAMESPACE = re.compile(K8S_NAMESPACE)


@dataclass(frozen=True)
class Workload:
    kind: str  # one of TRAINING_KINDS' values
    namespace: str
    name: str


@dataclass(frozen=True)
class Resolution:
    """What an alert's pod (or job name) says of its job: ``workload`` (None: no job), and ``note`` for the ledger.
    ``refused``: the input was contradictory or hostile; the alert must not name any job, not even its
    ``train_job`` label's."""

    workload: Workload | None
    note: str
    refused: bool = False


def pod_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(namespace, pod) an alert is about: the exporter's own ``namespace``/``pod`` labels, which Prometheus renames
    ``exported_namespace``/``exported_pod`` when the scrape does not honour labels (then ``namespace``/``pod`` are
    the exporter pod's). None when the alert names no pod."""
    if labels.get("exported_pod") and labels.get("exported_namespace"):
        return labels["exported_namespace"], labels["exported_pod"]
    if labels.get("pod") and labels.get("namespace"):
        return labels["namespace"], labels["pod"]
    return None


def _controller(obj: Json) -> Json | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)


def _describe(kind: str, obj: Json) -> str:
    return f"{kind} {(obj.get('metadata') or {}).get('name', '?')}"


def _walk_up(namespace: str, kind: str, obj: Json, fetch: Fetch, trail: list[str]) -> Resolution:
    """From a training object up its controller chain to the topmost training kind."""
    seen = {(obj.get("metadata") or {}).get("uid")}
    top = Workload(kind, namespace, obj["metadata"]["name"])
    current = obj
    for _ in range(MAX_OWNER_DEPTH + 1):
        ref = _controller(current)
        if ref is None:
            return Resolution(top, f"{top.kind} {namespace}/{top.name} ({' → '.join(trail)})")
        if len(trail) > MAX_OWNER_DEPTH:
            break
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        owner_kind = TRAINING_KINDS.get((group, str(ref.get("kind", ""))))
        owner_desc = f"{ref.get('kind')} {namespace}/{ref.get('name')}"
        if owner_kind is None:
            return Resolution(
                None,
                f"{top.kind} {namespace}/{top.name} is controlled by {owner_desc}, which Nightshift does not "
                f"restart ({' → '.join(trail)}): no job",
            )
        if ref.get("uid") in seen:
            return Resolution(None, f"owner chain loops at {owner_desc} ({' → '.join(trail)})", refused=True)
        owner = fetch(owner_kind, str(ref.get("name", "")))
        if owner is None:
            return Resolution(None, f"owner {owner_desc} does not exist ({' → '.join(trail)})", refused=True)
        if (owner.get("metadata") or {}).get("uid") != ref.get("uid"):
            return Resolution(
                None, f"owner {owner_desc} was replaced (uid differs from the reference)", refused=True
            )
        seen.add(ref.get("uid"))
        trail.append(_describe(owner_kind, owner))
        top = Workload(owner_kind, namespace, owner["metadata"]["name"])
        current = owner
    return Resolution(
        None, f"owner chain deeper than {MAX_OWNER_DEPTH} ({' → '.join(trail)}): refused", refused=True
    )


def resolve_pod(namespace: str, pod: Json | None, name: str, fetch: Fetch) -> Resolution:
    """The job of ``pod`` (None: not found in ``namespace``), reading owners through ``fetch``."""
    if pod is None:
        return Resolution(None, f"pod {namespace}/{name} does not exist in namespace {namespace}: no job")
    meta = pod.get("metadata") or {}
    if meta.get("namespace") != namespace:
        return Resolution(None, f"pod {name} is not in namespace {namespace}", refused=True)
    trail = [f"Pod {name}"]
    ref = _controller(pod)
    if ref is not None:
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        kind = TRAINING_KINDS.get((group, str(ref.get("kind", ""))))
        if kind is None:
            return Resolution(
                None,
                f"pod {namespace}/{name} is controlled by {ref.get('kind')} {ref.get('name')}, not a training "
                "job: no job",
            )
        owner = fetch(kind, str(ref.get("name", "")))
        if owner is None:
            return Resolution(
                None, f"owner {kind} {namespace}/{ref.get('name')} does not exist", refused=True
            )
        if (owner.get("metadata") or {}).get("uid") != ref.get("uid"):
            return Resolution(
                None,
                f"owner {kind} {namespace}/{ref.get('name')} was replaced (uid differs from the reference)",
                refused=True,
            )
        trail.append(_describe(kind, owner))
        return _walk_up(namespace, kind, owner, fetch, trail)
    labels = meta.get("labels") or {}
    for label, kind in JOB_LABELS:
        value = labels.get(label)
        if not value:
            continue
        if kind == "PyTorchJob" and labels.get(
            "training.kubeflow.org/operator-name", "pytorchjob-controller"
        ) != ("pytorchjob-controller"):
            return Resolution(None, f"pod {namespace}/{name}: label {label} names a job of another operator")
        owner = fetch(kind, value) if _NAME.fullmatch(value) else None
        if owner is None:
            return Resolution(None, f"pod {namespace}/{name}: label {label}={value} names no {kind}: no job")
        trail.append(f"{kind} {value} (label {label})")
        return _walk_up(namespace, kind, owner, fetch, trail)
    return Resolution(None, f"pod {namespace}/{name} has no controller and no job label: no job")


def resolve_pod_or_named(
    namespace: str, pod: Json | None, name: str, train_job: str, fetch: Fetch
) -> Resolution:
    """The job of ``pod`` (:func:`resolve_pod`); when the pod names none without refusing (it no longer exists,
    as after a crash whose pod the operator replaced while Prometheus still has the old pod's series, or it has
    no training owner) and the alert carries ``train_job``, the job that label names in the pod's namespace
    (:func:`resolve_named`). When that names none either the alert is refused a job (node-level): a job name
    without its kind cannot be restarted, and a guess could restart another job."""
    from_pod = resolve_pod(namespace, pod, name, fetch)
    if from_pod.workload is not None or from_pod.refused or not train_job:
        return from_pod
    named = resolve_named(namespace, train_job, fetch)
    if named.workload is not None:
        return Resolution(named.workload, f"{from_pod.note}; {named.note}")
    return Resolution(None, f"{from_pod.note}; {named.note}: node-level", refused=True)


def resolve_named(namespace: str, name: str, fetch: Fetch) -> Resolution:
    """The job an alert's ``train_job`` label names: the object of that name among :data:`NAMED_KINDS`, walked up
    to its topmost training owner (a TrainJob's JobSet has the TrainJob's name). Two different jobs: refused."""
    found: dict[Workload, Resolution] = {}
    for kind in NAMED_KINDS:
        obj = fetch(kind, name)
        if obj is not None:
            resolution = _walk_up(namespace, kind, obj, fetch, [f"{kind} {name} (label train_job)"])
            if resolution.workload is not None:
                found.setdefault(resolution.workload, resolution)
    if len(found) > 1:
        names = ", ".join(f"{w.kind} {w.name}" for w in found)
        return Resolution(None, f"train_job={name} names several jobs in {namespace} ({names})", refused=True)
    if found:
        return next(iter(found.values()))
    return Resolution(None, f"train_job={name}: no training job of that name in {namespace}")


class WorkloadResolver:
    """Resolutions of the alerts' pods and job names, read from the API before ingestion and cached.

    ``client`` returns the Kubernetes client (read-only calls: get pod, get workload). ``ttl_seconds``: how long an
    answer is reused (a pod's owner never changes; a pod name can be reused by the next incarnation of the same
    job). At most ``max_entries`` answers are kept and :data:`MAX_LOOKUPS` looked up per :meth:`prefetch`; an API
    error is not cached: the alert names the job of its ``train_job`` label only, and the note says why.
    """

    MAX_LOOKUPS = 256

    def __init__(
        self,
        client: Callable[[], Any],
        *,
        ttl_seconds: float = 60.0,
        max_entries: int = 4096,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._client = client
        self._ttl = ttl_seconds
        self._max = max_entries
        self._monotonic = monotonic
        self._cache: OrderedDict[Key, tuple[float, Resolution]] = OrderedDict()
        self._lock = threading.Lock()
        # The last answer that must not be reused (an API error), for this prefetch's ingestion only.
        self._transient: dict[Key, Resolution] = {}

    @staticmethod
    def key(labels: Mapping[str, str]) -> Key | None:
        """(what, namespace, name, train_job): a pod with the ``train_job`` label it carries ("" if none), or
        a job name alone."""
        pod = pod_of(labels)
        if pod is not None:
            return ("pod", *pod, labels.get("train_job", ""))
        if labels.get("train_job") and labels.get("namespace"):
            return ("job", labels["namespace"], labels["train_job"], "")
        return None

    def prefetch(self, alerts: Iterable[Any]) -> None:
        """Look up every firing alert's pod (or named job) not cached yet, at most :data:`MAX_LOOKUPS`."""
        keys = {k for a in alerts if a.status == "firing" and (k := self.key(a.labels)) is not None}
        self._transient = {}
        lookups = 0
        for key in sorted(keys):
            if self._cached(key) is not None:
                continue
            if lookups >= self.MAX_LOOKUPS:
                break
            lookups += 1
            resolution, lasting = self._resolve(key)
            self._transient[key] = resolution
            if (
                not lasting
            ):  # the API cannot be asked now: nor is it for the others (one timeout, not one each)
                self._transient.update(dict.fromkeys(keys - set(self._transient), resolution))
                break
            if lasting:
                with self._lock:
                    self._cache[key] = (self._monotonic(), resolution)
                    self._cache.move_to_end(key)
                    while len(self._cache) > self._max:
                        self._cache.popitem(last=False)

    def lookup(self, labels: Mapping[str, str]) -> Resolution | None:
        """The cached answer for this alert (pure: no I/O); None when it names no pod or job, or was not
        looked up (an API error, the lookup bound)."""
        key = self.key(labels)
        if key is None:
            return None
        return self._cached(key) or self._transient.get(key)

    def _cached(self, key: Key) -> Resolution | None:
        with self._lock:
            entry = self._cache.get(key)
        if entry is None or self._monotonic() - entry[0] > self._ttl:
            return None
        return entry[1]

    def _resolve(self, key: Key) -> tuple[Resolution, bool]:
        """The answer, and whether it may be reused."""
        what, namespace, name, train_job = key
        if not _NAMESPACE.fullmatch(namespace) or not all(_NAME.fullmatch(n) for n in (name, train_job) if n):
            shown = f"{namespace[:80]!r}/{name[:80]!r}" + (
                f" (train_job {train_job[:80]!r})" if train_job else ""
            )
            return Resolution(None, f"{what} {shown} is not a valid Kubernetes name", refused=True), True
        try:
            kube = self._client()

            def fetch(kind: str, obj_name: str) -> Json | None:
                try:
                    return kube.get_workload(kind, namespace, obj_name)
                except errors.NotFound:
                    return None

            if what == "job":
                return resolve_named(namespace, name, fetch), True
            try:
                pod = kube.get_pod(namespace, name)
            except errors.NotFound:
                pod = None
            return resolve_pod_or_named(namespace, pod, name, train_job, fetch), True
        except errors.BackendError as exc:
            return Resolution(None, f"cannot read {what} {namespace}/{name} from the API: {exc}"), False


def with_workload(target: Mapping[str, str], resolution: Resolution | None) -> dict[str, str]:
    """A Kubernetes playbook's rendered ``target`` with the job the API names: ``job``, ``kind`` and ``namespace``
    from the object itself (a playbook's own ``job``/``kind`` are replaced); a refused resolution leaves no job
    (node-level). Targets of other schedulers, and alerts with nothing looked up, are returned unchanged."""
    values = dict(target)
    scheduler = schedulers.of(values)
    if scheduler is None or not scheduler.resolves_workloads or resolution is None:
        return values
    if resolution.workload is not None:
        w = resolution.workload
        values.update(job=w.name, kind=w.kind, namespace=w.namespace)
    elif resolution.refused:
        values.pop("job", None)
        values.pop("kind", None)
    return values


def workload_resolver(settings: Any, clients: Any) -> WorkloadResolver | None:
    """The resolver of a deployment acting on Kubernetes (``schedulers``), reading through ``clients.kube``."""
    if not any(schedulers.named(name).resolves_workloads for name in settings.schedulers):
        return None
    return WorkloadResolver(lambda: clients.kube)


def kubernetes_job_status(kube: Any, target: Mapping[str, str]) -> JobStatus:
    """The status of the job ``target`` names (``namespace``, ``job``, and ``kind`` when the API named it): the
    object's finished conditions first (a finished PyTorchJob whose pods were cleaned up is completed or died, not
    unknown), then its pods (:func:`app.domain.job_phase.workload_status`). Raises the client's BackendError."""
    kind, namespace, name = target.get("kind", ""), target["namespace"], target["job"]
    obj = None
    if kind:
        try:
            obj = kube.get_workload(kind, namespace, name)
        except errors.NotFound:
            obj = None
    return workload_status(kind, obj, kube.job_pods(namespace, name))
