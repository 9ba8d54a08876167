"""The scheduler seam: what differs between Slurm and Kubernetes is app/domain/schedulers.py (pure) and its I/O half
app/engine/scheduler_backends.py; nothing else in app/ names a scheduler."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.actions import default_registry
from app.actions.kubernetes import CORDONED_BY, OWNER
from app.domain import schedulers
from app.domain.errors import ParamError
from app.domain.job_phase import JobPhase, workload_status
from app.domain.repair_policy import RETURN, TAKE_OUT, VALIDATE
from app.engine import scheduler_backends as backends

ROOT = Path(__file__).resolve().parents[2]
# Where a scheduler's name may be written: the seam itself and the clients of each scheduler.
SEAM = ("app/domain/schedulers.py", "app/engine/scheduler_backends.py", "app/clients/")


def test_a_target_names_its_job_by_its_scheduler() -> None:
    assert schedulers.job_identity({"scheduler": "kubernetes", "namespace": "ml", "job": "llama"}) == (
        "kubernetes/ml/llama"
    )
    assert schedulers.job_identity({"scheduler": "kubernetes", "job": "llama"}) is None  # no namespace
    assert schedulers.job_identity({"scheduler": "slurm", "job": "4242"}) == "slurm/4242"
    assert schedulers.job_identity({"job": "4242"}) == "slurm/4242"  # the default scheduler's
    assert schedulers.job_identity({"scheduler": "slurm", "node": "node1"}) is None  # no job
    assert schedulers.job_identity({"scheduler": schedulers.NO_SCHEDULER, "job": "4242"}) is None


def test_the_default_is_declared_once_and_none_is_no_scheduler() -> None:
    assert schedulers.of({}) is schedulers.DEFAULT
    assert schedulers.of({"scheduler": ""}) is schedulers.DEFAULT
    assert schedulers.of({"scheduler": "kubernetes"}) is schedulers.KUBERNETES
    assert schedulers.of({"scheduler": schedulers.NO_SCHEDULER}) is None
    with pytest.raises(ValueError, match="names no scheduler"):
        schedulers.of_incident({"scheduler": schedulers.NO_SCHEDULER})


def test_each_scheduler_has_a_backend_that_asks_it() -> None:
    assert set(backends.BACKENDS) == set(schedulers.NAMES)
    assert all(backends.BACKENDS[name].scheduler is schedulers.named(name) for name in schedulers.NAMES)


@pytest.mark.parametrize("name", schedulers.NAMES)
def test_the_default_repair_steps_are_the_schedulers_own_actions(name: str) -> None:
    registry = default_registry()
    steps = schedulers.named(name).default_steps()
    assert set(steps) == {TAKE_OUT, VALIDATE, RETURN}
    for marker, (action_name, with_) in steps.items():
        action = registry.get(action_name)
        assert action_name.partition(".")[0] == name  # the scheduler's own backend
        assert set(with_) <= set(action.params), (marker, with_)
    assert registry.get(steps[TAKE_OUT][0]).takes_out
    assert registry.get(steps[RETURN][0]).return_to_service


def test_our_mark_is_the_one_the_kubernetes_actions_write() -> None:
    assert OWNER == schedulers.OUR_MARK
    assert schedulers.KUBERNETES.took_out_ours({"changed": False, "cordoned_by": OWNER})
    assert not schedulers.KUBERNETES.took_out_ours({"changed": False, "cordoned_by": "alice"})
    assert CORDONED_BY.startswith(OWNER)
    # slurm.drain_node drains again over our own drain: a take-out that changed nothing found someone else's.
    assert not schedulers.SLURM.took_out_ours({"changed": False, "reason": "maintenance"})


def test_a_slurm_target_follows_slurms_rules_and_a_kubernetes_one_does_not() -> None:
    with pytest.raises(ParamError):
        schedulers.SLURM.check_target({"job": "all"})
    with pytest.raises(ParamError):
        schedulers.SLURM.check_target({"node": "ALL"})
    schedulers.SLURM.check_target({"job": "4242_1", "node": "node1", "scheduler": "slurm"})
    schedulers.KUBERNETES.check_target({"job": "all", "node": "ALL"})


def test_a_kubernetes_jobs_status_is_read_from_its_pods() -> None:
    def pod(phase: str, node: str | None = None) -> dict[str, object]:
        return {"status": {"phase": phase}, "spec": {"nodeName": node} if node else {}}

    assert workload_status("", None, []).phase == JobPhase.UNKNOWN
    running = workload_status("", None, [pod("Running", "n2"), pod("Pending"), pod("Running", "n1")])
    assert (running.phase, running.nodes, running.state) == (JobPhase.RUNNING, ("n1", "n2"), "Running")
    assert workload_status("", None, [pod("Pending")]).phase == JobPhase.WAITING
    assert workload_status("", None, [pod("Succeeded", "n1")]).phase == JobPhase.COMPLETED
    died = workload_status("", None, [pod("Failed", "n1"), pod("Succeeded", "n2")])
    assert (died.phase, died.state) == (JobPhase.DIED, "Failed,Succeeded")


def _names_a_scheduler(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in schedulers.NAMES:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def test_nothing_outside_the_seam_names_a_scheduler() -> None:
    outside = [
        path
        for path in sorted((ROOT / "app").rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(SEAM)
    ]
    assert outside and not [hit for path in outside for hit in _names_a_scheduler(path)]
    assert _names_a_scheduler(ROOT / "app" / "domain" / "schedulers.py")  # the check finds what it looks for
