"""app/domain/job_phase.py: a Kubernetes training job's status from its object's conditions first, then its pods."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.job_phase import JobPhase, workload_status


def job(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}


def pod(phase: str, node: str = "gpu-1") -> dict[str, Any]:
    return {"spec": {"nodeName": node}, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("kind", "obj", "pods", "phase", "state"),
    [
        # Finished: the object's own condition, whatever is left of its pods.
        ("PyTorchJob", job(("Created", "True"), ("Running", "False"), ("Failed", "True")), [], JobPhase.DIED,
         "PyTorchJob Failed"),
        ("PyTorchJob", job(("Running", "False"), ("Succeeded", "True")), [pod("Running")], JobPhase.COMPLETED,
         "PyTorchJob Succeeded"),
        ("JobSet", job(("Completed", "True")), [], JobPhase.COMPLETED, "JobSet Completed"),
        ("JobSet", job(("Failed", "True")), [pod("Failed")], JobPhase.DIED, "JobSet Failed"),
        ("Job", job(("Complete", "True")), [], JobPhase.COMPLETED, "Job Complete"),
        ("Job", job(("Failed", "True")), [], JobPhase.DIED, "Job Failed"),
        ("TrainJob", job(("Complete", "True")), [], JobPhase.COMPLETED, "TrainJob Complete"),
        ("TrainJob", job(("Failed", "True")), [], JobPhase.DIED, "TrainJob Failed"),
        # Another kind's word is not this kind's: a Job has no Succeeded condition.
        ("Job", job(("Succeeded", "True")), [pod("Running")], JobPhase.RUNNING, "Running"),
        # A condition that was true and no longer is says nothing.
        ("PyTorchJob", job(("Failed", "False"), ("Running", "True")), [pod("Running")], JobPhase.RUNNING,
         "Running"),
        ("PyTorchJob", job(("Suspended", "True")), [], JobPhase.WAITING, "PyTorchJob Suspended"),
        # Not finished: the pods say.
        ("PyTorchJob", job(("Running", "True")), [pod("Pending"), pod("Succeeded")], JobPhase.WAITING,
         "Pending"),
        ("PyTorchJob", job(), [pod("Failed"), pod("Succeeded")], JobPhase.DIED, "Failed,Succeeded"),
        ("PyTorchJob", job(), [], JobPhase.UNKNOWN, "no pods"),
        # The object could not be read: the pods alone; none either: unknown, and why.
        ("PyTorchJob", None, [pod("Succeeded")], JobPhase.COMPLETED, "Succeeded"),
        ("PyTorchJob", None, [], JobPhase.UNKNOWN, "PyTorchJob not found"),
        ("", None, [], JobPhase.UNKNOWN, "no pods"),
    ],
)  # fmt: skip
def test_workload_status(
    kind: str, obj: Any, pods: list[dict[str, Any]], phase: JobPhase, state: str
) -> None:
    status = workload_status(kind, obj, pods)
    assert (status.phase, status.state) == (phase, state)


def test_the_nodes_are_the_pods_even_when_the_object_says_it_finished() -> None:
    status = workload_status(
        "PyTorchJob", job(("Failed", "True")), [pod("Failed", "gpu-2"), pod("Failed", "gpu-1")]
    )
    assert status.nodes == ("gpu-1", "gpu-2")


def test_a_failed_conditions_reason_is_kept() -> None:
    obj = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    assert workload_status("Job", obj, []).state == "Job Failed (BackoffLimitExceeded)"
