"""TrainingMetricsAbsent on Kubernetes (playbooks/training-health.yaml, job-gone-k8s) on a real kube-apiserver: the
job's own object says how it ended, after the training operator cleaned its pods up (no pod exists here). A job that
failed is recreated from its spec (its operator acts on no suspend once it has finished); one that succeeded closes
`completed` and is left alone. The test plays the operator's status writes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from app.domain.alertmanager import parse_notification
from tests.fixtures.kube import TRAINING_KINDS, KubeAdmin, KubeEngine
from tests.payloads import alert, payload

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PYTORCHJOB = TRAINING_KINDS["PyTorchJob"][0]


def finished(admin: KubeAdmin, namespace: str, name: str, condition: str) -> dict:
    job = admin.create_training_job(namespace, "PyTorchJob", name)
    status = {"conditions": [{"type": condition, "status": "True", "reason": f"PyTorchJob{condition}",
                              "lastTransitionTime": "2025-01-01T00:00:00Z"}]}  # fmt: skip
    admin.merge_patch(PYTORCHJOB, "PyTorchJob", name, {"status": status}, namespace=namespace, status=True)
    return job


def absent(namespace: str, job: str) -> dict:
    """TrainingMetricsAbsent as rules/training.yml groups it: train_job and namespace, no pod, no node."""
    return alert({"alertname": "TrainingMetricsAbsent", "train_job": job, "namespace": namespace,
                  "severity": "warning"})  # fmt: skip


def test_a_failed_job_is_recreated_and_one_that_succeeded_is_left_completed(
    kube_engine: Callable[..., KubeEngine], kube_admin: KubeAdmin, kube_namespace: str
) -> None:
    ns = kube_namespace
    dead, done = finished(kube_admin, ns, "dead", "Failed"), finished(kube_admin, ns, "done", "Succeeded")
    playbooks = (ROOT / "playbooks" / "training-health.yaml").read_text()
    run = kube_engine(playbooks, ("kubernetes.restart_job",))

    result = run.engine.ingest(
        parse_notification(json.dumps(payload(absent(ns, "dead"), absent(ns, "done"))))
    )
    assert len(result.opened) == 2
    by_job = lambda: {i["job"]: i for i in run.engine.incidents()}  # noqa: E731
    run.run_until(lambda: all(i["outcome"] for i in by_job().values()), 90, "both incidents to close")

    incidents = by_job()
    ledgers = {job: run.engine.incident(i["id"]) for job, i in incidents.items()}
    assert incidents["dead"]["target"]["kind"] == "PyTorchJob"
    assert incidents["dead"]["outcome"] == "recovered", ledgers["dead"]["ledger"]
    [restart] = [s for s in ledgers["dead"]["steps"] if s["action"] == "kubernetes.restart_job"]
    assert restart["status"] == "ok"
    recreated = kube_admin.get(PYTORCHJOB, "PyTorchJob", "dead", ns)
    assert recreated["metadata"]["uid"] != dead["metadata"]["uid"]
    assert not (recreated.get("status") or {}).get("conditions")

    assert incidents["done"]["outcome"] == "completed", ledgers["done"]["ledger"]
    assert [s for s in ledgers["done"]["steps"] if s["status"] == "ok"] == []
    assert kube_admin.get(PYTORCHJOB, "PyTorchJob", "done", ns)["metadata"]["uid"] == done["metadata"]["uid"]
