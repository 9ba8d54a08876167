"""A Hugging Face ``transformers`` Trainer callback reporting to a :class:`~nightshift_progress.Progress`.

Importing this module imports ``transformers`` (ImportError without it); ``import nightshift_progress`` never
does. Usage::

    from nightshift_progress import start
    from nightshift_progress.hf import ProgressCallback

    trainer = Trainer(..., callbacks=[ProgressCallback(start("llama-7b"))])

What maps to what: ``on_step_end`` advances ``training_step_total`` to ``state.global_step`` (a resumed run jumps
to its checkpoint's step) and counts ``per_device_train_batch_size * gradient_accumulation_steps * world_size``
samples per step; ``on_log`` sets ``training_loss`` from ``logs["loss"]``; prediction steps mark an evaluation in
progress until ``on_evaluate``; ``on_save`` records the checkpoint time (the Trainer has no hook before a save, so
``training_checkpoint_in_progress`` is not set) and ``on_train_begin`` the time of the ``checkpoint-N`` a resumed
run loaded; ``on_train_end`` closes the endpoint after the linger. A
checkpoint request from Nightshift (:mod:`nightshift_progress.checkpoint_request`) sets ``control.should_save`` at
the end of the step, so the Trainer writes ``checkpoint-N`` there. Every rank must save the same step (the save has
collectives: a rank alone in it would pair its all-gather with the others' next gradient all-reduce), and the
ranks hear a request at different moments (a signal to one node, a file polled once a second), so under
``torch.distributed`` the ranks agree at the end of every step in one all-reduce of a one-element tensor on
``args.device`` (MAX: any rank asked).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from nightshift_progress.progress import DEFAULT_LINGER_SECONDS, Progress


def _any_rank(requested: bool, device: Any) -> bool:
    """Whether any rank of the job was asked (this rank's answer alone outside ``torch.distributed``)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return requested
    flag = torch.tensor([1.0 if requested else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


class ProgressCallback(TrainerCallback):  # type: ignore[misc]  # transformers ships no type information here
    def __init__(self, progress: Progress, linger: float = DEFAULT_LINGER_SECONDS):
        self.progress = progress
        self.linger = linger
        self._evaluating = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A run resumed from ``checkpoint-<global_step>`` (the Trainer's naming) loaded that checkpoint."""
        resumed = os.path.join(str(args.output_dir), f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if state.global_step and os.path.isdir(resumed):
            self.progress.checkpoint_loaded(os.stat(resumed).st_mtime)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        per_step = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
        )
        self.progress.sync_step(state.global_step, per_step)
        if _any_rank(self.progress.checkpoint_requested(), args.device):
            control.should_save = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        loss = (logs or {}).get("loss")
        if isinstance(loss, (int, float)):
            self.progress.loss(float(loss))

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._evaluating:
            self._evaluating = True
            self.progress.evaluation(True)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._evaluating = False
        self.progress.evaluation(False)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.progress.checkpoint_saved()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.progress.close(self.linger)
