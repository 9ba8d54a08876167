"""Planned swaps and stragglers on Kubernetes (playbooks/planned-swap.yaml planned-swap-k8s, playbooks/fail-slow.yaml
straggler-k8s) through the engine, on a real kube-apiserver and a real Prometheus.

The training job is a PyTorchJob whose two ranks are real processes (sim/trainer.py with the progress library) in
the fake kubelet's containers (tests/fixtures/fake_kubelet.py), scraped by Prometheus. Nightshift asks them to
checkpoint through pods/exec, waits for the marker in Prometheus, restarts the job off the warning node (the test
plays the training operator's suspend), and hands the node to the repair lifecycle (cordon, a validation pod the
test's kubelet finishes, uncordon). A job that does not answer is left running and a person is told. A straggler's
node is excluded without a cordon, until its third exclusion in a day hands it to the repair.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from app.actions.kubernetes_exec import CHECKPOINT_REQUEST
from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.domain.states import RepairState
from app.store import repairs
from tests.fixtures.fake_kubelet import FakeKubelet
from tests.fixtures.kube import TRAINING_KINDS, KubeAdmin, KubeEngine, SuspendController, run_training_pod
from tests.fixtures.procs import free_port, wait_until
from tests.fixtures.prometheus import PrometheusServer
from tests.payloads import alert, payload

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PYTORCHJOB = TRAINING_KINDS["PyTorchJob"][0]
GRANTS = (
    "kubernetes.request_checkpoint",
    "kubernetes.restart_job",
    "kubernetes.cordon_node",
    "kubernetes.validate_node",
    "kubernetes.uncordon_node",
)
NOT_IN = "kubernetes.io/hostname"


@dataclass
class Job:
    name: str
    pods: dict[str, str]  # node -> pod
    ports: list[int]


@pytest.fixture
def nodes(kube_admin: KubeAdmin, fake_kubelet: FakeKubelet) -> list[str]:
    return [kube_admin.create_node(kubelet_port=fake_kubelet.port) for _ in range(2)]


@pytest.fixture
def trainers(
    kube_admin: KubeAdmin, fake_kubelet: FakeKubelet, kube_namespace: str, nodes: list[str], tmp_path: Path
) -> Callable[..., Job]:
    """Factory: a PyTorchJob announcing ``how`` it takes a checkpoint request, a rank on each node running
    ``argv`` (default: sim/trainer.py on a free metrics port)."""

    def start(name: str, how: str, argv: list[str] | None = None) -> Job:
        job = kube_admin.create_training_job(
            kube_namespace, "PyTorchJob", name, annotations={CHECKPOINT_REQUEST: how}
        )
        ports = [free_port() for _ in nodes]
        pods = {}
        for rank, (node, port) in enumerate(zip(nodes, ports, strict=True)):
            command = argv or [
                sys.executable, "-m", "sim.trainer", "--name", name, "--port", str(port), "--step-seconds", "0.1",
                "--checkpoint-every", "1000000", "--rank", str(rank), "--world-size", str(len(nodes)),
                "--checkpoint-dir", str(tmp_path / f"{name}-ckpt-{rank}"), "--state-dir", str(tmp_path / "state"),
            ]  # fmt: skip
            env = {"NIGHTSHIFT_CHECKPOINT_REQUEST_FILE": str(tmp_path / f"{name}-request-{rank}")}
            pods[node] = run_training_pod(kube_admin, fake_kubelet, job, node, command, env, tmp_path)
        return Job(name, pods, ports)

    return start


@pytest.fixture
def scraped(start_prometheus: Callable[..., PrometheusServer]) -> Callable[[Job], PrometheusServer]:
    """A Prometheus scraping the job's ranks, once it has seen them train."""

    def start(job: Job) -> PrometheusServer:
        server = start_prometheus([f"127.0.0.1:{port}" for port in job.ports])
        expr = f'count(training_step_total{{train_job="{job.name}"}} > 0) == {len(job.ports)}'
        wait_until(lambda: server.query(expr), 90, "Prometheus to see every rank train")
        return server

    return start


def early_warning(node: str, namespace: str, pod: str) -> dict[str, Any]:
    """GpuEccCorrectableRising as dcgm-exporter in Kubernetes mode labels it: the pod, never a job name."""
    return alert({"alertname": "GpuEccCorrectableRising", "Hostname": node, "gpu": "0", "namespace": namespace,
                  "pod": pod, "container": "pytorch", "early_warning": "ecc_correctable",
                  "severity": "warning"})  # fmt: skip


@pytest.fixture
def operator(kube_admin: KubeAdmin, kube_namespace: str) -> Iterator[Callable[[str], SuspendController]]:
    made: list[SuspendController] = []

    def play(name: str) -> SuspendController:
        made.append(SuspendController(kube_admin, "PyTorchJob", kube_namespace, name, deletes_pods=True))
        return made[-1]

    yield play
    for controller in made:
        controller.stop()


def settings_for(namespace: str) -> Callable[[Settings], None]:
    def edit(s: Settings) -> None:
        s.repair.validation_namespace = namespace
        s.repair.return_timeout_seconds = 120

    return edit


def the_incident(run: KubeEngine) -> tuple[dict[str, Any], dict[str, dict[str, Any]], str]:
    """The engine's one incident, its steps by name, and its ledger as text (for failure messages)."""
    (incident,) = run.engine.incidents()
    detail = run.engine.incident(incident["id"])
    steps = {s["name"]: s for s in detail["steps"] if s["phase"] == "steps"}
    return incident, steps, "\n".join(f"{row['kind']}: {row['message']}" for row in detail["ledger"])


def repair_of(run: KubeEngine, node: str) -> dict[str, Any] | None:
    with run.engine.deps.store.read() as conn:
        found = repairs.list_repairs(conn, node=node, limit=1)
    return found[0].as_dict() if found else None


def test_a_warning_node_is_swapped_out_at_a_checkpoint(
    kube_engine: Callable[..., KubeEngine],
    kube_admin: KubeAdmin,
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
    nodes: list[str],
    trainers: Callable[..., Job],
    scraped: Callable[[Job], PrometheusServer],
    operator: Callable[[str], SuspendController],
) -> None:
    ns, (warning, healthy) = kube_namespace, nodes
    job = trainers("swap-me", "USR1")
    prometheus = scraped(job)
    controller = operator(job.name)
    run = kube_engine(
        (ROOT / "playbooks" / "planned-swap.yaml").read_text(), GRANTS, settings_for(ns), prometheus.url
    )

    result = run.engine.ingest(
        parse_notification(json.dumps(payload(early_warning(warning, ns, job.pods[warning]))))
    )
    assert len(result.opened) == 1

    def done() -> bool:
        (incident,) = run.engine.incidents()
        repair = repair_of(run, warning)
        return bool(incident["outcome"]) and repair is not None and repair["state"] == RepairState.RETURNED

    run.run_until(done, 240, "the swap and the repair", each=lambda: fake_kubelet.finish_validation_pods(
        kube_admin, ns, {warning: 0}))  # fmt: skip

    incident, steps, ledger = the_incident(run)
    assert (incident["kind"], incident["outcome"], incident["target"]["job"]) == (
        "job",
        "recovered",
        job.name,
    ), ledger
    names = ("ask-for-a-checkpoint", "wait-for-the-checkpoint", "restart-off-the-node")
    assert [steps[n]["status"] for n in names] == ["ok", "ok", "ok"], ledger
    asked = datetime.fromisoformat(str(steps["ask-for-a-checkpoint"]["started_at"])).timestamp()
    marker = prometheus.query(f'min(training_last_checkpoint_timestamp_seconds{{train_job="{job.name}"}})')
    assert float(marker[0]["value"][1]) > asked  # every rank checkpointed after the request
    assert steps["restart-off-the-node"]["params"]["exclude_nodes"] == warning
    assert controller.observed == [False, True, False]  # suspended (its pods deleted), then resumed
    spec = kube_admin.get(PYTORCHJOB, "PyTorchJob", job.name, ns)["spec"]
    for replica in spec["pytorchReplicaSpecs"].values():
        [term] = replica["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
        assert {"key": NOT_IN, "operator": "NotIn", "values": [warning]} in term["matchExpressions"]
    repair = repair_of(run, warning)
    assert repair is not None
    assert [s["step"] for s in repair["steps"] if s["status"] == "ok"] == ["take_out", "validate", "return"]
    assert repair_of(run, healthy) is None and not kube_admin.node(healthy)["spec"].get("unschedulable")


def test_a_job_that_does_not_answer_is_left_running_and_a_person_told(
    kube_engine: Callable[..., KubeEngine],
    kube_admin: KubeAdmin,
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
    nodes: list[str],
    trainers: Callable[..., Job],
    start_prometheus: Callable[..., PrometheusServer],
    operator: Callable[[str], SuspendController],
) -> None:
    """Its containers take the request file but never checkpoint: the wait runs out (30 s here, 15 min shipped),
    nothing after it runs, the job is never suspended nor evicted, and the incident goes to a person."""
    ns, warning = kube_namespace, nodes[0]
    job = trainers("deaf", "file", [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    prometheus = start_prometheus([])
    controller = operator(job.name)
    shipped = (ROOT / "playbooks" / "planned-swap.yaml").read_text()
    assert shipped.count("timeout: 900") == 2
    run = kube_engine(
        shipped.replace("timeout: 900", "timeout: 30"), GRANTS, settings_for(ns), prometheus.url
    )

    run.engine.ingest(parse_notification(json.dumps(payload(early_warning(warning, ns, job.pods[warning])))))
    run.run_until(lambda: bool(run.engine.incidents()[0]["outcome"]), 120, "the incident to close")

    incident, steps, ledger = the_incident(run)
    assert incident["outcome"] == "needs_human", ledger
    assert steps["ask-for-a-checkpoint"]["status"] == "ok"
    assert steps["wait-for-the-checkpoint"]["status"] == "failed"
    assert "no checkpoint within 30s of the request" in steps["wait-for-the-checkpoint"]["reason"]
    assert "restart-off-the-node" not in steps or steps["restart-off-the-node"]["status"] != "ok"
    assert controller.observed == [False]  # never suspended: the job runs on
    # The node went to its repair with the job's attempt: cordoned (nothing new lands there), its validation
    # waiting for the job's pods, which hold its GPUs; a person decides.
    repair = repair_of(run, warning)
    assert repair is not None and repair["state"] == RepairState.VALIDATING
    assert (
        not kube_admin.resource("v1", "Pod")
        .get(namespace=ns, label_selector="app.kubernetes.io/component=node-validation")
        .to_dict()["items"]
    )
    assert all(kube_admin.pod_or_none(ns, pod) for pod in job.pods.values())


def straggler(node: str, namespace: str, pod: str, job: str) -> dict[str, Any]:
    """TrainingStraggler as rules/training.yml labels it on Kubernetes: the node's rank's pod, the job's name."""
    return alert({"alertname": "TrainingStraggler", "Hostname": node, "namespace": namespace, "pod": pod,
                  "train_job": job, "severity": "warning"})  # fmt: skip


def test_a_straggler_is_restarted_around_uncordoned_until_its_third_time_sends_it_to_repair(
    kube_engine: Callable[..., KubeEngine],
    kube_admin: KubeAdmin,
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
    nodes: list[str],
    operator: Callable[[str], SuspendController],
) -> None:
    """Three jobs in a day name the same straggler node. The first two are restarted with their pods kept off it
    (a required node affinity) and the node is not cordoned (a straggler is not a fault); the third exclusion
    hands it to the repair lifecycle (exclude_node: repair_after 3 in 24h). The jobs' pods are Pending here (their
    checkpoint request is skipped: `when: job_phase="running"`; test_a_warning_node_is_swapped_out_at_a_checkpoint
    runs it)."""
    ns, (slow, fast) = kube_namespace, nodes
    run = kube_engine((ROOT / "playbooks" / "fail-slow.yaml").read_text(), GRANTS, settings_for(ns))
    outcomes = []
    for n in range(3):
        name = f"job-{n}"
        job = kube_admin.create_training_job(ns, "PyTorchJob", name)
        labels = {"training.kubeflow.org/job-name": name}
        pods = {
            node: kube_admin.create_pod(ns, name, node=node, owner=job, running=False, gpus=1, labels=labels)
            for node in nodes
        }
        controller = operator(name)
        run.engine.ingest(parse_notification(json.dumps(payload(straggler(slow, ns, pods[slow], name)))))

        def closed() -> bool:
            return all(i["outcome"] for i in run.engine.incidents())

        run.run_until(closed, 120, f"{name}'s incident to close",
                      each=lambda: fake_kubelet.finish_validation_pods(kube_admin, ns, {slow: 0}))  # fmt: skip
        incident = next(i for i in run.engine.incidents() if i["target"]["job"] == name)
        detail = run.engine.incident(incident["id"])
        outcomes.append(incident["outcome"])
        [restart] = [s for s in detail["steps"] if s["action"] == "kubernetes.restart_job"]
        assert (restart["status"], restart["params"]["exclude_nodes"]) == ("ok", slow), detail["ledger"]
        assert controller.observed[:2] == [False, True]
        spec = kube_admin.get(PYTORCHJOB, "PyTorchJob", name, ns)["spec"]
        [term] = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
        assert term["matchExpressions"] == [{"key": NOT_IN, "operator": "NotIn", "values": [slow]}]
        kinds = [row["kind"] for row in detail["ledger"]]
        if n < 2:
            assert "culprit_excluded_only" in kinds, detail["ledger"]
            assert repair_of(run, slow) is None and not kube_admin.node(slow)["spec"].get("unschedulable")
        else:
            assert "culprit_excluded_only" not in kinds
            # The repair goes on after the job's incident closed: work it (and answer its validation pod) until it
            # returns the node. Polling without working passed only when it had finished before the incident closed
            # (under load it had not: the repair stood still and the wait timed out).
            run.run_until(lambda: (repair_of(run, slow) or {}).get("state") == RepairState.RETURNED, 120,
                          "the straggler's repair",
                          each=lambda: fake_kubelet.finish_validation_pods(kube_admin, ns, {slow: 0}))  # fmt: skip
    assert outcomes == ["recovered"] * 3
    repair = repair_of(run, slow)
    assert repair is not None
    assert [s["step"] for s in repair["steps"] if s["status"] == "ok"] == ["take_out", "validate", "return"]
    assert repair_of(run, fast) is None and not kube_admin.node(fast)["spec"].get("unschedulable")
