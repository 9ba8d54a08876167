"""The job of an alert's pod, found through a real kube-apiserver (app/workloads.py): owner references followed up
to the topmost training kind (PyTorchJob, Job, JobSet, TrainJob), the well-known labels for a pod with no controller,
and the bad input that must never name a job (a pod that does not exist, a pod of another namespace, an owner chain
that loops, is too deep, or points at a replaced owner). Objects are created as their controllers create them
(``ownerReferences`` with ``controller: true`` and the owner's uid); no controller runs here."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from app import build_engine
from app.clients import Clients
from app.clients.kube import WORKLOADS
from app.domain.alertmanager import parse_notification
from app.domain.permissions import Permissions
from app.engine import Engine
from app.workloads import MAX_OWNER_DEPTH, Workload, WorkloadResolver
from tests.fixtures.kube import KubeAdmin, KubeCluster, controller_ref
from tests.payloads import alert, payload

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def api_version(kind: str) -> str:
    group, version, _ = WORKLOADS[kind]
    return f"{group}/{version}"


def make(
    admin: KubeAdmin,
    ns: str,
    kind: str,
    name: str,
    owner: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An object of ``kind`` (a Pod, or a training kind) as its controller writes it."""
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": dict(labels or {})}
    if owner is not None:
        meta["ownerReferences"] = [controller_ref(owner)]
    if kind == "Pod":
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"containers": [{"name": "pytorch", "image": "trainer:1"}]}}  # fmt: skip
    elif kind == "Job":
        template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "trainer:1"}]}}
        body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": template}}
    else:
        body = {"apiVersion": api_version(kind), "kind": kind, "metadata": meta, "spec": {}}
    return admin.apply(body)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def resolver(kube_cluster: KubeCluster) -> Iterator[WorkloadResolver]:
    clients = Clients(kube_cluster.settings("admin"))
    yield WorkloadResolver(lambda: clients.kube)
    clients.close()


def resolve(resolver: WorkloadResolver, **labels: str) -> Any:
    gpu_alert = alert({"alertname": "GpuXidError", "Hostname": "gpu-1", "xid": "79", **labels})
    resolver.prefetch([parse_notification(json.dumps(payload(gpu_alert))).alerts[0]])
    return resolver.lookup(gpu_alert["labels"])


def test_every_training_kind_is_found_from_its_pod_up_to_the_topmost_owner(
    kube_admin: KubeAdmin, kube_namespace: str, resolver: WorkloadResolver
) -> None:
    ns = kube_namespace
    pytorchjob = make(kube_admin, ns, "PyTorchJob", unique("llama"))
    trainjob = make(kube_admin, ns, "TrainJob", unique("tj"))
    # Trainer v2: TrainJob → JobSet (same name) → Job → Pod
    tj_jobset = make(kube_admin, ns, "JobSet", trainjob["metadata"]["name"], owner=trainjob)
    tj_job = make(kube_admin, ns, "Job", unique("tj-node-0"), owner=tj_jobset)
    jobset = make(kube_admin, ns, "JobSet", unique("js"))
    js_job = make(kube_admin, ns, "Job", unique("js-workers-0"), owner=jobset)
    plain_job = make(kube_admin, ns, "Job", unique("batch"))
    cases = {
        "PyTorchJob": (make(kube_admin, ns, "Pod", unique("p"), owner=pytorchjob), pytorchjob),
        "TrainJob": (make(kube_admin, ns, "Pod", unique("p"), owner=tj_job), trainjob),
        "JobSet": (make(kube_admin, ns, "Pod", unique("p"), owner=js_job), jobset),
        "Job": (make(kube_admin, ns, "Pod", unique("p"), owner=plain_job), plain_job),
    }
    for kind, (pod, job) in cases.items():
        found = resolve(resolver, namespace=ns, pod=pod["metadata"]["name"], container="pytorch", gpu="0")
        assert found.workload == Workload(kind, ns, job["metadata"]["name"]), found.note
        assert not found.refused


def test_exported_labels_win_over_the_exporter_pods_own(
    kube_admin: KubeAdmin, kube_namespace: str, resolver: WorkloadResolver
) -> None:
    """Without honorLabels, Prometheus names the exporter's pod namespace/pod and the workload's exported_*."""
    ns = kube_namespace
    job = make(kube_admin, ns, "PyTorchJob", unique("llama"))
    pod = make(kube_admin, ns, "Pod", unique("p"), owner=job)
    found = resolve(
        resolver,
        namespace="gpu-operator",
        pod="nvidia-dcgm-exporter-x1",
        exported_namespace=ns,
        exported_pod=pod["metadata"]["name"],
    )
    assert found.workload == Workload("PyTorchJob", ns, job["metadata"]["name"]), found.note


def test_a_pod_with_no_controller_is_matched_by_its_labels_when_the_named_job_exists(
    kube_admin: KubeAdmin, kube_namespace: str, resolver: WorkloadResolver
) -> None:
    ns = kube_namespace
    job = make(kube_admin, ns, "PyTorchJob", unique("llama"))
    name = job["metadata"]["name"]
    labelled = make(kube_admin, ns, "Pod", unique("p"), labels={"training.kubeflow.org/job-name": name})
    found = resolve(resolver, namespace=ns, pod=labelled["metadata"]["name"])
    assert found.workload == Workload("PyTorchJob", ns, name), found.note
    dangling = make(kube_admin, ns, "Pod", unique("p"), labels={"jobset.sigs.k8s.io/jobset-name": "nonesuch"})
    found = resolve(resolver, namespace=ns, pod=dangling["metadata"]["name"])
    assert found.workload is None and "names no JobSet" in found.note


def test_a_pod_of_no_training_job_is_node_level(
    kube_admin: KubeAdmin, kube_namespace: str, resolver: WorkloadResolver
) -> None:
    """The exporter's own pod (honorLabels on an idle GPU): a DaemonSet's, not a job's."""
    ns = kube_namespace
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "dcgm", "uid": str(uuid.uuid4())},
    }
    pod = make(kube_admin, ns, "Pod", unique("dcgm"), owner=daemonset)
    found = resolve(resolver, namespace=ns, pod=pod["metadata"]["name"])
    assert found.workload is None and not found.refused
    assert "controlled by DaemonSet dcgm, not a training job" in found.note


def test_bad_input_names_no_job(
    kube_admin: KubeAdmin, kube_namespace: str, resolver: WorkloadResolver
) -> None:
    ns, other = kube_namespace, kube_admin.create_namespace()
    job = make(kube_admin, other, "PyTorchJob", "llama")
    elsewhere = make(kube_admin, other, "Pod", unique("p"), owner=job)
    # The pod exists, but in another namespace than the alert's.
    found = resolve(resolver, namespace=ns, pod=elsewhere["metadata"]["name"])
    assert found.workload is None and "does not exist in namespace" in found.note
    found = resolve(resolver, namespace=ns, pod="nonesuch-0")
    assert found.workload is None and "does not exist" in found.note

    # A loop: Job a controlled by Job b controlled by Job a.
    a = make(kube_admin, ns, "Job", unique("a"))
    b = make(kube_admin, ns, "Job", unique("b"), owner=a)
    patch = {"metadata": {"ownerReferences": [controller_ref(b)]}}
    a = kube_admin.merge_patch("batch/v1", "Job", a["metadata"]["name"], patch, namespace=ns)
    pod = make(kube_admin, ns, "Pod", unique("p"), owner=a)
    found = resolve(resolver, namespace=ns, pod=pod["metadata"]["name"])
    assert found.workload is None and found.refused and "loops" in found.note, found.note

    # Deeper than the bound.
    top = make(kube_admin, ns, "Job", unique("j"))
    for _ in range(MAX_OWNER_DEPTH + 1):
        top = make(kube_admin, ns, "Job", unique("j"), owner=top)
    pod = make(kube_admin, ns, "Pod", unique("p"), owner=top)
    found = resolve(resolver, namespace=ns, pod=pod["metadata"]["name"])
    assert found.workload is None and found.refused and "deeper than" in found.note, found.note

    # An owner replaced under the same name (another uid): not the pod's job.
    job = make(kube_admin, ns, "PyTorchJob", unique("llama"))
    pod = make(
        kube_admin,
        ns,
        "Pod",
        unique("p"),
        owner={**job, "metadata": {**job["metadata"], "uid": str(uuid.uuid4())}},
    )
    found = resolve(resolver, namespace=ns, pod=pod["metadata"]["name"])
    assert found.workload is None and found.refused and "replaced" in found.note, found.note


def test_a_train_job_label_alone_names_the_topmost_job_of_that_name(
    kube_admin: KubeAdmin, kube_namespace: str, resolver: WorkloadResolver
) -> None:
    ns = kube_namespace
    trainjob = make(kube_admin, ns, "TrainJob", unique("tj"))
    make(kube_admin, ns, "JobSet", trainjob["metadata"]["name"], owner=trainjob)
    found = resolve(resolver, namespace=ns, train_job=trainjob["metadata"]["name"])
    assert found.workload == Workload("TrainJob", ns, trainjob["metadata"]["name"]), found.note
    found = resolve(resolver, namespace=ns, train_job="nonesuch")
    assert found.workload is None and not found.refused


@pytest.fixture
def engine_for(kube_cluster: KubeCluster, tmp_path: Path) -> Iterator[Callable[[list[str]], Engine]]:
    """Factory: an engine on the shipped playbooks acting on ``schedulers``, its pod lookups on the test cluster;
    closed at teardown."""
    made: list[tuple[Engine, Clients]] = []

    def make_engine(schedulers: list[str]) -> Engine:
        settings = kube_cluster.settings()
        settings.data_dir = str(tmp_path / f"var-{len(made)}")
        settings.schedulers = schedulers
        settings.playbook_paths = [str(ROOT / "playbooks")]
        clients = Clients(settings)
        made.append((build_engine(settings, permissions=Permissions(), clients=clients), clients))
        return made[-1][0]

    yield make_engine
    for engine, clients in made:
        clients.close()
        engine.deps.store.dispose()


def dcgm_xid(node: str, namespace: str, pod: str) -> dict[str, Any]:
    """What dcgm-exporter in Kubernetes mode sends for an Xid, through rules/gpu_xid.yml: no train_job."""
    return alert({
        "alertname": "GpuXidError", "Hostname": node, "gpu": "3", "UUID": f"GPU-{uuid.uuid4()}",
        "modelName": "NVIDIA H100 80GB HBM3", "namespace": namespace, "pod": pod, "container": "pytorch",
        "xid": "79", "xid_class": "reboot", "severity": "critical",
    })  # fmt: skip


def test_the_shipped_playbooks_restart_the_pods_job_by_its_own_kind_and_never_plan_scontrol(
    engine_for: Callable[[list[str]], Engine], kube_admin: KubeAdmin, kube_namespace: str
) -> None:
    ns = kube_namespace
    jobset = make(kube_admin, ns, "JobSet", unique("js"))
    child = make(kube_admin, ns, "Job", unique("js-workers-0"), owner=jobset)
    pod = make(kube_admin, ns, "Pod", unique("p"), owner=child)
    stray = make(kube_admin, kube_admin.create_namespace(), "Pod", unique("p"))
    engine = engine_for(["kubernetes"])
    alerts = [
        dcgm_xid("gpu-a", ns, pod["metadata"]["name"]),
        dcgm_xid("gpu-b", ns, stray["metadata"]["name"]),  # the pod is in another namespace
        dcgm_xid("gpu-c", "gpu-operator", "dcgm-1"),  # honorLabels on an idle GPU: the exporter's pod
    ]
    slurm_style = alert({"alertname": "GpuXidError", "Hostname": "gpu-d", "xid": "79", "xid_class": "reboot"})
    report = engine.explain(parse_notification(json.dumps(payload(*alerts, slurm_style))))
    text = json.dumps(report)
    assert "scontrol" not in text and "slurm." not in text
    by_key = {ep["episode"]: ep for ep in report["episodes"]}
    job_key = f"job:kubernetes/{ns}/{jobset['metadata']['name']}"
    assert set(by_key) == {job_key, "node:kubernetes/gpu-b", "node:kubernetes/gpu-c"}, sorted(by_key)
    assert by_key[job_key]["target"]["kind"] == "JobSet"
    notes = [entry.get("job_lookup", "") for entry in report["alerts"]]
    assert "JobSet" in notes[0] and "does not exist in namespace" in notes[1]
    notes = report["alerts"][3]["not_loaded"]  # no namespace: a Slurm node's alert, not for this deployment
    assert any(n.startswith("playbook gpu-xid-node-fault-slurm acts on slurm") for n in notes), notes
    assert all(n.endswith("not loaded") for n in notes)

    engine.ingest(parse_notification(json.dumps(payload(*alerts))))
    incidents = {i["open_key"]: i for i in engine.incidents()}
    assert set(incidents) == set(by_key)
    job_incident = incidents[job_key]
    assert (job_incident["kind"], job_incident["target"]["kind"]) == ("job", "JobSet")
    ledger = engine.incident(incidents["node:kubernetes/gpu-b"]["id"])["ledger"]
    assert any("does not exist in namespace" in row["message"] for row in ledger), ledger


def test_the_webhooks_inbox_finds_the_pods_job_before_the_worker_ingests(
    engine_for: Callable[[list[str]], Engine], kube_admin: KubeAdmin, kube_namespace: str
) -> None:
    """The webhook's path, not the replay's: the notification is queued, and the worker looks its pods' jobs up
    before it ingests them (app/engine/inbox.py, outside any transaction), so the Xid of a PyTorchJob's pod joins
    that job's incident."""
    ns = kube_namespace
    job = make(kube_admin, ns, "PyTorchJob", unique("llama"))
    pod = make(kube_admin, ns, "Pod", unique("llama-worker"), owner=job)
    engine = engine_for(["kubernetes"])
    body = json.dumps(payload(dcgm_xid("gpu-a", ns, pod["metadata"]["name"]))).encode()
    engine.accept(parse_notification(body), body)
    engine.inbox.ingest_all()
    [incident] = engine.incidents()
    assert incident["open_key"] == f"job:kubernetes/{ns}/{job['metadata']['name']}", incident["open_key"]
    assert incident["target"]["kind"] == "PyTorchJob"


def test_an_alert_whose_pod_is_gone_restarts_the_job_its_train_job_label_names(
    engine_for: Callable[[list[str]], Engine], kube_admin: KubeAdmin, kube_namespace: str
) -> None:
    """After a crash the operator replaced the pod; Prometheus still has the old pod's series with train_job. The
    job is the one that label names, by its own kind; a label naming no job leaves the alert node-level."""
    ns = kube_namespace
    job = make(kube_admin, ns, "PyTorchJob", unique("llama"))
    name = job["metadata"]["name"]
    engine = engine_for(["kubernetes"])
    gone = dcgm_xid("gpu-a", ns, f"{name}-worker-0")
    gone["labels"]["train_job"] = name
    stale = dcgm_xid("gpu-b", ns, "old-worker-0")
    stale["labels"]["train_job"] = "nonesuch"
    report = engine.explain(parse_notification(json.dumps(payload(gone, stale))))

    by_key = {ep["episode"]: ep for ep in report["episodes"]}
    job_key = f"job:kubernetes/{ns}/{name}"
    assert set(by_key) == {job_key, "node:kubernetes/gpu-b"}, sorted(by_key)
    assert by_key[job_key]["target"]["kind"] == "PyTorchJob"
    [restart] = [s for s in by_key[job_key]["job_plan"]["steps"] if s["action"] == "kubernetes.restart_job"]
    assert f"PATCH PyTorchJob {ns}/{name} runPolicy.suspend=true" in restart["command"], restart
    notes = [entry["job_lookup"] for entry in report["alerts"]]
    assert f"pod {ns}/{name}-worker-0 does not exist" in notes[0] and f"PyTorchJob {ns}/{name}" in notes[0]
    assert "train_job=nonesuch: no training job of that name" in notes[1] and "node-level" in notes[1]


def test_one_deployment_on_both_schedulers_plans_scontrol_for_a_slurm_node_and_the_api_for_a_kubernetes_one(
    engine_for: Callable[[list[str]], Engine], kube_admin: KubeAdmin, kube_namespace: str
) -> None:
    """schedulers: [slurm, kubernetes]: the Slurm node's Xid (no namespace) drains it with scontrol; the
    Kubernetes pod's Xid restarts its PyTorchJob through the API and cordons its node; neither plans the other's."""
    ns = kube_namespace
    job = make(kube_admin, ns, "PyTorchJob", unique("llama"))
    pod = make(kube_admin, ns, "Pod", unique("p"), owner=job)
    engine = engine_for(["slurm", "kubernetes"])
    slurm_node = alert({"alertname": "GpuXidError", "Hostname": "node7", "gpu": "0", "xid": "79",
                        "xid_class": "reboot", "severity": "critical"})  # fmt: skip
    kube_pod = dcgm_xid("gpu-k", ns, pod["metadata"]["name"])
    report = engine.explain(parse_notification(json.dumps(payload(slurm_node, kube_pod))))

    by_key = {ep["episode"]: ep for ep in report["episodes"]}
    job_key = f"job:kubernetes/{ns}/{job['metadata']['name']}"
    assert [a["episodes"] for a in report["alerts"]][1] == [job_key]
    assert "node:slurm/node7" in by_key, sorted(by_key)
    slurm_text = json.dumps([ep for key, ep in by_key.items() if key != job_key])
    kube_text = json.dumps(by_key[job_key])
    assert "scontrol update NodeName=node7" in slurm_text and "kubernetes." not in slurm_text
    assert "scontrol" not in kube_text and "slurm." not in kube_text
    [restart] = by_key[job_key]["job_plan"]["steps"]
    assert restart["action"] == "kubernetes.restart_job" and "PyTorchJob" in restart["command"]
    [node_plan] = by_key[job_key]["node_plans"]
    assert node_plan["steps"][0]["action"] == "kubernetes.cordon_node"
