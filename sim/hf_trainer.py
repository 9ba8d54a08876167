"""The Hugging Face Transformers variant of the real job: ``torchrun ... -m sim.hf_trainer --name N ...``.

A tiny GPT-2 randomly initialised from a config (nothing downloaded) trained by ``transformers.Trainer`` on CPU
with DDP over gloo (``ddp_backend="gloo"``), under the same launch as :mod:`sim.torch_trainer` (sbatch → srun →
torchrun). The Trainer writes ``C/checkpoint-<N>/`` every ``--checkpoint-every`` steps and a restarted run resumes
with ``resume_from_checkpoint`` from the newest one (``transformers.trainer_utils.get_last_checkpoint``).
Progress: the progress library's own Trainer callback (:class:`nightshift_progress.hf.ProgressCallback`); its
logging handler counts the error classes of what the worker logs. Rank faults (:func:`sim.faults.
inject_rank_fault`) are read at every step; the same status file as :mod:`sim.torch_trainer` is written.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from nightshift_progress.hf import ProgressCallback
from torch.distributed.elastic.multiprocessing.errors import record
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from sim import torch_trainer
from sim.torch_trainer import Worker

log = logging.getLogger("sim.hf_trainer")

VOCAB = 64
CONTEXT = 16


class Sequences(torch.utils.data.Dataset):
    """Deterministic token sequences (a repeating pattern with noise: learnable, so the loss falls)."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        start = int(torch.randint(0, VOCAB, (1,), generator=generator))
        ids = (torch.arange(CONTEXT) * 3 + start) % VOCAB
        return {"input_ids": ids, "labels": ids.clone()}


class Pace(TrainerCallback):  # transformers ships no type information here
    """Paces steps (``step_seconds``), writes the rank's status and acts on its faults at every step."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()
        self.worker.apply_faults()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.worker.step = state.global_step
        self.worker.status("running")
        time.sleep(max(0.0, self.worker.settings.step_seconds - (time.monotonic() - self.started)))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if logs and "loss" in logs:
            log.info("step %d loss: %.4f", state.global_step, logs["loss"])

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        log.info("saved checkpoint %s/checkpoint-%d", args.output_dir, state.global_step)


def _checkpoint_loss(checkpoint: str) -> float:
    """The last logged loss of a ``checkpoint-N`` (its trainer_state.json), NaN when none was logged."""
    history = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("log_history", [])
    losses = [entry["loss"] for entry in history if "loss" in entry]
    return float(losses[-1]) if losses else float("nan")


@record
def main(argv: Sequence[str] | None = None) -> int:
    args = torch_trainer.parse_args(argv)
    torch_trainer.configure_logging()
    settings = torch_trainer.settings_from(args)
    worker = Worker.from_args(args, settings)
    worker.start()
    training = TrainingArguments(
        output_dir=str(args.checkpoint_dir),
        use_cpu=True,
        ddp_backend="gloo",
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        max_steps=settings.max_steps or 1_000_000,
        save_steps=settings.checkpoint_every,
        save_total_limit=3,
        logging_steps=settings.log_every,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        ddp_timeout=int(settings.collective_timeout),
    )
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2))
    callbacks = [ProgressCallback(worker.progress, linger=settings.linger), Pace(worker)]
    trainer = Trainer(model=model, args=training, train_dataset=Sequences(), callbacks=callbacks)
    last = get_last_checkpoint(str(args.checkpoint_dir)) if args.checkpoint_dir.is_dir() else None
    if last is not None:
        step = int(last.rsplit("-", 1)[1])
        log.info("resuming from step %d (loss %.4f, %s)", step, _checkpoint_loss(last), last)
    else:
        log.info("no checkpoint in %s, starting from step 0", args.checkpoint_dir)
    try:
        trainer.train(resume_from_checkpoint=last)
    except Exception:
        log.exception("rank %d failed at step %d", worker.rank, worker.step)
        worker.status("failed")
        worker.progress.close(settings.linger, settings.scrape_wait)
        raise
    worker.status("exited")
    return 0


if __name__ == "__main__":
    sys.exit(main())
