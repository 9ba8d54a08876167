"""app/workloads.py's pure resolution: an alert's pod (or its train_job label) to the training job a restart acts on,
read through a ``fetch`` callable over a dict of objects (the real apiserver: tests/integration/
test_kubernetes_job_from_pods.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.workloads import Resolution, Workload, resolve_pod_or_named, with_workload

NS = "ml"


def obj(kind: str, name: str, uid: str, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    api = {"Pod": "v1", "Job": "batch/v1", "PyTorchJob": "kubeflow.org/v1"}[kind]
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": uid}
    if owner is not None:
        meta["ownerReferences"] = [{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True,
        }]  # fmt: skip
    return {"apiVersion": api, "kind": kind, "metadata": meta}


def fetcher(*objects: dict[str, Any]) -> Any:
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    return lambda kind, name: by_key.get((kind, name))


LLAMA = obj("PyTorchJob", "llama", "u-llama")


def test_a_pod_that_no_longer_exists_falls_back_to_the_job_its_train_job_label_names() -> None:
    found = resolve_pod_or_named(NS, None, "llama-worker-0", "llama", fetcher(LLAMA))

    assert found.workload == Workload("PyTorchJob", NS, "llama")
    assert "pod ml/llama-worker-0 does not exist" in found.note and "PyTorchJob ml/llama" in found.note


def test_a_gone_pod_whose_train_job_names_nothing_is_refused_a_job() -> None:
    found = resolve_pod_or_named(NS, None, "llama-worker-0", "nonesuch", fetcher(LLAMA))

    assert found.workload is None and found.refused
    assert "no training job of that name in ml: node-level" in found.note


def test_a_gone_pod_without_train_job_names_no_job_and_is_not_refused() -> None:
    found = resolve_pod_or_named(NS, None, "llama-worker-0", "", fetcher(LLAMA))

    assert found == Resolution(None, found.note) and "does not exist" in found.note


def test_the_pods_own_job_wins_over_its_train_job_label() -> None:
    other = obj("PyTorchJob", "other", "u-other")
    pod = obj("Pod", "other-worker-0", "u-pod", owner=other)

    found = resolve_pod_or_named(NS, pod, "other-worker-0", "llama", fetcher(LLAMA, other))

    assert found.workload == Workload("PyTorchJob", NS, "other")


def test_a_refused_pod_never_falls_back_to_its_label() -> None:
    """A loop, a replaced owner...: hostile or contradictory input names no job at all."""
    replaced = obj("Pod", "p", "u-p", owner={**LLAMA, "metadata": {**LLAMA["metadata"], "uid": "u-old"}})

    found = resolve_pod_or_named(NS, replaced, "p", "llama", fetcher(LLAMA))

    assert found.workload is None and found.refused and "replaced" in found.note


def test_a_refused_resolution_leaves_a_node_level_target() -> None:
    target = {"scheduler": "kubernetes", "node": "gpu-1", "namespace": NS, "job": "llama"}

    assert with_workload(target, Resolution(None, "x", refused=True)) == {
        "scheduler": "kubernetes", "node": "gpu-1", "namespace": NS,
    }  # fmt: skip
    assert with_workload(target, Resolution(Workload("PyTorchJob", NS, "llama"), "x"))["kind"] == "PyTorchJob"
