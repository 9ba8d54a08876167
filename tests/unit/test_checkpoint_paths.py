"""Checkpoint quarantine never acts on an allowed root itself (issue: a missing or ``.`` ``train_job`` rendered
``/shared/checkpoints/`` and renamed another job's newest checkpoint).

The shipped ``checkpoint-corrupt`` playbook's step is planned from alert labels exactly as the engine plans it, and
whatever passes is run: the action's exact command lines, executed by bash (``realpath``, ``find``, ``mv``) against a
real root holding ``run1/`` and ``run2/``. Only ``train_job=run1`` may rename anything, and only inside ``run1``.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from app.actions import default_registry
from app.actions.base import ActionContext
from app.clients import Clients
from app.clients.ssh import CommandResult
from app.config import Settings
from app.domain.permissions import Permissions
from app.domain.planning import INVALID, plan_steps
from app.domain.playbooks import load_playbooks
from tests.fakes import FakeClock

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


class BashSlurm:
    """The Slurm client's ``run`` at our seam: each argv is joined as the SSH client joins it and run by bash."""

    def run(self, argv: list[str], **_: Any) -> CommandResult:
        command = shlex.join(argv)
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
        return CommandResult(
            tuple(argv), command, done.returncode, done.stdout, done.stderr, time.monotonic() - started
        )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """``<tmp>/checkpoints`` with two jobs, each with two Hugging Face checkpoint directories."""
    root = tmp_path / "checkpoints"
    for job in ("run1", "run2"):
        for step in ("checkpoint-100", "checkpoint-200"):
            (root / job / step).mkdir(parents=True)
    return root


def plan_quarantine(root: Path, labels: dict[str, str]) -> Any:
    """The shipped playbook's rollback step, planned for an alert with ``labels`` (dir moved under ``root``)."""
    registry = default_registry()
    playbook = load_playbooks([PLAYBOOKS], registry).get("checkpoint-corrupt")
    assert playbook is not None
    (step,) = [s for s in playbook.steps if s.action == "checkpoint.rollback"]
    template = step.with_["dir"]
    assert template == "/shared/checkpoints/{{ labels.train_job }}"  # the shipped layout this test guards
    moved = dataclasses.replace(step, with_={"dir": template.replace("/shared/checkpoints", str(root))})
    (planned,) = plan_steps(
        [moved],
        registry=registry,
        permissions=Permissions(),
        template_context={"labels": labels, "target": {}},
        when={},
        target={},
    )
    return planned


def tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.glob("*/*"))


@pytest.mark.parametrize(
    "labels",
    [{}, {"train_job": ""}, {"train_job": "."}, {"train_job": ".."}, {"train_job": "run1/.."}],
    ids=["missing", "empty", "dot", "dotdot", "up-again"],
)
def test_a_dir_that_names_the_root_is_refused_before_anything_runs(root, labels):
    before = tree(root)
    planned = plan_quarantine(root, labels)
    assert planned.status == INVALID, planned
    assert "dir" in planned.reason
    assert tree(root) == before


def test_a_dir_resolving_to_the_root_through_a_symlink_fails_and_renames_nothing(root):
    (root / "run1" / "alias").symlink_to(root)
    before = tree(root)
    settings = Settings()
    settings.checkpoint.allowed_roots = [str(root)]
    action = default_registry().get("checkpoint.quarantine_latest")
    ctx = ActionContext(settings=settings, clients=Clients(settings, slurm=BashSlurm()), clock=FakeClock())
    outcome = action.run({"dir": str(root / "run1" / "alias")}, ctx)
    assert outcome.status == "failed" and "not strictly below an allowed root" in outcome.reason
    assert tree(root) == before


def test_the_jobs_own_dir_rolls_back_its_current_checkpoint_only(root):
    planned = plan_quarantine(root, {"train_job": "run1"})
    assert planned.status != INVALID, planned.reason
    settings = Settings()
    settings.checkpoint.allowed_roots = [str(root)]
    action = default_registry().get("checkpoint.rollback")
    ctx = ActionContext(settings=settings, clients=Clients(settings, slurm=BashSlurm()), clock=FakeClock())
    outcome = action.run(dict(planned.params), ctx)
    assert outcome.status == "ok", outcome
    after = tree(root)
    assert "run1/checkpoint-100" in after and "run1/checkpoint-200" not in after
    assert sorted(p.name for p in (root / "run1" / "nightshift-quarantine").iterdir()) == [
        "checkpoint-200.20261202T030000Z"
    ]
    assert {"run2/checkpoint-100", "run2/checkpoint-200"} <= set(after)  # the other job is untouched
