"""examples/kubernetes/: the PyTorchJob and JobSet manifests apply to a real kube-apiserver (stand-in CRDs), their pod
templates are valid pods there (the apiserver checks the downward-API field paths, ports and resources), and the
environment the downward API gives a pod makes the progress library label its metrics with the job's name, the pod
and the node, the labels Nightshift's playbooks and PodMonitor expect."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from nightshift_progress.identity import identity_from_env

from app.actions.kubernetes_exec import CHECKPOINT_REQUEST, REQUEST_SIGNALS
from tests.fixtures.kube import KubeAdmin

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "nightshift" / "values.yaml"
# The label each controller puts on the pods it creates, naming the job (what NIGHTSHIFT_TRAIN_JOB reads).
JOB_NAME_LABEL = {"PyTorchJob": "training.kubeflow.org/job-name", "JobSet": "jobset.sigs.k8s.io/jobset-name"}


def pod_templates(manifest: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    spec = manifest["spec"]
    if manifest["kind"] == "PyTorchJob":
        for replica in spec["pytorchReplicaSpecs"].values():
            yield replica["template"]
    else:
        for job in spec["replicatedJobs"]:
            yield job["template"]["spec"]["template"]


def downward_env(container: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet resolves it for ``pod`` (values and fieldRefs)."""
    env = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        path = var["valueFrom"]["fieldRef"]["fieldPath"]
        if label := re.fullmatch(r"metadata\.labels\['(.+)'\]", path):
            env[var["name"]] = pod["metadata"]["labels"][label.group(1)]
        else:
            section, key = path.split(".")
            env[var["name"]] = pod[section][key]
    return env


@pytest.mark.parametrize("example", ["pytorchjob.yaml", "jobset.yaml"])
def test_the_example_applies_and_its_pods_carry_the_labels_nightshift_expects(
    example: str, kube_admin: KubeAdmin, kube_namespace: str
) -> None:
    manifest = yaml.safe_load((EXAMPLES / example).read_text())
    manifest["metadata"]["namespace"] = kube_namespace
    stored = kube_admin.apply(manifest)
    job = stored["metadata"]["name"]
    monitor = yaml.safe_load(CHART_VALUES.read_text())["monitoring"]["podMonitor"]
    for template in pod_templates(manifest):
        labels = {**template["metadata"]["labels"], JOB_NAME_LABEL[manifest["kind"]]: job}
        assert (
            monitor["selector"]["matchLabels"].items() <= labels.items()
        )  # the chart's PodMonitor selects it
        name = f"{job}-{uuid.uuid4().hex[:6]}"
        pod = kube_admin.apply({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": kube_namespace, "labels": labels},
            "spec": {**template["spec"], "nodeName": "gpu-node-1"},
        })  # fmt: skip
        (container,) = pod["spec"]["containers"]
        assert monitor["port"] in {p["name"] for p in container["ports"]}
        env = downward_env(container, pod)
        identity = identity_from_env(env)
        assert identity.labels() == {
            "train_job": job,
            "slurm_job_id": "",
            "namespace": kube_namespace,
            "pod": name,
            "Hostname": "gpu-node-1",
        }
        assert not identity.warnings
        port = int(env["NIGHTSHIFT_PROGRESS_PORT"])
        assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
        # The checkpoint request it announces is one it takes (kubernetes.request_checkpoint), and py-spy may
        # attach to its ranks (kubernetes.job_stacks).
        how = stored["metadata"]["annotations"][CHECKPOINT_REQUEST]
        assert how in ("file", *REQUEST_SIGNALS)
        if how == "file":
            assert env["NIGHTSHIFT_CHECKPOINT_REQUEST_FILE"].startswith("/")
        assert "SYS_PTRACE" in container["securityContext"]["capabilities"]["add"]
