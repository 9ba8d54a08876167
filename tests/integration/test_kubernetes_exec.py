"""``pods/exec`` through a real kube-apiserver to the kubelet (app/clients/kube.py ``KubeClient.exec``): the
apiserver proxies the WebSocket upgrade to the fake kubelet, whose containers are real processes in their own PID
namespace (tests/fixtures/fake_kubelet.py), so the command really runs beside the container's main process."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from app.actions.base import ActionContext
from app.actions.kubernetes_exec import CHECKPOINT_REQUEST
from app.domain.diagnosis import diagnose
from app.domain.errors import NotFound
from app.domain.outcome import Failed, Ok
from tests.fixtures.fake_kubelet import FakeKubelet
from tests.fixtures.kube import KubeAdmin, run_action, run_training_pod
from tests.fixtures.procs import free_port, wait_until

pytestmark = pytest.mark.integration

PY_SPY = Path(sys.executable).parent / "py-spy"  # a dev dependency, installed into the venv
CHECKPOINT_MARKER = "training_last_checkpoint_timestamp_seconds"
SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]


def test_a_command_runs_in_the_containers_namespaces_with_its_environment(
    kube_admin: KubeAdmin,
    kube_context: Callable[..., ActionContext],
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
    tmp_path: Path,
) -> None:
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    pod = kube_admin.create_pod(kube_namespace, node=node)
    fake_kubelet.run_container(
        kube_namespace,
        pod,
        "main",
        SLEEPER,
        {"PATH": "/usr/bin:/bin", "WHO": "trainer"},
        tmp_path,
        tmp_path / "log",
    )
    kube = kube_context().clients.kube

    result = kube.exec(
        kube_namespace,
        pod,
        "main",
        ["sh", "-c", 'echo "$WHO $(tr "\\0" " " < /proc/1/cmdline)"; echo oops >&2; exit 3'],
        30,
    )

    assert result.exit_code == 3 and result.error == ""
    assert result.stdout.startswith(f"trainer {sys.executable} -c import time") and result.stderr == "oops\n"
    ok = kube.exec(kube_namespace, pod, "main", ["true"], 30)
    assert (ok.exit_code, ok.stdout, ok.error) == (0, "", "")


def test_a_container_that_does_not_run_and_a_pod_that_does_not_exist(
    kube_admin: KubeAdmin,
    kube_context: Callable[..., ActionContext],
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
) -> None:
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    pod = kube_admin.create_pod(kube_namespace, node=node)
    kube = kube_context().clients.kube

    result = kube.exec(kube_namespace, pod, "main", ["true"], 30)

    assert result.exit_code is None and "is not running" in result.error
    with pytest.raises(NotFound, match="HTTP 404"):
        kube.exec(kube_namespace, "nonesuch", "main", ["true"], 30)


WORLD = 4
STUCK_RANK = 3


def test_the_stacks_of_a_hung_pytorchjob_name_its_hung_rank_and_node(
    kube_admin: KubeAdmin,
    kube_context: Callable[..., ActionContext],
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
    tmp_path: Path,
) -> None:
    """Four ranks in four pods on two nodes meet in a collective every step; rank 3 hangs in load_batch at step
    3 (sim/collective.py). kubernetes.job_stacks runs py-spy in every pod through pods/exec, and the diagnosis of
    its log names rank 3 and its node, as for the Slurm job (tests/integration/test_hang_stacks.py)."""
    ns = kube_namespace
    nodes = [kube_admin.create_node(kubelet_port=fake_kubelet.port) for _ in range(2)]
    job = kube_admin.create_training_job(ns, "PyTorchJob", "hang")
    shared = tmp_path / "shared"
    argv = [sys.executable, "-m", "sim.collective", "--dir", str(shared), "--stuck-rank", str(STUCK_RANK),
            "--stuck-after", "3", "--step-seconds", "0.05"]  # fmt: skip
    ranks = [{"RANK": str(rank), "WORLD_SIZE": str(WORLD)} for rank in range(WORLD)]
    pods = [
        run_training_pod(kube_admin, fake_kubelet, job, nodes[rank // 2], argv, env, tmp_path)
        for rank, env in enumerate(ranks)
    ]

    def stuck() -> bool:
        steps = [shared / f"rank{rank}.step" for rank in range(WORLD)]
        return all(p.exists() for p in steps) and [int(p.read_text() or -1) for p in steps] == [3, 3, 3, 2]

    wait_until(stuck, 30, "the ranks to hang")
    ctx = kube_context()
    outcome = run_action("kubernetes.job_stacks", ctx, namespace=ns, job="hang", py_spy=str(PY_SPY))

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["processes"] == WORLD and outcome.data["pods"] == sorted(pods), outcome.output
    assert outcome.data["problems"] == []
    assert sorted(e[1] for e in fake_kubelet.execs if e[0] == ns) == sorted(pods)  # one exec a pod
    labels = {"alertname": "TrainingHang", "Hostname": nodes[0], "namespace": ns, "pod": pods[0]}
    result = diagnose(labels, outcome.data["log"])
    assert result.category == "hang", result.summary
    assert result.culprit is not None and (result.culprit.node, result.culprit.rank) == (nodes[1], STUCK_RANK)
    assert f"rank {STUCK_RANK} on {nodes[1]} is stuck in load_batch (sim/collective.py)" in result.summary


@pytest.fixture
def idle_job(
    kube_admin: KubeAdmin, fake_kubelet: FakeKubelet, kube_namespace: str, tmp_path: Path
) -> Callable[..., None]:
    """Factory: a PyTorchJob ``name`` (with ``annotations``) whose one running pod's container sleeps."""

    def make(name: str, annotations: dict[str, str] | None = None) -> None:
        node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
        job = kube_admin.create_training_job(kube_namespace, "PyTorchJob", name, annotations=annotations)
        run_training_pod(kube_admin, fake_kubelet, job, node, SLEEPER, {}, tmp_path)

    return make


def test_stacks_without_py_spy_in_the_image_say_so(
    idle_job: Callable[..., None], kube_context: Callable[..., ActionContext], kube_namespace: str
) -> None:
    idle_job("plain")

    ctx, no_spy = kube_context(), "/nonexistent/py-spy"
    outcome = run_action("kubernetes.job_stacks", ctx, namespace=kube_namespace, job="plain", py_spy=no_spy)

    assert isinstance(outcome, Failed), outcome
    assert f"job {kube_namespace}/plain: no Python stack could be dumped in 1 pod(s)" in outcome.reason
    assert "/nonexistent/py-spy" in outcome.reason


def trainer(job: str, port: int, tmp_path: Path) -> list[str]:
    """sim/trainer.py: the progress library's metrics on ``port``; it answers a checkpoint request."""
    return [sys.executable, "-m", "sim.trainer", "--name", job, "--port", str(port), "--step-seconds", "0.05",
            "--checkpoint-every", "1000000", "--checkpoint-dir", str(tmp_path / f"ckpt-{port}"),
            "--state-dir", str(tmp_path / "state")]  # fmt: skip


def metric(port: int, name: str) -> float | None:
    """The largest sample of ``name`` the trainer serves (what Prometheus would scrape); None before it serves."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    return max(values, default=0.0)


@pytest.mark.parametrize("how", ["file", "USR1"])
def test_a_checkpoint_request_reaches_every_rank_and_each_checkpoints(
    how: str,
    kube_admin: KubeAdmin,
    kube_context: Callable[..., ActionContext],
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
    tmp_path: Path,
) -> None:
    """The job announces how it takes a request; each pod's trainer (the progress library) answers it with a new
    checkpoint: the marker Nightshift waits for moves past the request."""
    node = kube_admin.create_node(kubelet_port=fake_kubelet.port)
    job = kube_admin.create_training_job(
        kube_namespace, "PyTorchJob", "swap-me", annotations={CHECKPOINT_REQUEST: how}
    )
    ports = [free_port(), free_port()]
    env = {"NIGHTSHIFT_CHECKPOINT_REQUEST_FILE": str(tmp_path / "request" / "{rank}")}
    for rank, port in enumerate(ports):
        rank_env = {k: v.format(rank=rank) for k, v in env.items()}
        run_training_pod(
            kube_admin, fake_kubelet, job, node, trainer("swap-me", port, tmp_path), rank_env, tmp_path
        )
    # Training: past the start, where the trainer installs its SIGUSR1 handler (PID 1 ignores a signal it does
    # not handle).
    wait_until(
        lambda: all((metric(p, "training_step_total") or 0) > 0 for p in ports), 60, "the trainers to step"
    )
    before = [metric(p, CHECKPOINT_MARKER) or 0.0 for p in ports]

    ctx = kube_context()
    outcome = run_action(
        "kubernetes.request_checkpoint", ctx, namespace=kube_namespace, name="swap-me", kind="PyTorchJob"
    )

    assert isinstance(outcome, Ok), outcome
    assert len(outcome.data["asked"]) == 2 and outcome.data["how"] == how
    asked = outcome.data["requested_at"]
    wait_until(
        lambda: all((metric(p, CHECKPOINT_MARKER) or 0) > asked for p in ports),
        30,
        "every rank to checkpoint",
    )
    assert all(b < asked for b in before)


def test_a_job_that_announces_no_request_is_not_asked(
    idle_job: Callable[..., None],
    kube_context: Callable[..., ActionContext],
    fake_kubelet: FakeKubelet,
    kube_namespace: str,
) -> None:
    """SIGUSR1's default action kills a process that does not handle it: no exec at all."""
    idle_job("silent")
    execs = len(fake_kubelet.execs)

    outcome = run_action(
        "kubernetes.request_checkpoint",
        kube_context(),
        namespace=kube_namespace,
        name="silent",
        kind="PyTorchJob",
    )

    assert isinstance(outcome, Failed) and "announces no checkpoint request" in outcome.reason
    assert len(fake_kubelet.execs) == execs
