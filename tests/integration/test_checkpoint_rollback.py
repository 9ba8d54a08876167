"""checkpoint.rollback over real SSH on the Slurm test cluster, on directories laid out as DeepSpeed, Megatron-LM,
Hugging Face Trainer and PyTorch DCP write them (sim/checkpoint_styles.py), judged by each framework's own resume
rule: after the rollback the framework resumes from the checkpoint before, and the current one is kept aside."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.actions.base import ActionContext
from app.actions.checkpoint_rollback import CheckpointRollback
from app.clients import Clients
from app.domain.checkpoint_layouts import QUARANTINE_DIR
from app.domain.outcome import Failed, Ok
from sim import checkpoint_styles
from tests.fakes import FakeClock
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration
STAMP = "20261202T030000Z"  # tests.fakes.START


@pytest.fixture
def ctx(slurm_cluster: SlurmCluster) -> Iterator[ActionContext]:
    clients = Clients(slurm_cluster.settings)
    yield ActionContext(settings=slurm_cluster.settings, clients=clients, clock=FakeClock())
    clients.close()


def run_dir(cluster: SlurmCluster, name: str) -> Path:
    path = cluster.checkpoint_root / name
    path.mkdir(parents=True)
    return path


@pytest.mark.parametrize("style", checkpoint_styles.STYLES)
def test_the_framework_resumes_from_the_previous_checkpoint(
    style: str, slurm_cluster: SlurmCluster, ctx: ActionContext
) -> None:
    root = run_dir(slurm_cluster, f"rollback-{style}")
    for step in (100, 200, 300):
        checkpoint_styles.write(root, style, step)
    assert checkpoint_styles.resumes_from(root, style) == 300
    current = checkpoint_styles.write(root, style, 300).name  # the name the framework gave step 300

    outcome = CheckpointRollback().run({"dir": str(root)}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert checkpoint_styles.resumes_from(root, style) == 200
    assert outcome.data["layout"] == style
    assert outcome.data["quarantined"] == f"{root}/{current}"
    assert (root / QUARANTINE_DIR / f"{current}.{STAMP}").is_dir()  # kept, not deleted
    assert f"{style} resumes from: " in outcome.output

    # Once more: the framework falls back to step 100; then nothing older is left and a person decides.
    assert isinstance(CheckpointRollback().run({"dir": str(root)}, ctx), Ok)
    assert checkpoint_styles.resumes_from(root, style) == 100
    last = CheckpointRollback().run({"dir": str(root)}, ctx)
    assert isinstance(last, Failed) and "only checkpoint" in last.reason
    assert checkpoint_styles.resumes_from(root, style) == 100


def test_an_unknown_layout_is_refused_and_left_untouched(
    slurm_cluster: SlurmCluster, ctx: ActionContext
) -> None:
    root = run_dir(slurm_cluster, "rollback-unknown")
    for name in ("step_000100", "step_000200"):
        (root / name).mkdir()

    outcome = CheckpointRollback().run({"dir": str(root)}, ctx)

    assert isinstance(outcome, Failed), outcome
    assert "no checkpoint layout recognised" in outcome.reason and "step_000100" in outcome.reason
    assert sorted(p.name for p in root.iterdir()) == ["step_000100", "step_000200"]


def test_a_directory_outside_the_roots_is_refused(slurm_cluster: SlurmCluster, ctx: ActionContext) -> None:
    outside = slurm_cluster.base / "rollback-outside"
    for step in (1, 2):
        checkpoint_styles.write(outside, "megatron", step)

    outcome = CheckpointRollback().run({"dir": str(outside)}, ctx)

    assert isinstance(outcome, Failed) and "not strictly below an allowed root" in outcome.reason
    assert checkpoint_styles.resumes_from(outside, "megatron") == 2
