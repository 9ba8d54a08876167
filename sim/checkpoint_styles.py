"""Checkpoint directories as the real frameworks lay them out, and the checkpoint each framework resumes from.

``write(root, style, step)`` lays a checkpoint of ``step`` out as the framework does (file names from their save
code; contents are opaque bytes, this is about the layout), ``resumes_from(root, style)`` applies the framework's
own resume rule to a directory. Styles:

* ``deepspeed``: ``global_step<N>/mp_rank_00_model_states.pt`` and ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``,
  ``zero_to_fp32.py`` at the top, then the tag written to ``latest`` (``engine.save_checkpoint``); resume reads
  ``latest`` (``load_checkpoint`` with no tag).
* ``megatron``: ``iter_<7 digits>/mp_rank_00/model_optim_rng.pt``, then ``latest_checkpointed_iteration.txt``
  holding the iteration; resume reads that file.
* ``huggingface``: ``checkpoint-<N>/`` with ``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``,
  ``rng_state.pth``, ``trainer_state.json``, ``training_args.bin``; resume (``get_last_checkpoint``) takes the
  directory matching ``^checkpoint-(\\d+)$`` with the largest number.
* ``dcp``: ``step-<N>/`` with ``__<rank>_0.distcp`` files and ``.metadata`` (``torch.distributed.checkpoint.save``
  under torchtitan's naming); resume takes the largest ``step-(\\d+)`` (``re.search``) that holds ``.metadata``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

STYLES = ("deepspeed", "megatron", "huggingface", "dcp")
_HF = re.compile(r"^checkpoint-(\d+)$")
_DCP = re.compile(r"step-(\d+)")


def _blob(path: Path, step: int, size: int = 4096) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PK\x03\x04" + step.to_bytes(8, "little") * (size // 8))


def write(root: Path, style: str, step: int, ranks: int = 2) -> Path:
    """Write the checkpoint of ``step`` under ``root`` in ``style``; its directory."""
    root.mkdir(parents=True, exist_ok=True)
    if style == "deepspeed":
        tag = f"global_step{step}"
        _blob(root / tag / "mp_rank_00_model_states.pt", step)
        for rank in range(ranks):
            _blob(root / tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", step)
        (root / "zero_to_fp32.py").write_text("# DeepSpeed's consolidation script\n")
        _replace(root / "latest", tag)
        return root / tag
    if style == "megatron":
        directory = root / f"iter_{step:07d}"
        _blob(directory / "mp_rank_00" / "model_optim_rng.pt", step)
        _replace(root / "latest_checkpointed_iteration.txt", str(step))
        return directory
    if style == "huggingface":
        directory = root / f"checkpoint-{step}"
        for name in (
            "model.safetensors",
            "optimizer.pt",
            "scheduler.pt",
            "rng_state.pth",
            "training_args.bin",
        ):
            _blob(directory / name, step)
        state = {"global_step": step, "epoch": step / 1000, "log_history": [], "best_model_checkpoint": None}
        (directory / "trainer_state.json").write_text(json.dumps(state, indent=2))
        return directory
    if style == "dcp":
        directory = root / f"step-{step}"
        for rank in range(ranks):
            _blob(directory / f"__{rank}_0.distcp", step)
        _blob(
            directory / ".metadata", step, 512
        )  # written last by the coordinator: the checkpoint is complete
        return directory
    raise ValueError(f"unknown checkpoint style {style!r} (one of {', '.join(STYLES)})")


def resumes_from(root: Path, style: str) -> int | None:
    """The step the framework would load from ``root`` by its own rule, None when it would start from scratch."""
    if style == "deepspeed":
        latest = root / "latest"
        if not latest.is_file():
            return None
        tag = latest.read_text().strip()
        match = re.fullmatch(r"global_step(\d+)", tag)
        return int(match.group(1)) if match and (root / tag).is_dir() else None
    if style == "megatron":
        tracker = root / "latest_checkpointed_iteration.txt"
        if not tracker.is_file():
            return None
        iteration = int(tracker.read_text().strip())
        return iteration if (root / f"iter_{iteration:07d}").is_dir() else None
    if style == "huggingface":
        steps = [int(m.group(1)) for p in root.iterdir() if (m := _HF.search(p.name)) and p.is_dir()]
        return max(steps, default=None)
    if style == "dcp":
        steps = [
            int(m.group(1))
            for p in root.iterdir()
            if (m := _DCP.search(p.name)) and (p / ".metadata").is_file()
        ]
        return max(steps, default=None)
    raise ValueError(f"unknown checkpoint style {style!r}")


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
