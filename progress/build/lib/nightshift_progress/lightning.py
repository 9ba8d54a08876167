"""A PyTorch Lightning callback reporting to a :class:`~nightshift_progress.Progress`.

Importing this module imports Lightning (``lightning``, else ``pytorch_lightning``; ImportError without either);
``import nightshift_progress`` never does. Usage::

    from nightshift_progress import start
    from nightshift_progress.lightning import ProgressCallback

    trainer = lightning.Trainer(..., callbacks=[ProgressCallback(start("llama-7b"), batch_size=32)])

What maps to what: ``on_train_batch_end`` advances ``training_step_total`` to ``trainer.global_step`` (optimizer
steps; a resumed run jumps to its checkpoint's step), counts ``batch_size`` samples per batch when given, and sets
``training_loss`` from the step's ``loss`` output; validation runs between ``on_validation_start`` and
``on_validation_end``; ``on_train_start`` records the time of the checkpoint a resumed run loaded
(``fit(ckpt_path=...)``); ``on_save_checkpoint`` (called while Lightning builds the checkpoint, just before writing
it) records the checkpoint time; ``on_exception`` counts the exception's text with the error signatures;
``on_fit_end`` closes the endpoint after the linger. A checkpoint request from Nightshift
(:mod:`nightshift_progress.checkpoint_request`) is answered at the end of the batch with
``trainer.save_checkpoint`` into the checkpoint callback's directory (``nightshift-step=N.ckpt``), else
``<default_root_dir>/checkpoints``. ``save_checkpoint`` is collective (every rank calls it; the strategy's barrier)
and the ranks hear a request at different moments, so they agree at the end of every batch through the strategy
(``reduce_boolean_decision``: any rank asked).
"""

from __future__ import annotations

import os
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package of Lightning 1.x/2.x
    from pytorch_lightning.callbacks import Callback

from nightshift_progress.progress import DEFAULT_LINGER_SECONDS, Progress


def _loss(outputs: Any) -> float | None:
    """The loss of a training step's outputs (a tensor, a number, or a mapping with ``loss``)."""
    value = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _checkpoint_dir(trainer: Any) -> str:
    """Where the trainer's checkpoints go: its checkpoint callback's directory, else Lightning's default."""
    dirpath = getattr(getattr(trainer, "checkpoint_callback", None), "dirpath", None)
    return str(dirpath) if dirpath else os.path.join(str(trainer.default_root_dir), "checkpoints")


class ProgressCallback(Callback):  # type: ignore[misc]  # Lightning's base class is untyped here
    def __init__(self, progress: Progress, batch_size: int = 0, linger: float = DEFAULT_LINGER_SECONDS):
        super().__init__()
        self.progress = progress
        self.batch_size = batch_size
        self.linger = linger

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.batch_size:
            self.progress.samples(self.batch_size)
        self.progress.sync_step(trainer.global_step)
        loss = _loss(outputs)
        if loss is not None:
            self.progress.loss(loss)
        if trainer.strategy.reduce_boolean_decision(self.progress.checkpoint_requested(), all=False):
            trainer.save_checkpoint(
                os.path.join(_checkpoint_dir(trainer), f"nightshift-step={trainer.global_step}.ckpt")
            )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """A run resumed with ``fit(ckpt_path=...)`` loaded that checkpoint."""
        path = getattr(trainer, "ckpt_path", None)
        if path and os.path.isfile(path):
            self.progress.checkpoint_loaded(os.stat(path).st_mtime)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.progress.evaluation(True)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.progress.evaluation(False)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self.progress.checkpoint_saved()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.progress.error_line(f"{type(exception).__name__}: {exception}")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.progress.close(self.linger)
