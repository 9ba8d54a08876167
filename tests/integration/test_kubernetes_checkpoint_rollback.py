"""kubernetes.checkpoint_rollback on a real kube-apiserver: short-lived Jobs beside the training job, mounting its
checkpoint volume, list the directory and roll it back (app/actions/kubernetes_rollback.py).

No Job controller or kubelet runs here: :class:`tests.fixtures.kube.JobRunner` plays them, running each Job's
command for real on this machine (the training job's volume is a hostPath mounted at its own path, so the Job sees
these very files). The decisions are the Slurm action's (app/domain/checkpoint_layouts.py; every layout is in
tests/unit/test_checkpoint_layouts.py); what is tested here is the way there: the volume found from the job's
template, the Jobs' manifests as the apiserver stores them, the report read back through pods/log, the roots, the
clean-up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.actions.base import ActionContext
from app.actions.kubernetes_rollback import COMPONENT, CheckpointRollback
from app.domain.checkpoint_layouts import QUARANTINE_DIR
from app.domain.outcome import Failed, Ok
from tests.fixtures.fake_kubelet import FakeKubelet
from tests.fixtures.kube import TRAINING_KINDS, JobRunner, KubeAdmin

pytestmark = pytest.mark.integration

PYTORCHJOB = TRAINING_KINDS["PyTorchJob"][0]
ROLLBACK = CheckpointRollback(poll_seconds=0.1)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The checkpoint volume's root (a hostPath, mounted at its own path)."""
    path = tmp_path / "checkpoints"
    path.mkdir()
    return path


@pytest.fixture
def runner(
    kube_admin: KubeAdmin, fake_kubelet: FakeKubelet, kube_namespace: str, tmp_path: Path
) -> Iterator[JobRunner]:
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    played = JobRunner(
        kube_admin, fake_kubelet, kube_namespace, node, f"app.kubernetes.io/component={COMPONENT}", tmp_path
    )
    yield played
    played.stop()


def training_job(admin: KubeAdmin, namespace: str, root: Path, run_as: dict[str, int] | None = None) -> None:
    """A PyTorchJob whose ranks mount the checkpoint volume at ``root`` and run as ``run_as``."""
    template = {"spec": {
        "securityContext": run_as or {},
        "imagePullSecrets": [{"name": "registry"}],
        "containers": [{"name": "pytorch", "image": "registry.example.com/llama-train:1.0",
                        "volumeMounts": [{"name": "ckpt", "mountPath": str(root)}]}],
        "volumes": [{"name": "ckpt", "hostPath": {"path": str(root), "type": "Directory"}}],
    }}  # fmt: skip
    admin.apply({"apiVersion": PYTORCHJOB, "kind": "PyTorchJob", "metadata": {"name": "llama", "namespace": namespace},
                 "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": template}}}})  # fmt: skip


def deepspeed(directory: Path, tags: tuple[str, ...], latest: str) -> None:
    for tag in tags:
        (directory / tag).mkdir(parents=True)
        (directory / tag / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    (directory / "latest").write_text(latest)


def rollback(ctx: ActionContext, namespace: str, directory: Path | str, kind: str = "PyTorchJob") -> Any:
    params = ROLLBACK.validate({"namespace": namespace, "name": "llama", "kind": kind, "dir": str(directory)})
    return ROLLBACK.run(params, ctx)


@pytest.fixture
def ctx(kube_context: Callable[..., ActionContext], root: Path) -> ActionContext:
    context = kube_context()
    context.settings.checkpoint.allowed_roots = [str(root)]
    return context


def test_a_deepspeed_directory_is_rolled_back_by_jobs_mounting_the_jobs_volume(
    ctx: ActionContext, kube_admin: KubeAdmin, kube_namespace: str, root: Path, runner: JobRunner
) -> None:
    ns = kube_namespace
    training_job(kube_admin, ns, root, run_as={"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000})
    directory = root / "llama"
    deepspeed(directory, ("global_step10", "global_step20"), "global_step20")

    outcome = rollback(ctx, ns, directory)

    assert isinstance(outcome, Ok), outcome
    assert (directory / "latest").read_text() == "global_step10"
    assert not (directory / "global_step20").exists()
    [moved] = (directory / QUARANTINE_DIR).iterdir()
    assert moved.name.startswith("global_step20.") and (moved / "mp_rank_00_model_states.pt").exists()
    assert (
        outcome.data["previous"] == str(directory / "global_step10") and outcome.data["tracker"] == "latest"
    )
    # Two Jobs, each as the apiserver stored it, both deleted once read.
    assert [j["metadata"]["name"].split("-")[2] for j in runner.ran] == ["read", "apply"]
    for job in runner.ran:
        pod = job["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
        assert container["image"] == "registry.example.com/llama-train:1.0"
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        assert pod["volumes"] == [
            {"name": "checkpoints", "hostPath": {"path": str(root), "type": "Directory"}}
        ]
        assert container["volumeMounts"] == [{"name": "checkpoints", "mountPath": str(root)}]
        restricted = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["securityContext"] == {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            **restricted,
        }
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        assert pod["automountServiceAccountToken"] is False
    selector = f"app.kubernetes.io/component={COMPONENT}"
    assert (
        kube_admin.resource("batch/v1", "Job").get(namespace=ns, label_selector=selector).to_dict()["items"]
        == []
    )


def test_what_cannot_be_rolled_back_is_refused_with_the_reason_and_nothing_moves(
    ctx: ActionContext,
    kube_admin: KubeAdmin,
    kube_namespace: str,
    root: Path,
    runner: JobRunner,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    training_job(kube_admin, ns, root)
    only = root / "only"
    deepspeed(only, ("global_step10",), "global_step10")
    outside = tmp_path / "elsewhere"
    deepspeed(outside, ("global_step1", "global_step2"), "global_step2")
    (root / "escape").symlink_to(outside)

    single = rollback(ctx, ns, only)
    escaped = rollback(ctx, ns, root / "escape")
    missing = rollback(ctx, ns, root / "nonesuch")

    assert (
        isinstance(single, Failed)
        and "is the only checkpoint; rolling back would restart from scratch" in single.reason
    )
    assert (
        isinstance(escaped, Failed)
        and f"resolves to {outside}, not strictly below an allowed root" in escaped.reason
    )
    assert isinstance(missing, Failed) and f"cannot resolve {root / 'nonesuch'}" in missing.reason
    assert (only / "latest").read_text() == "global_step10" and (
        outside / "latest"
    ).read_text() == "global_step2"
    assert not (only / QUARANTINE_DIR).exists() and not (outside / QUARANTINE_DIR).exists()
    assert [j["metadata"]["name"].split("-")[2] for j in runner.ran] == ["read"] * 3  # no apply Job ran


def test_a_directory_no_volume_holds_and_a_trainjob_are_refused_before_any_job(
    ctx: ActionContext, kube_admin: KubeAdmin, kube_namespace: str, root: Path, runner: JobRunner
) -> None:
    training_job(kube_admin, kube_namespace, root)
    kube_admin.apply({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                      "metadata": {"name": "llama", "namespace": kube_namespace}, "spec": {}})  # fmt: skip

    unmounted = rollback(ctx, kube_namespace, "/elsewhere/llama")
    trainjob = rollback(ctx, kube_namespace, root / "llama", kind="TrainJob")

    assert isinstance(unmounted, Failed) and "mounts a volume holding /elsewhere/llama" in unmounted.reason
    assert isinstance(trainjob, Failed) and "(in its TrainingRuntime)" in trainjob.reason
    assert runner.ran == []
