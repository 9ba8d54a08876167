"""A failure episode of a two-pod PyTorchJob on a real kube-apiserver (the test plays the kubelet and the training
operator): both ranks report NCCL errors, the exporter of one node an Xid with the labels dcgm-exporter really sends
(no train_job: its job is found from the pod's owner reference). One job incident, one restart of the job
whose new pods are kept off the culprit node, that node cordoned, validated and uncordoned; the other node untouched."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.domain.states import RepairState
from app.engine import Engine
from app.store import repairs
from tests.fixtures.fake_kubelet import FakeKubelet
from tests.fixtures.kube import (
    TRAINING_KINDS,
    KubeAdmin,
    KubeEngine,
    SuspendController,
    restarts_of_recovered_job,
)
from tests.payloads import alert, payload

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JOB_LABEL = "training.kubeflow.org/job-name"
GRANTS = (
    "kubernetes.restart_job",
    "kubernetes.cordon_node",
    "kubernetes.validate_node",
    "kubernetes.uncordon_node",
)
NCCL_K8S = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: nccl-failure-k8s}
match: ['alertname="TrainingJobError"', 'error_class="nccl"', 'namespace=~".+"']
target: {scheduler: kubernetes, node: "{{ labels.Hostname }}", namespace: "{{ labels.namespace }}",
         pod: "{{ labels.pod }}", job: "{{ labels.train_job }}"}
priority: 50
steps:
  - action: kubernetes.restart_job
    with: {namespace: "{{ target.namespace }}", name: "{{ target.job }}", kind: "{{ target.kind }}",
           exclude_nodes: "{{ incident.culprits }}"}
"""


@pytest.fixture
def engine(kube_engine: Callable[..., KubeEngine], kube_namespace: str) -> Engine:
    """The shipped gpu-xid playbooks and an NCCL twin, acting, validation pods in the test's namespace."""

    def settings(s: Settings) -> None:
        s.repair.validation_namespace = kube_namespace
        s.repair.return_timeout_seconds = 60
        s.episodes.correlation_seconds = 2

    shipped = (ROOT / "playbooks" / "gpu-xid.yaml").read_text()
    return kube_engine(f"{shipped}\n---\n{NCCL_K8S}", GRANTS, settings).engine


def labels(alertname: str, node: str, pod: str, namespace: str, **extra: str) -> dict[str, str]:
    """An alert's labels: the training alerts' (progress library: train_job) or dcgm-exporter's (no train_job)."""
    return {"alertname": alertname, "Hostname": node, "pod": pod, "namespace": namespace, **extra}


def test_one_restart_off_the_culprit_node_which_is_cordoned_then_uncordoned_after_validation(
    engine: Engine,
    kube_admin: KubeAdmin,
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
) -> None:
    nccl_engine = engine
    ns = kube_namespace
    healthy, faulty = (kube_admin.create_node("gpu", kubelet_port=fake_kubelet.port) for _ in range(2))
    job = kube_admin.create_training_job(ns, "PyTorchJob", "llama")
    pods = {
        node: kube_admin.create_pod(ns, "llama", node=node, labels={JOB_LABEL: "llama"}, owner=job)
        for node in (healthy, faulty)
    }
    operator = SuspendController(kube_admin, "PyTorchJob", ns, "llama")
    alerts = [
        alert(
            labels(
                "TrainingJobError",
                healthy,
                pods[healthy],
                ns,
                error_class="nccl",
                rank="0",
                train_job="llama",
            )
        ),
        alert(
            labels(
                "TrainingJobError", faulty, pods[faulty], ns, error_class="nccl", rank="1", train_job="llama"
            )
        ),
        # What dcgm-exporter sends in Kubernetes mode: no train_job; the job is found from the pod.
        alert(
            labels(
                "GpuXidError",
                faulty,
                pods[faulty],
                ns,
                xid="79",
                xid_class="reboot",
                gpu="3",
                UUID="GPU-5fd4-a1",
                modelName="NVIDIA H100 80GB HBM3",
                container="pytorch",
            )
        ),
    ]
    try:
        result = nccl_engine.ingest(parse_notification(json.dumps(payload(*alerts))))
        assert len(result.opened) == 1 and len(result.attached) == 2
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            nccl_engine.work_once("it")
            fake_kubelet.finish_validation_pods(kube_admin, ns, {faulty: 0})
            (incident,) = nccl_engine.incidents()
            with nccl_engine.deps.store.read() as conn:
                repair = repairs.list_repairs(conn, node=faulty, limit=1)
            if incident["outcome"] and repair and repair[0].state == RepairState.RETURNED:
                break
            time.sleep(0.2)
    finally:
        operator.stop()
    restarts = restarts_of_recovered_job(nccl_engine, incident, faulty)
    assert [(s["status"], s["params"]["exclude_nodes"]) for s in restarts] == [("ok", faulty)]
    assert operator.observed == [False, True, False]  # suspended once (its pods deleted), then resumed
    job = kube_admin.get(TRAINING_KINDS["PyTorchJob"][0], "PyTorchJob", "llama", ns)
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        terms = replica["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [faulty]}]}
        ]
    (repair,) = repair
    assert [s["step"] for s in repair.steps if s["status"] == "ok"] == ["take_out", "validate", "return"]
    assert not kube_admin.node(faulty)["spec"].get("unschedulable")  # uncordoned after validation
    assert not kube_admin.node(healthy)["spec"].get("unschedulable")  # never touched
    with nccl_engine.deps.store.read() as conn:
        assert repairs.list_repairs(conn, node=healthy) == []
