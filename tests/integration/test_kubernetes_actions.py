"""Kubernetes actions against a real kube-apiserver v1.20 + etcd (tests/fixtures/kube.py).

The tests play the controllers that do not run here: the kubelet (pod status, logs through a fake kubelet),
the disruption controller (PDB status) and the training operator / JobSet controller (the Suspended condition).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.actions.base import ActionContext
from app.actions.kubernetes import CORDONED_AT, CORDONED_BY, RESTARTED_AT, SUSPENDED_BY, RestartJob
from app.clients.kube import CONFLICT_ATTEMPTS, KubeClient
from app.domain.errors import CredentialRejected
from app.domain.job_phase import JobPhase
from app.domain.outcome import Ambiguous, CredentialError, Failed, Ok, Retry
from app.workloads import kubernetes_job_status
from tests.fixtures.fake_kubelet import FakeKubelet
from tests.fixtures.kube import (
    GPU,
    TRAINING_KINDS,
    KubeAdmin,
    KubeCluster,
    SuspendController,
    is_suspended,
    run_action,
)
from tests.fixtures.procs import free_port, wait_until

pytestmark = pytest.mark.integration

MakeContext = Callable[..., ActionContext]


# -- nodes ---------------------------------------------------------------------------------------------------


def test_cordon_records_ownership_and_uncordon_removes_it(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    ctx = kube_context()
    node = kube_admin.create_node()
    pod = kube_admin.create_pod(kube_namespace, node=node)

    outcome = run_action("kubernetes.cordon_node", ctx, node=node)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["changed"] is True
    assert outcome.data["pods"] == [f"{kube_namespace}/{pod}"]
    cordoned = kube_admin.node(node)
    assert cordoned["spec"]["unschedulable"] is True
    assert cordoned["metadata"]["annotations"][CORDONED_BY] == "nightshift"
    assert cordoned["metadata"]["annotations"][CORDONED_AT].endswith("Z")

    again = run_action("kubernetes.cordon_node", ctx, node=node)
    assert isinstance(again, Ok)
    assert (again.data["changed"], again.data["cordoned_by"]) == (False, "nightshift")

    back = run_action("kubernetes.uncordon_node", ctx, node=node)

    assert isinstance(back, Ok) and back.data["changed"] is True
    restored = kube_admin.node(node)
    assert not restored["spec"].get("unschedulable")
    assert not {CORDONED_BY, CORDONED_AT} & set(restored["metadata"].get("annotations") or {})


def test_a_node_cordoned_by_someone_else_is_not_ours(
    kube_admin: KubeAdmin, kube_context: MakeContext
) -> None:
    ctx = kube_context()
    node = kube_admin.create_node(unschedulable=True, annotations={"ops.example.com/reason": "disk swap"})

    cordon = run_action("kubernetes.cordon_node", ctx, node=node)
    uncordon = run_action("kubernetes.uncordon_node", ctx, node=node)

    assert (
        isinstance(cordon, Ok) and cordon.data["changed"] is False and cordon.data["cordoned_by"] == "unknown"
    )
    assert isinstance(uncordon, Ok) and uncordon.data["changed"] is False
    after = kube_admin.node(node)
    assert after["spec"]["unschedulable"] is True
    assert after["metadata"]["annotations"] == {"ops.example.com/reason": "disk swap"}


def test_taint_adds_then_replaces_the_same_key(kube_admin: KubeAdmin, kube_context: MakeContext) -> None:
    ctx = kube_context()
    foreign = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    node = kube_admin.create_node(taints=[foreign])
    key = "nightshift.io/gpu-fault"

    outcomes = [
        run_action("kubernetes.taint_node", ctx, node=node, key=key, value=value, effect=effect)
        for value, effect in (("xid-79", "NoSchedule"), ("xid-48", "NoExecute"), ("xid-48", "NoExecute"))
    ]

    assert [o.data["changed"] for o in outcomes] == [True, True, False]
    taints = kube_admin.node(node)["spec"]["taints"]
    assert [t for t in taints if t["key"] == key] == [{"key": key, "value": "xid-48", "effect": "NoExecute"}]
    assert foreign in taints


def test_untaint_removes_only_that_key(kube_admin: KubeAdmin, kube_context: MakeContext) -> None:
    foreign = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    ours = {"key": "nightshift.io/gpu-fault", "effect": "NoExecute"}
    node = kube_admin.create_node(taints=[foreign, ours])
    kube: KubeClient = kube_context().clients.kube

    assert kube.untaint(node, ours["key"]) is True
    assert kube.untaint(node, ours["key"]) is False
    taints = kube_admin.node(node)["spec"]["taints"]
    assert foreign in taints and not any(t["key"] == ours["key"] for t in taints)


def test_taint_retries_when_a_concurrent_write_wins(
    kube_admin: KubeAdmin, kube_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone adds a taint between our read and write: the write gets a real 409; we re-read and keep theirs."""
    ctx = kube_context()
    node = kube_admin.create_node()
    kube: KubeClient = ctx.clients.kube
    real_get_node = kube.get_node
    reads: list[str] = []

    def get_node_then_race(name: str) -> dict[str, Any]:
        current = real_get_node(name)
        reads.append(current["metadata"]["resourceVersion"])
        if len(reads) == 1:
            taints = [*(current["spec"].get("taints") or []), {"key": "other", "effect": "NoSchedule"}]
            kube_admin.merge_patch("v1", "Node", name, {"spec": {"taints": taints}})
        return current

    monkeypatch.setattr(kube, "get_node", get_node_then_race)

    outcome = run_action(
        "kubernetes.taint_node", ctx, node=node, key="nightshift.io/gpu-fault", effect="NoSchedule"
    )

    assert isinstance(outcome, Ok), outcome
    assert len(reads) == 2 and reads[0] != reads[1]
    keys = {t["key"] for t in kube_admin.node(node)["spec"]["taints"]}
    assert {"other", "nightshift.io/gpu-fault"} <= keys


def test_taint_gives_up_after_bounded_conflicts(
    kube_admin: KubeAdmin, kube_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = kube_context()
    node = kube_admin.create_node()
    kube: KubeClient = ctx.clients.kube
    real_get_node = kube.get_node
    reads = 0

    def always_race(name: str) -> dict[str, Any]:
        nonlocal reads
        reads += 1
        current = real_get_node(name)
        kube_admin.merge_patch("v1", "Node", name, {"metadata": {"labels": {"race": str(reads)}}})
        return current

    monkeypatch.setattr(kube, "get_node", always_race)

    outcome = run_action("kubernetes.taint_node", ctx, node=node, key="k", effect="NoSchedule")

    assert isinstance(outcome, Failed) and "still conflicting" in outcome.reason
    assert reads == CONFLICT_ATTEMPTS
    assert not any(t["key"] == "k" for t in kube_admin.node(node)["spec"].get("taints") or [])


# -- pods ----------------------------------------------------------------------------------------------------


def test_evict_allowed_by_the_disruption_budget(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    node = kube_admin.create_node()
    pod = kube_admin.create_pod(kube_namespace, node=node, labels={"app": "trainer"})
    pdb = kube_admin.create_pdb(kube_namespace, {"app": "trainer"}, disruptions_allowed=1)

    outcome = run_action(
        "kubernetes.evict_pod", kube_context(), namespace=kube_namespace, pod=pod, grace_seconds=5
    )

    assert isinstance(outcome, Ok), outcome
    evicted = kube_admin.pod_or_none(kube_namespace, pod)
    # No kubelet finishes the termination: the pod stays Terminating with our grace period.
    assert evicted is not None and evicted["metadata"]["deletionTimestamp"]
    assert evicted["metadata"]["deletionGracePeriodSeconds"] == 5
    budget = kube_admin.get("policy/v1beta1", "PodDisruptionBudget", pdb, kube_namespace)["status"]
    assert budget["disruptionsAllowed"] == 0 and pod in budget["disruptedPods"]


@pytest.mark.parametrize(("api_version", "accepted"), [("policy/v1beta1", True), ("policy/v1", False)])
def test_the_eviction_api_version_setting_reaches_the_server(
    api_version: str, accepted: bool, kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    """1.20 serves Eviction only as policy/v1beta1: the configured version is what the body carries."""
    pod = kube_admin.create_pod(kube_namespace, node=kube_admin.create_node())
    ctx = kube_context(eviction_api_version=api_version)

    outcome = run_action("kubernetes.evict_pod", ctx, namespace=kube_namespace, pod=pod)

    if accepted:
        assert isinstance(outcome, Ok), outcome
    else:
        assert isinstance(outcome, Failed) and "HTTP 400" in outcome.reason and "policy/v1" in outcome.reason


def test_evict_refused_by_the_disruption_budget_is_a_retry(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    node = kube_admin.create_node()
    pod = kube_admin.create_pod(kube_namespace, node=node, labels={"app": "trainer"})
    kube_admin.create_pdb(kube_namespace, {"app": "trainer"}, disruptions_allowed=0)

    outcome = run_action("kubernetes.evict_pod", kube_context(), namespace=kube_namespace, pod=pod)

    assert isinstance(outcome, Retry), outcome
    assert outcome.after > 0 and "disruption budget" in outcome.reason
    assert "deletionTimestamp" not in kube_admin.pod_or_none(kube_namespace, pod)["metadata"]


def test_delete_pod(kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str) -> None:
    pod = kube_admin.create_pod(kube_namespace, node=kube_admin.create_node())

    outcome = run_action(
        "kubernetes.delete_pod", kube_context(), namespace=kube_namespace, pod=pod, grace_seconds=0
    )

    assert isinstance(outcome, Ok), outcome
    assert kube_admin.pod_or_none(kube_namespace, pod) is None


def test_negative_grace_is_rejected_before_any_call() -> None:
    from app.actions.kubernetes import DeletePod
    from app.domain.errors import ParamError

    with pytest.raises(ParamError, match="must be >= 0"):
        DeletePod().validate({"namespace": "ns", "pod": "p", "grace_seconds": -1})


def test_pod_logs_come_through_the_apiserver(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str, fake_kubelet: FakeKubelet
) -> None:
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    pod = kube_admin.create_pod(kube_namespace, node=node, containers=("trainer", "sidecar"))
    fake_kubelet.set_log(kube_namespace, pod, "trainer", "".join(f"step {i} loss 0.{i}\n" for i in range(50)))

    outcome = run_action(
        "kubernetes.pod_logs", kube_context(), namespace=kube_namespace, pod=pod, container="trainer", lines=3
    )

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["log"] == "step 47 loss 0.47\nstep 48 loss 0.48\nstep 49 loss 0.49\n"
    assert [q["tailLines"] for q in fake_kubelet.requests_for(kube_namespace, pod)] == [["3"]]


def test_pod_logs_need_a_container_when_the_pod_has_several(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str, fake_kubelet: FakeKubelet
) -> None:
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    pod = kube_admin.create_pod(kube_namespace, node=node, containers=("trainer", "sidecar"))

    outcome = run_action("kubernetes.pod_logs", kube_context(), namespace=kube_namespace, pod=pod)

    assert (
        isinstance(outcome, Failed) and "HTTP 400" in outcome.reason and "trainer sidecar" in outcome.reason
    )


# -- restart -------------------------------------------------------------------------------------------------


def test_restart_job_recreates_it_from_its_spec(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    before = kube_admin.create_job(
        kube_namespace,
        "train",
        spec={"backoffLimit": 2, "parallelism": 2, "completions": 4},
        metadata={"annotations": {"team": "llm"}},
        template_labels={"app": "train"},
    )

    outcome = run_action(
        "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="train", kind="Job"
    )

    assert isinstance(outcome, Ok), outcome
    after = kube_admin.get("batch/v1", "Job", "train", kube_namespace)
    old_uid, new_uid = before["metadata"]["uid"], after["metadata"]["uid"]
    assert outcome.data == {"previous_uid": old_uid, "uid": new_uid, "added": [], "dropped": []}
    assert new_uid != old_uid
    # The apiserver generated a fresh selector for the new uid; nothing refers to the old one.
    assert after["spec"]["selector"]["matchLabels"] == {"controller-uid": new_uid}
    assert old_uid not in json.dumps(after)
    # The user's labels, annotations and spec are kept.
    assert after["spec"]["template"]["metadata"]["labels"]["app"] == "train"
    assert after["metadata"]["labels"]["app"] == "train"
    assert [after["spec"][k] for k in ("parallelism", "completions", "backoffLimit")] == [2, 4, 2]
    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == "trainer:1"
    assert after["metadata"]["annotations"]["team"] == "llm"
    assert RESTARTED_AT in after["metadata"]["annotations"]


def test_restart_drops_the_returned_nodes_from_the_job_and_keeps_the_others(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    """gpu-a was kept off by someone else, gpu-b by Nightshift and is back in service (return_nodes), gpu-c is the
    new culprit: the recreated Job keeps its pods off gpu-a and gpu-c."""
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a", "gpu-b"]}]}
    ]}}}  # fmt: skip
    template = {"spec": {"restartPolicy": "Never", "affinity": affinity,
                         "containers": [{"name": "c", "image": "trainer:1"}]}}  # fmt: skip
    kube_admin.create_job(kube_namespace, "train", spec={"template": template})

    outcome = run_action(
        "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="train", kind="Job",
        exclude_nodes="gpu-c", return_nodes="gpu-b",
    )  # fmt: skip

    assert isinstance(outcome, Ok), outcome
    assert (outcome.data["added"], outcome.data["dropped"]) == (["gpu-c"], ["gpu-b"])
    after = kube_admin.get("batch/v1", "Job", "train", kube_namespace)
    [term] = after["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a", "gpu-c"]}
    ]


def test_restart_job_leaves_a_job_owned_by_a_controller(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    owner = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "name": "gang",
        "uid": "0b7c1c9e-0000-4000-8000-000000000001",
        "controller": True,
    }
    before = kube_admin.create_job(kube_namespace, "gang-workers-0", metadata={"ownerReferences": [owner]})

    outcome = run_action(
        "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="gang-workers-0", kind="Job"
    )

    assert isinstance(outcome, Failed) and "JobSet gang" in outcome.reason
    after = kube_admin.get("batch/v1", "Job", "gang-workers-0", kube_namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]


@pytest.mark.parametrize("kind", ["PyTorchJob", "JobSet"])
def test_restart_suspends_until_the_operator_acts_then_resumes(
    kind: str, kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    kube_admin.create_training_job(kube_namespace, kind, "llm")
    operator = SuspendController(kube_admin, kind, kube_namespace, "llm")
    try:
        outcome = run_action(
            "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="llm", kind=kind
        )
        assert isinstance(outcome, Ok), outcome
        # The operator really saw the job suspended (it would have deleted the pods) and then resumed.
        wait_until(lambda: len(operator.observed) == 3, 10, "the operator to see the resume")
        assert operator.observed == [False, True, False]
    finally:
        operator.stop()

    after = kube_admin.get(TRAINING_KINDS[kind][0], kind, "llm", kube_namespace)
    assert is_suspended(kind, after) is False
    annotations = after["metadata"]["annotations"]
    assert RESTARTED_AT in annotations and SUSPENDED_BY not in annotations
    if kind == "PyTorchJob":
        assert after["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
        assert after["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    else:
        assert after["spec"]["replicatedJobs"][0]["replicas"] == 4


def test_restart_without_an_operator_is_ambiguous_and_resumes(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    kube_admin.create_training_job(kube_namespace, "JobSet", "orphan")
    restart = RestartJob(operator_timeout_seconds=0.5, poll_seconds=0.1)

    outcome = restart.run(
        restart.validate({"namespace": kube_namespace, "name": "orphan", "kind": "JobSet"}), kube_context()
    )

    assert isinstance(outcome, Ambiguous) and "did not report Suspended" in outcome.reason
    after = kube_admin.get(TRAINING_KINDS["JobSet"][0], "JobSet", "orphan", kube_namespace)
    assert after["spec"]["suspend"] is False and SUSPENDED_BY not in after["metadata"]["annotations"]


def test_restart_leaves_a_job_suspended_by_someone_else(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    kube_admin.create_training_job(kube_namespace, "PyTorchJob", "paused", suspended=True)

    outcome = run_action(
        "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="paused", kind="PyTorchJob"
    )

    assert isinstance(outcome, Failed) and "suspended by someone else" in outcome.reason
    after = kube_admin.get(TRAINING_KINDS["PyTorchJob"][0], "PyTorchJob", "paused", kube_namespace)
    assert after["spec"]["runPolicy"]["suspend"] is True


def test_restart_completes_one_it_left_suspended(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    kube_admin.create_training_job(
        kube_namespace, "PyTorchJob", "half", suspended=True, annotations={SUSPENDED_BY: "nightshift"}
    )
    operator = SuspendController(kube_admin, "PyTorchJob", kube_namespace, "half")
    try:
        outcome = run_action(
            "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="half", kind="PyTorchJob"
        )
        assert isinstance(outcome, Ok), outcome
        wait_until(lambda: len(operator.observed) == 2, 10, "the operator to see the resume")
        assert operator.observed == [True, False]
    finally:
        operator.stop()


def finish(admin: KubeAdmin, namespace: str, kind: str, name: str, condition: str) -> None:
    """Play the operator finishing the job: its terminal condition True in the status it writes."""
    status = {"conditions": [{"type": condition, "status": "True", "reason": f"Job{condition}",
                              "lastTransitionTime": "2025-01-01T00:00:00Z"}]}  # fmt: skip
    admin.merge_patch(
        TRAINING_KINDS[kind][0], kind, name, {"status": status}, namespace=namespace, status=True
    )


@pytest.mark.parametrize("kind", ["PyTorchJob", "JobSet"])
def test_a_failed_job_is_recreated_from_its_spec_off_the_culprits_not_suspended(
    kind: str, kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    """Its operator acts on no suspend once the job has finished (no operator runs here: a suspend would wait
    for a Suspended condition that never comes); a new incarnation is created instead."""
    before = kube_admin.create_training_job(kube_namespace, kind, "dead")
    finish(kube_admin, kube_namespace, kind, "dead", "Failed")

    outcome = run_action(
        "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="dead", kind=kind,
        exclude_nodes="gpu-7",
    )  # fmt: skip

    assert isinstance(outcome, Ok), outcome
    after = kube_admin.get(TRAINING_KINDS[kind][0], kind, "dead", kube_namespace)
    assert after["metadata"]["uid"] != before["metadata"]["uid"] == outcome.data["previous_uid"]
    assert "status" not in after or not after["status"].get("conditions")
    assert is_suspended(kind, after) is False and RESTARTED_AT in after["metadata"]["annotations"]
    if kind == "PyTorchJob":
        templates = [r["template"] for r in after["spec"]["pytorchReplicaSpecs"].values()]
    else:
        templates = [j["template"]["spec"]["template"] for j in after["spec"]["replicatedJobs"]]
    for template in templates:
        [term] = template["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-7"]} in term[
            "matchExpressions"
        ]


def test_a_job_that_succeeded_is_not_restarted(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    before = kube_admin.create_training_job(kube_namespace, "PyTorchJob", "done")
    finish(kube_admin, kube_namespace, "PyTorchJob", "done", "Succeeded")

    outcome = run_action(
        "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="done", kind="PyTorchJob"
    )

    assert isinstance(outcome, Failed) and "has finished (Succeeded): not restarted" in outcome.reason
    after = kube_admin.get(TRAINING_KINDS["PyTorchJob"][0], "PyTorchJob", "done", kube_namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"] and after["spec"] == before["spec"]


def test_a_trainjob_is_not_restarted_off_a_node_that_is_not_cordoned(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    """Its pod templates are in its TrainingRuntime: only a cordon keeps the new pods off a node (a straggler's
    node, which is not cordoned, cannot be excluded)."""
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": "tj", "namespace": kube_namespace},
                "spec": {"runtimeRef": {"name": "torch"}}}  # fmt: skip
    kube_admin.apply(trainjob)
    free, cordoned = kube_admin.create_node(), kube_admin.create_node(unschedulable=True)

    outcome = run_action(
        "kubernetes.restart_job", kube_context(), namespace=kube_namespace, name="tj", kind="TrainJob",
        exclude_nodes=f"{cordoned},{free}",
    )  # fmt: skip

    assert isinstance(outcome, Failed) and f"{free} is not cordoned" in outcome.reason, outcome
    assert cordoned not in outcome.reason
    after = kube_admin.get("trainer.kubeflow.org/v1alpha1", "TrainJob", "tj", kube_namespace)
    assert not after["spec"].get("suspend")


@pytest.mark.parametrize(
    ("condition", "phase"),
    [("Failed", JobPhase.DIED), ("Succeeded", JobPhase.COMPLETED), (None, JobPhase.UNKNOWN)],
)
def test_a_finished_jobs_status_comes_from_its_conditions_when_its_pods_are_gone(
    condition: str | None,
    phase: JobPhase,
    kube_admin: KubeAdmin,
    kube_context: MakeContext,
    kube_namespace: str,
) -> None:
    """The training operator's cleanPodPolicy removed the pods; the PyTorchJob's conditions still say how it ended."""
    kube_admin.create_training_job(kube_namespace, "PyTorchJob", "gone")
    if condition:
        finish(kube_admin, kube_namespace, "PyTorchJob", "gone", condition)
    target = {"scheduler": "kubernetes", "namespace": kube_namespace, "job": "gone", "kind": "PyTorchJob"}

    status = kubernetes_job_status(kube_context().clients.kube, target)

    assert status.phase is phase, status
    if condition:
        assert status.state.startswith(f"PyTorchJob {condition}")


# -- node validation -----------------------------------------------------------------------------------------


def test_the_validation_pod_requests_the_nodes_gpus_in_its_runtime_class_restricted(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    """What the apiserver stored: the node's 4 GPUs requested (the device plugin hands those and no others), the
    runtime class (admitted: it exists), and the restricted profile's fields (Pod Security Standards, restricted:
    runAsNonRoot, allowPrivilegeEscalation false, capabilities drop ALL, seccomp RuntimeDefault)."""
    kube_admin.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                      "handler": "nvidia"})  # fmt: skip
    node = kube_admin.create_node(gpus=4)
    ctx = kube_context()
    repair = ctx.settings.repair
    repair.validation_namespace, repair.validation_runtime_class = kube_namespace, "nvidia"
    repair.validation_run_as_user = 1000

    started = run_action("kubernetes.validate_node", ctx, node=node, run="7")

    assert isinstance(started, Retry), started
    pod = kube_admin.get("v1", "Pod", f"nightshift-validate-{node}-7", kube_namespace)
    spec = pod["spec"]
    [container] = spec["containers"]
    assert container["resources"]["limits"] == {GPU: "4"} and spec["runtimeClassName"] == "nvidia"
    assert spec["nodeName"] == node and spec["restartPolicy"] == "Never"
    assert spec["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert not any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in container.get("env") or [])


def test_the_validation_pod_requests_a_set_number_of_gpus_and_a_node_without_any_fails(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    ctx = kube_context()
    ctx.settings.repair.validation_namespace, ctx.settings.repair.validation_gpus = kube_namespace, "1"
    node = kube_admin.create_node(gpus=8)

    assert isinstance(run_action("kubernetes.validate_node", ctx, node=node, run="1"), Retry)
    pod = kube_admin.get("v1", "Pod", f"nightshift-validate-{node}-1", kube_namespace)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
    assert "runtimeClassName" not in pod["spec"] and "runAsUser" not in pod["spec"]["securityContext"]

    ctx.settings.repair.validation_gpus = "all"
    bare = kube_admin.create_node(gpus=0)
    outcome = run_action("kubernetes.validate_node", ctx, node=bare, run="1")
    assert isinstance(outcome, Failed) and "advertises no allocatable nvidia.com/gpu" in outcome.reason
    assert outcome.data["verdict"] == "fail"
    assert kube_admin.pod_or_none(kube_namespace, f"nightshift-validate-{bare}-1") is None


def test_validation_waits_while_a_pod_holds_the_nodes_gpus(
    kube_admin: KubeAdmin, kube_context: MakeContext, kube_namespace: str
) -> None:
    """A cordon evicts nothing: the job's pod still holds the GPUs, so a validation pod would not be admitted.
    It waits, as the Slurm validation waits for the node's jobs; once that pod has finished, it runs."""
    ctx = kube_context()
    ctx.settings.repair.validation_namespace = kube_namespace
    node = kube_admin.create_node(gpus=8)
    training = kube_admin.create_pod(kube_namespace, node=node, gpus=8)
    kube_admin.create_pod(kube_namespace, node=node)  # a pod without GPUs does not hold the validation back

    waiting = run_action("kubernetes.validate_node", ctx, node=node, run="3")

    assert isinstance(waiting, Retry), waiting
    assert f"still runs 1 pod(s) using its GPUs ({kube_namespace}/{training})" in waiting.reason
    assert kube_admin.pod_or_none(kube_namespace, f"nightshift-validate-{node}-3") is None
    kube_admin.merge_patch("v1", "Pod", training, {"status": {"phase": "Succeeded"}}, namespace=kube_namespace,
                           status=True)  # fmt: skip
    started = run_action("kubernetes.validate_node", ctx, node=node, run="3")
    assert isinstance(started, Retry) and "started" in started.reason
    assert kube_admin.pod_or_none(kube_namespace, f"nightshift-validate-{node}-3") is not None


# -- errors --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "params"),
    [
        ("kubernetes.cordon_node", {"node": "no-such-node"}),
        ("kubernetes.taint_node", {"node": "no-such-node", "key": "k", "effect": "NoSchedule"}),
        ("kubernetes.evict_pod", {"pod": "no-such-pod"}),
        ("kubernetes.delete_pod", {"pod": "no-such-pod"}),
        ("kubernetes.pod_logs", {"pod": "no-such-pod"}),
        ("kubernetes.restart_job", {"name": "no-such-job", "kind": "Job"}),
        ("kubernetes.restart_job", {"name": "no-such-job", "kind": "PyTorchJob"}),
        ("kubernetes.restart_job", {"name": "no-such-job", "kind": "JobSet"}),
    ],
)
def test_missing_objects_fail_with_not_found(
    action: str, params: dict[str, str], kube_context: MakeContext, kube_namespace: str
) -> None:
    if action != "kubernetes.cordon_node" and action != "kubernetes.taint_node":
        params = {"namespace": kube_namespace, **params}

    outcome = run_action(action, kube_context(), **params)

    assert isinstance(outcome, Failed), outcome
    assert "HTTP 404" in outcome.reason and "not found" in outcome.reason


@pytest.mark.parametrize(
    ("action", "params"),
    [
        ("kubernetes.cordon_node", {"node": "gpu-1"}),
        ("kubernetes.evict_pod", {"namespace": "default", "pod": "p"}),
        ("kubernetes.restart_job", {"namespace": "default", "name": "j", "kind": "PyTorchJob"}),
    ],
)
def test_a_token_without_rights_is_a_credential_error(
    action: str, params: dict[str, str], kube_context: MakeContext
) -> None:
    outcome = run_action(action, kube_context("norbac"), **params)

    assert isinstance(outcome, CredentialError), outcome
    assert 'User "norbac" cannot' in outcome.reason and "HTTP 403" in outcome.reason


def test_check_reports_rejected_credentials(
    kube_cluster: KubeCluster, kube_context: MakeContext, tmp_path: Path
) -> None:
    unknown = kube_cluster.kubeconfig_copy(tmp_path / "kubeconfig", token="not-a-token")

    kube_context("admin").clients.kube.check()
    with pytest.raises(CredentialRejected, match='User "norbac" cannot list resource "nodes"'):
        kube_context("norbac").clients.kube.check()
    with pytest.raises(CredentialRejected, match="HTTP 401"):
        kube_context(kubeconfig=str(unknown)).clients.kube.check()


def test_unloadable_credentials_are_a_credential_error(kube_context: MakeContext, tmp_path: Path) -> None:
    ctx = kube_context(kubeconfig=str(tmp_path / "missing"))

    outcome = run_action("kubernetes.cordon_node", ctx, node="gpu-1")

    assert isinstance(outcome, CredentialError) and "cannot load credentials" in outcome.reason


# -- transport -----------------------------------------------------------------------------------------------


@pytest.fixture
def silent_apiserver(kube_cluster: KubeCluster, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig for an HTTPS server (the apiserver's certificate) that reads requests and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    certs = kube_cluster.ca_file.parent
    context.load_cert_chain(certs / "apiserver.crt", certs / "apiserver.key")
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            try:
                tls = context.wrap_socket(conn, server_side=True)
                tls.recv(65536)
                held.append(tls)
            except OSError:
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield kube_cluster.kubeconfig_copy(
        tmp_path / "kubeconfig", server=f"https://127.0.0.1:{server.getsockname()[1]}"
    )
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_no_answer_to_a_mutating_call_is_ambiguous(silent_apiserver: Path, kube_context: MakeContext) -> None:
    ctx = kube_context(kubeconfig=str(silent_apiserver), request_timeout_seconds=0.5)

    evict = run_action("kubernetes.evict_pod", ctx, namespace="default", pod="p")
    logs = run_action("kubernetes.pod_logs", ctx, namespace="default", pod="p")

    assert isinstance(evict, Ambiguous) and "may have applied it" in evict.reason
    # A read that got no answer changed nothing: safe to retry.
    assert isinstance(logs, Retry), logs


def test_an_unreachable_apiserver_is_a_retry(
    kube_cluster: KubeCluster, kube_context: MakeContext, tmp_path: Path
) -> None:
    nowhere = kube_cluster.kubeconfig_copy(tmp_path / "kubeconfig", server=f"https://127.0.0.1:{free_port()}")

    outcome = run_action(
        "kubernetes.delete_pod", kube_context(kubeconfig=str(nowhere)), namespace="default", pod="p"
    )

    assert isinstance(outcome, Retry) and "cannot reach the API server" in outcome.reason
