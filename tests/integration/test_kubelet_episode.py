"""A GPU fault on real Kubernetes nodes: kubelets, containerd and runc run a two-pod PyTorchJob of the real PyTorch
trainer (sim.torch_trainer, DDP over gloo) from an image built with buildah (tests/fixtures/kube_nodes.py); the
test plays the training operator only (tests/fixtures/training_operator.py).

The worker's container is killed on its node, as a GPU that falls off the bus ends the process using it; the master
dies of it too (its all-reduce loses its peer). dcgm-exporter's Xid alert for that node (its own labels: no
train_job) reaches Nightshift, in active mode with the shipped Kubernetes playbook, which finds the job from the
pod, restarts it with the node excluded, and takes the node out, validates it with a pod that node's kubelet really
runs, and returns it. The new pods run on the other two nodes and resume from the checkpoint the first ones wrote
(a host directory standing in for the job's shared volume). What the test measures (fault → pods running again,
fault → training steps again) goes to the report as user properties; nothing asserts a duration.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.domain.states import RepairState
from app.engine import Engine
from app.store import repairs
from tests.fixtures.kube import TRAINING_KINDS, KubeAdmin, engines_on, restarts_of_recovered_job
from tests.fixtures.kube_nodes import GPU_RESOURCE, NodeStack
from tests.fixtures.procs import wait_until
from tests.fixtures.training_operator import REPLICA_TYPE_LABEL, PlayedPyTorchOperator
from tests.payloads import alert, payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
GRANTS = (
    "kubernetes.restart_job",
    "kubernetes.cordon_node",
    "kubernetes.validate_node",
    "kubernetes.uncordon_node",
)

JOB = "llama"
METRICS_PORT = 9464
UID = 10001  # the training image's user
CHECKPOINT_EVERY = 5  # steps
VALIDATION_OUTPUT = "gpu-ok"
RUNNING_SECONDS = 300  # pods of the torch image starting on a loaded machine
EPISODE_SECONDS = 600


def pytorchjob(namespace: str, image: str, nodes: Mapping[str, str], shared: Path) -> dict[str, Any]:
    """The job as examples/kubernetes/pytorchjob.yaml writes it (metrics port, downward API, one GPU a pod), with
    what this machine needs: host networking (gloo on the node's interface), a host directory for the shared
    checkpoint volume, the image present on every node."""
    node_hosts = ",".join(f"{node}={address}" for node, address in nodes.items())
    env = [
        {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"},
        {"name": "NIGHTSHIFT_TRAIN_JOB",
         "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['training.kubeflow.org/job-name']"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]  # fmt: skip
    container = {
        "name": "pytorch", "image": image, "imagePullPolicy": "Never",
        "args": ["--name", JOB, "--port", str(METRICS_PORT), "--node-hosts", node_hosts,
                 "--checkpoint-dir", f"/shared/checkpoints/{JOB}", "--state-dir", "/shared/state",
                 "--step-seconds", "0.5", "--checkpoint-every", str(CHECKPOINT_EVERY), "--log-every", "5",
                 "--collective-timeout", "60"],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": {"limits": {GPU_RESOURCE: "1"}},
        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
    }  # fmt: skip
    template = {
        "metadata": {"labels": {"nightshift.io/training-metrics": "true"}},
        "spec": {
            "hostNetwork": True,
            "securityContext": {"runAsUser": UID, "runAsGroup": UID, "runAsNonRoot": True},
            "containers": [container],
            "volumes": [{"name": "shared", "hostPath": {"path": str(shared), "type": "Directory"}}],
        },
    }
    replica = {"replicas": 1, "restartPolicy": "Never", "template": template}
    return {
        "apiVersion": TRAINING_KINDS["PyTorchJob"][0], "kind": "PyTorchJob",
        "metadata": {"name": JOB, "namespace": namespace},
        "spec": {"runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "None"},
                 "pytorchReplicaSpecs": {"Master": replica, "Worker": replica}},
    }  # fmt: skip


def running(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return (
        pod["status"].get("phase") == "Running"
        and bool(statuses)
        and all("running" in s["state"] for s in statuses)
    )


def terminated(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The training container's terminated state, once the kubelet has reported it."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if "terminated" in status["state"]:
            return dict(status["state"]["terminated"])
    return None


def all_running(operator: PlayedPyTorchOperator) -> dict[str, dict[str, Any]]:
    """The job's pods by replica type once both run (empty before)."""
    pods = operator.pods()
    if len(pods) != 2 or not all(map(running, pods)):
        return {}
    return {pod["metadata"]["labels"][REPLICA_TYPE_LABEL]: pod for pod in pods}


def all_ended(operator: PlayedPyTorchOperator) -> dict[str, tuple[str, dict[str, Any]]]:
    """(phase, terminated state) of the job's pods by node once every one has ended (empty before)."""
    ended = {pod["spec"]["nodeName"]: (pod["status"]["phase"], terminated(pod)) for pod in operator.pods()}
    if not ended or not all(state for _, state in ended.values()):
        return {}
    return {node: (phase, state) for node, (phase, state) in ended.items() if state is not None}


def steps(address: str) -> float:
    """training_step_total from the rank's own /metrics endpoint (the progress library), at its node's address."""
    with urllib.request.urlopen(f"http://{address}:{METRICS_PORT}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(r"^training_step_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert match, text[:2000]
    return float(match.group(1))


def xid_alert(node: str, namespace: str, pod: str) -> dict[str, Any]:
    """GpuXidError as the rules of rules/gpu_xid.yml raise it from dcgm-exporter's series in Kubernetes mode."""
    return alert({
        "alertname": "GpuXidError", "Hostname": node, "gpu": "0", "UUID": "GPU-8f4a1c2e-55d1-4c1b-9f3e-2a7b0c9d4e61",
        "modelName": "NVIDIA H100 80GB HBM3", "namespace": namespace, "pod": pod, "container": "pytorch",
        "xid": "79", "xid_class": "reboot",
    })  # fmt: skip


@pytest.fixture
def shared_volume(tmp_path: Path) -> Path:
    """The job's shared volume (checkpoints, trainer status), writable by the image's user."""
    shared = tmp_path / "shared"
    for folder in (shared, shared / "checkpoints", shared / "state"):
        folder.mkdir()
        folder.chmod(0o777)
    return shared


@pytest.fixture
def engine(kube_node_stack: NodeStack, tmp_path: Path) -> Iterator[Callable[[str], Engine]]:
    """Factory: an engine acting on the real nodes' cluster with the shipped gpu-xid playbooks, validating nodes
    in ``namespace`` with the training image (its Python prints the verdict: no DCGM here)."""
    shipped = (ROOT / "playbooks" / "gpu-xid.yaml").read_text()
    with engines_on(kube_node_stack.cluster, tmp_path) as engines:

        def make(namespace: str) -> Engine:
            def settings(s: Settings) -> None:
                s.repair.validation_namespace = namespace
                s.repair.validation_image = kube_node_stack.images.trainer
                s.repair.validation_command = f"python -c print('{VALIDATION_OUTPUT}')"
                s.repair.return_timeout_seconds = 120

            engine: Engine = engines(shipped, GRANTS, settings).engine
            return engine

        yield make


def test_a_gpu_fault_kills_the_pods_and_nightshift_restarts_the_job_off_the_node_where_it_runs_again(
    kube_node_stack: NodeStack,
    engine: Callable[[str], Engine],
    shared_volume: Path,
    record_property: Callable[[str, object], None],
) -> None:
    stack = kube_node_stack
    admin = KubeAdmin(stack.cluster)
    namespace = admin.create_namespace("train")
    nightshift = engine(namespace)
    addresses = {name: node.address for name, node in stack.nodes.items()}
    admin.apply(pytorchjob(namespace, stack.images.trainer, addresses, shared_volume))
    operator = PlayedPyTorchOperator(admin, namespace, JOB)
    try:
        # The first pods really run, on two nodes (one GPU each), and train past a checkpoint.
        first = wait_until(lambda: all_running(operator), RUNNING_SECONDS, "the job's two pods Running", 0.5)
        assert isinstance(first, dict)
        healthy, faulty = first["master"]["spec"]["nodeName"], first["worker"]["spec"]["nodeName"]
        assert healthy != faulty
        wait_until(lambda: steps(addresses[healthy]) > CHECKPOINT_EVERY, RUNNING_SECONDS, "a checkpoint", 0.5)

        # The fault: the worker's process ends on its node; both ranks really die.
        fault = time.monotonic()
        stack.nodes[faulty].kill_container(first["worker"]["status"]["containerStatuses"][0]["containerID"])
        ends = wait_until(lambda: all_ended(operator), RUNNING_SECONDS, "both ranks to die", 0.2)
        died = time.monotonic()
        assert isinstance(ends, dict)
        assert ends[faulty][0] == "Failed" and ends[faulty][1]["exitCode"] == 137, ends  # SIGKILL
        assert ends[healthy][0] == "Failed" and ends[healthy][1]["exitCode"] != 0, ends  # lost its peer

        # dcgm-exporter's alert for the node reaches Nightshift, which recovers the job off that node.
        notification = payload(xid_alert(faulty, namespace, first["worker"]["metadata"]["name"]))
        assert len(nightshift.ingest(parse_notification(json.dumps(notification))).opened) == 1
        again: float | None = None
        deadline = time.monotonic() + EPISODE_SECONDS
        while time.monotonic() < deadline:
            nightshift.work_once("it")
            (incident,) = nightshift.incidents()
            if again is None and len(operator.incarnations) == 2 and all_running(operator):
                again = time.monotonic()
            with nightshift.deps.store.read() as conn:
                repair = repairs.list_repairs(conn, node=faulty, limit=1)
            if again and incident["outcome"] and repair and repair[0].state == RepairState.RETURNED:
                break
            time.sleep(0.5)
        second = wait_until(lambda: all_running(operator), RUNNING_SECONDS, "the restarted pods Running", 0.5)
        assert isinstance(second, dict)
        master = second["master"]["metadata"]["name"]
        # The new master's log, through the apiserver from its node's kubelet (containerd's log of the container).
        core = k8s.CoreV1Api(admin.api)
        resumed = wait_until(
            lambda: re.search(r"resuming from step (\d+)", core.read_namespaced_pod_log(master, namespace)),
            RUNNING_SECONDS, "the new master to resume from the checkpoint", 0.5,
        )  # fmt: skip
        assert isinstance(resumed, re.Match)
        resumed_from = int(resumed.group(1))
        master_address = addresses[second["master"]["spec"]["nodeName"]]
        wait_until(lambda: steps(master_address) > resumed_from, RUNNING_SECONDS, "training steps again", 0.5)
        trained = time.monotonic()
    finally:
        operator.stop()

    restarts = restarts_of_recovered_job(nightshift, incident, faulty)
    assert [(s["status"], s["params"]["kind"], s["params"]["exclude_nodes"]) for s in restarts] == [
        ("ok", "PyTorchJob", faulty)
    ]
    assert len(operator.incarnations) == 2  # suspended once (its pods ended by the kubelets), then resumed
    assert again is not None, "the restarted pods never all ran"
    assert {pod["spec"]["nodeName"] for pod in second.values()} == set(stack.nodes) - {faulty}
    assert resumed_from >= CHECKPOINT_EVERY  # the first incarnation's checkpoint, from the shared volume
    (repair,) = repair
    assert [s["step"] for s in repair.steps if s["status"] == "ok"] == ["take_out", "validate", "return"]
    validate = next(s for s in repair.steps if s["step"] == "validate" and s["status"] == "ok")
    assert VALIDATION_OUTPUT in json.dumps(validate), validate  # the log the faulty node's kubelet served
    assert not admin.node(faulty)["spec"].get("unschedulable")  # returned after validation
    assert not admin.node(healthy)["spec"].get("unschedulable")  # never touched
    record_property("fault_to_pods_dead_s", round(died - fault, 1))
    record_property("fault_to_pods_running_again_s", round(again - fault, 1))
    record_property("fault_to_training_steps_again_s", round(trained - fault, 1))
    record_property("resumed_from_step", resumed_from)
    admin.close()
