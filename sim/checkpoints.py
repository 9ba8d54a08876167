"""Checkpoints of the simulated training job: write, find the newest, validate, corrupt. Files only.

Layout: ``<root>/step_000123/`` holds ``model.pt`` and ``optim.pt`` (opaque bytes that start like the zip
archive ``torch.save`` writes) and ``manifest.json``::

    {"step": 123, "loss": 2.41, "samples": 31488, "created": 1733150000.0,
     "files": {"model.pt": {"bytes": 65536, "sha256": "..."}, "optim.pt": {...}}}

A checkpoint is written into ``.tmp-step_000123`` and renamed, so a directory named ``step_*`` is complete
unless something damaged it afterwards; one without ``manifest.json`` is an interrupted copy and is skipped.
Names that do not match ``step_<digits>`` (e.g. one a remediation moved aside) are ignored. Each rank of a
multi-node job keeps its own ``<root>/rank<N>/`` in this layout and all ranks resume from the newest step they
all hold (:func:`newest_common`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

STEP_DIR = re.compile(r"step_(\d+)")
MANIFEST = "manifest.json"
PAYLOAD = {"model.pt": 64 * 1024, "optim.pt": 32 * 1024}
ZIP_MAGIC = b"PK\x03\x04"


class CorruptCheckpoint(Exception):
    """A checkpoint whose files do not match its manifest."""

    def __init__(self, path: Path, file: str):
        super().__init__(f"{path / file}: size or sha256 does not match {MANIFEST}")
        self.path = path
        self.file = file


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    loss: float
    samples: int
    created: float


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(root: Path, step: int, loss: float, samples: int, created: float) -> Checkpoint:
    """Write checkpoint ``step`` under ``root`` atomically (temporary directory, then rename)."""
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rng = random.Random(step)
    files = {}
    for name, size in PAYLOAD.items():
        path = tmp / name
        path.write_bytes(ZIP_MAGIC + rng.randbytes(size - len(ZIP_MAGIC)))
        files[name] = {"bytes": size, "sha256": _sha256(path)}
    manifest = {"step": step, "loss": loss, "samples": samples, "created": created, "files": files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return Checkpoint(final, step, loss, samples, created)


def _read(path: Path) -> Checkpoint | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return Checkpoint(path, manifest["step"], manifest["loss"], manifest["samples"], manifest["created"])


def listing(root: Path) -> list[Checkpoint]:
    """Complete checkpoints under ``root`` (those with a manifest), oldest step first."""
    found = []
    for path in root.glob("step_*"):
        if path.is_dir() and STEP_DIR.fullmatch(path.name) and (checkpoint := _read(path)):
            found.append(checkpoint)
    return sorted(found, key=lambda c: c.step)


def newest(root: Path) -> Checkpoint | None:
    checkpoints = listing(root)
    return checkpoints[-1] if checkpoints else None


def newest_common(roots: Sequence[Path]) -> int | None:
    """The newest step that every one of ``roots`` holds a complete checkpoint of (the ranks of a multi-node job
    each write their own shard; they can only resume together from a step all of them saved), None if none."""
    steps = [{c.step for c in listing(root)} for root in roots]
    common = set.intersection(*steps) if steps else set()
    return max(common, default=None)


def at(root: Path, step: int) -> Checkpoint | None:
    """The complete checkpoint of ``step`` under ``root``, None when there is none."""
    return next((c for c in listing(root) if c.step == step), None)


def validate(checkpoint: Checkpoint) -> None:
    """Raise :class:`CorruptCheckpoint` unless every file matches the manifest's size and sha256."""
    manifest = json.loads((checkpoint.path / MANIFEST).read_text())
    for name, expected in manifest["files"].items():
        path = checkpoint.path / name
        intact = path.is_file() and path.stat().st_size == expected["bytes"]
        if not intact or _sha256(path) != expected["sha256"]:
            raise CorruptCheckpoint(checkpoint.path, name)


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints."""
    for checkpoint in listing(root)[:-keep]:
        shutil.rmtree(checkpoint.path, ignore_errors=True)


def corrupt(checkpoint: Checkpoint) -> None:
    """Truncate ``model.pt`` to half, as a write cut short by a crash leaves it (no zip central directory)."""
    path = checkpoint.path / "model.pt"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
