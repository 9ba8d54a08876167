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
``training_checkpoint_in_progress`` is not set); ``on_train_end`` closes the endpoint after the linger. A
checkpoint request from Nightshift (:mod:`nightshift_progress.checkpoint_request`) sets ``control.should_save`` at
the end of the step, so the Trainer writes ``checkpoint-N`` there.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from nightshift_progress.progress import DEFAULT_LINGER_SECONDS, Progress


class ProgressCallback(TrainerCallback):  # type: ignore[misc]  # transformers ships no type information here
    def __init__(self, progress: Progress, linger: float = DEFAULT_LINGER_SECONDS):
        self.progress = progress
        self.linger = linger
        self._evaluating = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        per_step = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
        )
        self.progress.sync_step(state.global_step, per_step)
        if self.progress.checkpoint_requested():
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
