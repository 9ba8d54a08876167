"""deploy/ on a real kube-apiserver: the ClusterRole suffices for every Kubernetes action, and grants no more.

The ``remediator`` token authenticates as the ``nightshift/nightshift`` ServiceAccount (tests/fixtures/kube.py),
so deploy/rbac.yaml is applied unchanged. Every manifest in deploy/ is also created on the apiserver and read
back, which catches misspelt fields (a 1.20 apiserver silently drops unknown fields rather than rejecting them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from app.actions.base import ActionContext
from app.actions.kubernetes import ACTIONS
from app.clients.kube import KubeClient
from app.config import load_settings
from app.outcome import Ok, Retry
from tests.fixtures.fake_kubelet import FakeKubelet
from tests.fixtures.kube import (
    IDENTITIES,
    REMEDIATOR_NAMESPACE,
    REMEDIATOR_SERVICE_ACCOUNT,
    KubeAdmin,
    KubeCluster,
    SuspendController,
    assert_contains,
    run_action,
)
from tests.fixtures.procs import wait_until

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = ("namespace.yaml", "rbac.yaml", "configmap.yaml", "deployment.yaml", "service.yaml")


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def role_rules() -> list[dict[str, Any]]:
    return next(d for d in documents("rbac.yaml") if d["kind"] == "ClusterRole")["rules"]


@pytest.fixture(scope="module")
def remediator(kube_cluster: KubeCluster, kube_admin: KubeAdmin) -> Iterator[KubeCluster]:
    """deploy/rbac.yaml (and its namespace) applied, and in force for the remediator identity."""
    for doc in [*documents("namespace.yaml"), *documents("rbac.yaml")]:
        kube_admin.apply(doc)
    kube = KubeClient.from_settings(kube_cluster.settings("remediator"))
    wait_until(lambda: kube.check() is None, 30, "the ClusterRoleBinding to take effect")
    kube.close()
    yield kube_cluster


def access_review(
    admin: KubeAdmin, verb: str, group: str, resource: str, namespace: str = "training"
) -> bool:
    """Would the ServiceAccount be allowed ``verb`` on ``group/resource`` (``pods/eviction`` style)?"""
    user, groups = IDENTITIES["remediator"]
    name, _, subresource = resource.partition("/")
    review = admin.resource("authorization.k8s.io/v1", "SubjectAccessReview").create(body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": list(groups), "resourceAttributes": {
            "verb": verb, "group": group, "resource": name, "subresource": subresource,
            "namespace": "" if name == "nodes" else namespace,
        }},
    })  # fmt: skip
    return bool(review.status.allowed)


def test_the_binding_names_the_deployments_service_account() -> None:
    rbac = documents("rbac.yaml")
    account = next(d for d in rbac if d["kind"] == "ServiceAccount")["metadata"]
    binding = next(d for d in rbac if d["kind"] == "ClusterRoleBinding")
    deployment = documents("deployment.yaml")[0]

    assert (account["namespace"], account["name"]) == (REMEDIATOR_NAMESPACE, REMEDIATOR_SERVICE_ACCOUNT)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]


def test_every_action_succeeds_with_only_the_deploy_role(
    remediator: KubeCluster,
    kube_admin: KubeAdmin,
    kube_context: Callable[..., ActionContext],
    fake_kubelet: FakeKubelet,
) -> None:
    ns = kube_admin.create_namespace("rbac")
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    evictee = kube_admin.create_pod(ns, node=node, labels={"app": "evictee"})
    kube_admin.create_pdb(ns, {"app": "evictee"}, disruptions_allowed=1)
    victim = kube_admin.create_pod(ns, node=node)
    fake_kubelet.set_log(ns, victim, "main", "NCCL WARN timeout\n")
    kube_admin.create_job(ns, "job")
    for kind, name in (("PyTorchJob", "ptj"), ("JobSet", "js")):
        kube_admin.create_training_job(ns, kind, name)
    operators = [
        SuspendController(kube_admin, "PyTorchJob", ns, "ptj"),
        SuspendController(kube_admin, "JobSet", ns, "js"),
    ]
    ctx = kube_context("remediator")
    steps: list[tuple[str, dict[str, Any]]] = [
        ("kubernetes.cordon_node", {"node": node}),
        ("kubernetes.taint_node", {"node": node, "key": "nightshift.io/gpu-fault", "effect": "NoSchedule"}),
        ("kubernetes.uncordon_node", {"node": node}),
        ("kubernetes.evict_pod", {"namespace": ns, "pod": evictee}),
        ("kubernetes.pod_logs", {"namespace": ns, "pod": victim, "lines": 10}),
        ("kubernetes.delete_pod", {"namespace": ns, "pod": victim, "grace_seconds": 0}),
        ("kubernetes.restart_job", {"namespace": ns, "name": "job", "kind": "Job"}),
        ("kubernetes.restart_job", {"namespace": ns, "name": "ptj", "kind": "PyTorchJob"}),
        ("kubernetes.restart_job", {"namespace": ns, "name": "js", "kind": "JobSet"}),
    ]
    validation = {
        "node": node,
        "run": "1",
    }  # a node repair's validation pod, in the chart's release namespace
    try:
        outcomes = {
            f"{name}:{params.get('kind', '')}": run_action(name, ctx, **params) for name, params in steps
        }
        started = run_action("kubernetes.validate_node", ctx, **validation)
        assert isinstance(started, Retry), started
        namespace = ctx.settings.repair.validation_namespace
        assert fake_kubelet.finish_validation_pods(kube_admin, namespace, {node: 0})
        outcomes["kubernetes.validate_node:"] = run_action("kubernetes.validate_node", ctx, **validation)
    finally:
        for operator in operators:
            operator.stop()

    failed = {name: outcome for name, outcome in outcomes.items() if not isinstance(outcome, Ok)}
    assert failed == {}
    assert outcomes["kubernetes.pod_logs:"].data["log"] == "NCCL WARN timeout\n"
    assert {name for name, _ in steps} | {"kubernetes.validate_node"} == {
        action.name for action in ACTIONS
    }, "an action is missing from this test"


def test_the_role_grants_its_rules_and_nothing_else(remediator: KubeCluster, kube_admin: KubeAdmin) -> None:
    granted = [
        (verb, group, resource)
        for rule in role_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]
    outside = [
        ("delete", "", "nodes"), ("update", "", "nodes"), ("patch", "", "nodes/status"),
        ("create", "", "pods"), ("patch", "", "pods"), ("create", "", "pods/exec"),
        ("get", "", "secrets"), ("list", "", "secrets"), ("get", "", "configmaps"),
        ("update", "batch", "jobs"), ("patch", "batch", "jobs"), ("list", "batch", "jobs"),
        ("delete", "kubeflow.org", "pytorchjobs"), ("create", "kubeflow.org", "pytorchjobs"),
        ("delete", "jobset.x-k8s.io", "jobsets"), ("update", "jobset.x-k8s.io", "jobsets"),
        ("create", "rbac.authorization.k8s.io", "clusterrolebindings"), ("impersonate", "", "users"),
    ]  # fmt: skip

    assert all(access_review(kube_admin, *attrs) for attrs in granted), (
        "the review must see what the role grants"
    )
    assert [attrs for attrs in outside if access_review(kube_admin, *attrs)] == []


def test_deleting_a_node_is_forbidden(remediator: KubeCluster, kube_admin: KubeAdmin) -> None:
    node = kube_admin.create_node()
    with remediator.api_client("remediator") as api, pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(api).delete_node(node, _request_timeout=10)

    assert refused.value.status == 403
    assert 'cannot delete resource "nodes"' in json.loads(refused.value.body)["message"]
    assert kube_admin.node(node)["metadata"]["name"] == node


@pytest.mark.parametrize("name", MANIFESTS)
def test_deploy_manifests_are_accepted_as_written(name: str, kube_admin: KubeAdmin) -> None:
    for doc in documents(name):
        kube_admin.apply(doc)
        stored = kube_admin.get(
            doc["apiVersion"], doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace")
        )
        assert_contains(doc, stored, f"{name}:{doc['kind']}")


def test_the_shipped_settings_load(tmp_path: Path) -> None:
    """The rendered default settings (permissions, when given as chart values: tests/integration/test_chart.py)."""
    data = documents("configmap.yaml")[0]["data"]
    (tmp_path / "config.yaml").write_text(data["config.yaml"])

    settings = load_settings(tmp_path / "config.yaml", env={})

    assert settings.kubernetes.kubeconfig is None  # in-cluster ServiceAccount
    assert settings.permissions_file is None  # advisory until an operator opts in
