"""The Lightning variant of the real job: ``torchrun ... -m sim.lightning_trainer --name N ...``.

The MLP regression of :mod:`sim.torch_trainer` as a ``LightningModule``, trained by ``lightning.Trainer`` on CPU
with DDP over gloo (``DDPStrategy(process_group_backend="gloo")``; Lightning finds torchrun's environment), under
the same launch (sbatch → srun → torchrun). ``ModelCheckpoint`` writes ``C/step-<N>.ckpt`` every
``--checkpoint-every`` steps (and ``last.ckpt``); a restarted run resumes with ``fit(ckpt_path=...)`` from the
newest. Progress: the progress library's own Lightning callback (:class:`nightshift_progress.lightning.
ProgressCallback`); rank faults and the status file as in :mod:`sim.torch_trainer`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy
from nightshift_progress.lightning import ProgressCallback
from torch.distributed.elastic.multiprocessing.errors import record

from sim import torch_trainer
from sim.torch_trainer import FEATURES, HIDDEN, Worker, batch

log = logging.getLogger("sim.lightning_trainer")


class Batches(torch.utils.data.IterableDataset):
    """The batches of :func:`sim.torch_trainer.batch` for this rank, from step ``start`` on."""

    def __init__(self, rank: int, size: int, start: int = 0):
        self.rank, self.size, self.start = rank, size, start

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        step = self.start
        while True:
            yield batch(step, self.rank, self.size)
            step += 1


class Regression(lightning.LightningModule):
    def __init__(self, worker: Worker):
        super().__init__()
        torch.manual_seed(0)
        self.worker = worker
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
            torch.nn.Linear(HIDDEN, 1),
        )  # fmt: skip
        self.started = time.monotonic()
        self.last_loss = float("nan")

    def training_step(self, data: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        self.worker.apply_faults()
        x, y = data
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def on_train_batch_end(self, outputs: Any, data: Any, index: int) -> None:
        self.worker.step = self.global_step
        self.worker.status("running")
        self.last_loss = float(outputs["loss"])
        if self.global_step % self.worker.settings.log_every == 0:
            log.info("step %d loss: %.4f", self.global_step, float(outputs["loss"]))
        time.sleep(max(0.0, self.worker.settings.step_seconds - (time.monotonic() - self.started)))
        self.started = time.monotonic()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["loss"] = self.last_loss  # read back by the resume line
        log.info(
            "saving checkpoint step-%d.ckpt (step %d, loss %.4f)",
            self.global_step,
            self.global_step,
            self.last_loss,
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.worker.settings.lr)


def newest_ckpt(root: Path) -> tuple[int, Path] | None:
    """The newest ``step-<N>.ckpt`` (ModelCheckpoint's) or ``nightshift-step=<N>.ckpt`` (written on a checkpoint
    request by the progress library's callback) under ``root``, None when none."""
    found = []
    for path in [*root.glob("step-*.ckpt"), *root.glob("nightshift-step=*.ckpt")] if root.is_dir() else ():
        digits = path.stem.split("-", 1)[1].split("=")[-1]
        if digits.isdigit():
            found.append((int(digits), path))
    return max(found, default=None)


@record
def main(argv: Sequence[str] | None = None) -> int:
    args = torch_trainer.parse_args(argv)
    torch_trainer.configure_logging()
    settings = torch_trainer.settings_from(args)
    worker = Worker.from_args(args, settings)
    worker.start()
    checkpoints = ModelCheckpoint(
        dirpath=args.checkpoint_dir, filename="step-{step}", auto_insert_metric_name=False,
        every_n_train_steps=settings.checkpoint_every, save_top_k=-1, save_last=True,
    )  # fmt: skip
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # torchrun's environment, not Slurm's: under srun, Lightning would take SLURM_PROCID for the rank.
    strategy = DDPStrategy(process_group_backend="gloo", cluster_environment=TorchElasticEnvironment())
    trainer = lightning.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), num_nodes=nodes,
        strategy=strategy, max_steps=settings.max_steps or -1, max_epochs=-1,
        callbacks=[ProgressCallback(worker.progress, settings.batch_size, settings.linger), checkpoints],
        enable_progress_bar=False, logger=False, enable_model_summary=False, log_every_n_steps=settings.log_every,
    )  # fmt: skip
    newest = newest_ckpt(args.checkpoint_dir)
    start = 0
    if newest is not None:
        start = newest[0]
        saved = torch.load(newest[1], map_location="cpu", weights_only=False)
        loss = float(saved.get("loss", float("nan")))
        log.info("resuming from step %d (loss %.4f, %s)", start, loss, newest[1])
    else:
        log.info("no checkpoint in %s, starting from step 0", args.checkpoint_dir)
    data = torch.utils.data.DataLoader(Batches(worker.rank, settings.batch_size, start), batch_size=None)
    try:
        trainer.fit(Regression(worker), data, ckpt_path=str(newest[1]) if newest else None)
    except Exception:
        log.exception("rank %d failed at step %d", worker.rank, worker.step)
        worker.status("failed")
        worker.progress.close(settings.linger, settings.scrape_wait)
        raise
    worker.status("exited")
    return 0


if __name__ == "__main__":
    sys.exit(main())
