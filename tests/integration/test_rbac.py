"""The chart's RBAC on a real kube-apiserver: its roles suffice for every Kubernetes action, and grant no more.

The chart is rendered with one training namespace (``rbac.trainingNamespaces``) and its RBAC objects applied
unchanged; the ``remediator`` token authenticates as the ``nightshift/nightshift`` ServiceAccount
(tests/fixtures/kube.py). Every action then runs with that identity, and SubjectAccessReviews check that what lies
outside the documented rules is refused: creating pods or Jobs anywhere but where the table says, acting in a
namespace not listed, exec, secrets, deleting nodes. Every manifest of deploy/ (the chart with its defaults) is
also created on the apiserver and read back, which catches misspelt fields (a 1.20 apiserver silently drops unknown
fields rather than rejecting them).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from app.actions.base import ActionContext
from app.actions.kubernetes import ACTIONS
from app.actions.kubernetes_exec import ACTIONS as EXEC_ACTIONS
from app.actions.kubernetes_exec import CHECKPOINT_REQUEST
from app.actions.kubernetes_rollback import ACTIONS as ROLLBACK_ACTIONS
from app.actions.kubernetes_rollback import COMPONENT
from app.clients.kube import KubeClient
from app.config import load_settings
from app.domain.outcome import Ok, Retry
from tests.fixtures.containers import rbac_grants, render
from tests.fixtures.fake_kubelet import FakeKubelet
from tests.fixtures.kube import (
    IDENTITIES,
    REMEDIATOR_NAMESPACE,
    REMEDIATOR_SERVICE_ACCOUNT,
    JobRunner,
    KubeAdmin,
    KubeCluster,
    SuspendController,
    assert_contains,
    run_action,
    run_training_pod,
)
from tests.fixtures.procs import wait_until

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = ("namespace.yaml", "rbac.yaml", "configmap.yaml", "deployment.yaml", "service.yaml")
TRAINING = "rbac-training"  # the one namespace the rendered chart lets Nightshift act in
ELSEWHERE = "rbac-elsewhere"  # a namespace it does not list
PY_SPY = Path(sys.executable).parent / "py-spy"  # in the "training image": this venv
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


@pytest.fixture(scope="module")
def chart_rbac(helm: str) -> list[dict[str, Any]]:
    """The chart's RBAC objects, rendered to act in :data:`TRAINING`, exec included."""
    docs = render(
        helm, "--set", f"rbac.trainingNamespaces={{{TRAINING}}}", "--set", "rbac.podExec=true",
        namespace=REMEDIATOR_NAMESPACE,
    )  # fmt: skip
    return [doc for doc in docs if doc["kind"] in RBAC_KINDS]


@pytest.fixture(scope="module")
def remediator(
    kube_cluster: KubeCluster, kube_admin: KubeAdmin, chart_rbac: list[dict[str, Any]]
) -> Iterator[KubeCluster]:
    """The rendered RBAC (and its namespaces) applied, and in force for the remediator identity."""
    for namespace in (REMEDIATOR_NAMESPACE, TRAINING, ELSEWHERE):
        kube_admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for doc in chart_rbac:
        kube_admin.apply(doc)
    kube = KubeClient.from_settings(kube_cluster.settings("remediator"))
    wait_until(lambda: kube.check() is None, 30, "the ClusterRoleBinding to take effect")
    kube.close()
    yield kube_cluster


def access_review(admin: KubeAdmin, verb: str, group: str, resource: str, namespace: str) -> bool:
    """Would the ServiceAccount be allowed ``verb`` on ``group/resource`` (``pods/eviction`` style) in
    ``namespace`` ("" : cluster-wide, or a cluster-scoped resource)?"""
    user, groups = IDENTITIES["remediator"]
    name, _, subresource = resource.partition("/")
    review = admin.resource("authorization.k8s.io/v1", "SubjectAccessReview").create(body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": list(groups), "resourceAttributes": {
            "verb": verb, "group": group, "resource": name, "subresource": subresource, "namespace": namespace,
        }},
    })  # fmt: skip
    return bool(review.status.allowed)


def test_the_bindings_name_the_deployments_service_account(chart_rbac: list[dict[str, Any]]) -> None:
    account = next(d for d in documents("rbac.yaml") if d["kind"] == "ServiceAccount")["metadata"]
    deployment = documents("deployment.yaml")[0]
    bindings = [d for d in chart_rbac if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]

    assert (account["namespace"], account["name"]) == (REMEDIATOR_NAMESPACE, REMEDIATOR_SERVICE_ACCOUNT)
    assert bindings and all(
        b["subjects"]
        == [{"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}]
        for b in bindings
    )
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]


def test_every_action_succeeds_with_only_the_charts_roles(
    remediator: KubeCluster,
    kube_admin: KubeAdmin,
    kube_context: Callable[..., ActionContext],
    fake_kubelet: FakeKubelet,
    tmp_path: Path,
) -> None:
    ns = TRAINING
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    talker = kube_admin.create_training_job(
        ns, "PyTorchJob", "talker", annotations={CHECKPOINT_REQUEST: "file"}
    )
    request = tmp_path / "checkpoint-request"
    sleeper = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
    env = {"NIGHTSHIFT_CHECKPOINT_REQUEST_FILE": str(request)}
    # On a node of its own: its pod holds a GPU, which would keep the validation below waiting.
    run_training_pod(kube_admin, fake_kubelet, talker, kube_admin.create_node(kubelet_port=fake_kubelet.port),
                     sleeper, env, tmp_path)  # fmt: skip
    # A job whose checkpoints a rollback Job reaches through its volume (a hostPath at its own path: the test's
    # JobRunner runs the Jobs here).
    checkpoints = tmp_path / "checkpoints"
    for tag in ("global_step1", "global_step2"):
        (checkpoints / "keeper" / tag).mkdir(parents=True)
    (checkpoints / "keeper" / "latest").write_text("global_step2")
    pod = {"containers": [{"name": "pytorch", "image": "trainer:1",
                           "volumeMounts": [{"name": "ckpt", "mountPath": str(checkpoints)}]}],
           "volumes": [{"name": "ckpt", "hostPath": {"path": str(checkpoints)}}]}  # fmt: skip
    kube_admin.apply({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                      "metadata": {"name": "keeper", "namespace": ns},
                      "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"spec": pod}}}}})  # fmt: skip
    runner = JobRunner(
        kube_admin, fake_kubelet, ns, node, f"app.kubernetes.io/component={COMPONENT}", tmp_path
    )
    evictee = kube_admin.create_pod(ns, node=node, labels={"app": "evictee"})
    kube_admin.create_pdb(ns, {"app": "evictee"}, disruptions_allowed=1)
    victim = kube_admin.create_pod(ns, node=node)
    fake_kubelet.set_log(ns, victim, "main", "NCCL WARN timeout\n")
    kube_admin.create_job(ns, "job")
    for kind, name in (("PyTorchJob", "ptj"), ("JobSet", "js")):
        kube_admin.create_training_job(ns, kind, name)
    failed = kube_admin.create_training_job(ns, "PyTorchJob", "failed")
    kube_admin.merge_patch(
        "kubeflow.org/v1", "PyTorchJob", "failed", namespace=ns, status=True,
        patch={"status": {"conditions": [{"type": "Failed", "status": "True"}]}},
    )  # fmt: skip
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
        ("kubernetes.restart_job", {"namespace": ns, "name": "failed", "kind": "PyTorchJob"}),  # recreated
        ("kubernetes.job_stacks", {"namespace": ns, "job": "talker", "py_spy": str(PY_SPY)}),
        ("kubernetes.request_checkpoint", {"namespace": ns, "name": "talker", "kind": "PyTorchJob"}),
        ("kubernetes.checkpoint_rollback", {"namespace": ns, "name": "keeper", "kind": "PyTorchJob",
                                            "dir": str(checkpoints / "keeper")}),
    ]  # fmt: skip
    validation = {
        "node": node,
        "run": "1",
    }  # a node repair's validation pod, in the chart's release namespace
    ctx.settings.repair.validation_namespace = REMEDIATOR_NAMESPACE
    ctx.settings.checkpoint.allowed_roots = [str(checkpoints)]
    try:
        outcomes = {
            f"{name}:{params.get('name', '')}": run_action(name, ctx, **params) for name, params in steps
        }
        started = run_action("kubernetes.validate_node", ctx, **validation)
        assert isinstance(started, Retry), started
        assert fake_kubelet.finish_validation_pods(kube_admin, REMEDIATOR_NAMESPACE, {node: 0})
        outcomes["kubernetes.validate_node:"] = run_action("kubernetes.validate_node", ctx, **validation)
    finally:
        for operator in operators:
            operator.stop()
        runner.stop()

    refused = {name: outcome for name, outcome in outcomes.items() if not isinstance(outcome, Ok)}
    assert refused == {}
    assert outcomes["kubernetes.pod_logs:"].data["log"] == "NCCL WARN timeout\n"
    recreated = kube_admin.get("kubeflow.org/v1", "PyTorchJob", "failed", ns)
    assert recreated["metadata"]["uid"] != failed["metadata"]["uid"]
    assert outcomes["kubernetes.job_stacks:"].data["processes"] == 1 and request.exists()
    assert (checkpoints / "keeper" / "latest").read_text() == "global_step1"
    assert {name for name, _ in steps} | {"kubernetes.validate_node"} == {
        action.name for action in (*ACTIONS, *EXEC_ACTIONS, *ROLLBACK_ACTIONS)
    }, "an action is missing from this test"


def test_the_same_actions_are_refused_in_a_namespace_not_listed(
    remediator: KubeCluster,
    kube_admin: KubeAdmin,
    kube_context: Callable[..., ActionContext],
    fake_kubelet: FakeKubelet,
    tmp_path: Path,
) -> None:
    kube_admin.create_job(ELSEWHERE, "job")
    job = kube_admin.create_training_job(
        ELSEWHERE, "PyTorchJob", "ptj", annotations={CHECKPOINT_REQUEST: "USR1"}
    )
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    run_training_pod(kube_admin, fake_kubelet, job, node, [sys.executable, "-c", "input()"], {}, tmp_path)
    ctx = kube_context("remediator")
    execs = len(fake_kubelet.execs)

    stacks = run_action("kubernetes.job_stacks", ctx, namespace=ELSEWHERE, job="ptj")
    assert stacks.status == "credential_error" and 'cannot get resource "pods/exec"' in stacks.reason, stacks
    assert len(fake_kubelet.execs) == execs  # refused by the apiserver: the kubelet never saw it

    for kind, name in (("Job", "job"), ("PyTorchJob", "ptj")):
        outcome = run_action("kubernetes.restart_job", ctx, namespace=ELSEWHERE, name=name, kind=kind)
        assert outcome.status == "credential_error", outcome
        assert "forbidden" in outcome.reason.lower() and ELSEWHERE in outcome.reason
    assert (
        kube_admin.get("kubeflow.org/v1", "PyTorchJob", "ptj", ELSEWHERE)["spec"]["runPolicy"]["suspend"]
        is False
    )


def test_the_roles_grant_their_rules_where_bound_and_nothing_else(
    remediator: KubeCluster, kube_admin: KubeAdmin, chart_rbac: list[dict[str, Any]]
) -> None:
    outside = [
        ("delete", "", "nodes", ""), ("update", "", "nodes", ""), ("patch", "", "nodes/status", ""),
        ("create", "", "pods", ""), ("create", "", "pods", TRAINING), ("create", "", "pods", ELSEWHERE),
        ("patch", "", "pods", TRAINING), ("delete", "", "pods", ELSEWHERE),
        ("create", "", "pods/eviction", ELSEWHERE), ("get", "", "pods/log", ELSEWHERE),
        ("create", "", "pods/exec", ELSEWHERE), ("get", "", "pods/exec", ELSEWHERE),
        ("create", "", "pods/exec", REMEDIATOR_NAMESPACE),
        ("create", "batch", "jobs", ""), ("create", "batch", "jobs", ELSEWHERE),
        ("create", "batch", "jobs", REMEDIATOR_NAMESPACE), ("delete", "batch", "jobs", ELSEWHERE),
        ("update", "batch", "jobs", TRAINING), ("patch", "batch", "jobs", TRAINING), ("list", "batch", "jobs", ""),
        ("patch", "kubeflow.org", "pytorchjobs", ELSEWHERE), ("create", "kubeflow.org", "pytorchjobs", ""),
        ("update", "jobset.x-k8s.io", "jobsets", TRAINING),
        ("get", "", "secrets", TRAINING), ("list", "", "secrets", ""), ("get", "", "configmaps", TRAINING),
        ("create", "rbac.authorization.k8s.io", "rolebindings", TRAINING), ("impersonate", "", "users", ""),
        ("create", "", "serviceaccounts/token", TRAINING),
    ]  # fmt: skip
    rules = rbac_grants(chart_rbac)

    assert ("create", "", "pods", REMEDIATOR_NAMESPACE) in rules  # the validation pods, and only there
    assert all(access_review(kube_admin, *attrs) for attrs in rules), (
        "the review must see what the roles grant"
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
    assert (
        settings.repair.validation_namespace == REMEDIATOR_NAMESPACE
    )  # where the chart's Role lets pods be made
