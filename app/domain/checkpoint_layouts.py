"""Which checkpoint a training framework resumes from, and how to make it resume from the one before. Pure.

A checkpoint directory is recognised by what the framework itself reads when it resumes:

* **DeepSpeed** (``engine.load_checkpoint(dir)`` with no tag): the file ``latest`` holds the tag of the current
  checkpoint, a subdirectory (``global_step<N>`` by default). Rollback: ``latest`` names the previous tag.
* **Megatron-LM**: ``latest_checkpointed_iteration.txt`` holds the iteration (or ``release``); the checkpoint is
  ``iter_<7 digits>``. Rollback: the file names the previous iteration. ``release`` is refused.
* **Hugging Face Trainer** (``resume_from_checkpoint=True`` → ``get_last_checkpoint``): the ``checkpoint-<N>``
  subdirectory with the largest N. Rollback: the current one leaves the directory's top level.
* **PyTorch Distributed Checkpoint** (DCP): subdirectories holding a ``.metadata`` file, named with a step number
  (torchtitan's ``step-<N>``); the largest number is current. Rollback as for Hugging Face.

Anything else (no marker, several layouts at once, a tracker naming a missing checkpoint, no earlier checkpoint
to fall back to) is refused with a message that says what was found. The current checkpoint is never deleted: it
moves into the ``nightshift-quarantine/`` subdirectory (a name with no digits, so neither a ``checkpoint-N`` nor
a ``step-N`` pattern, anchored or not, can pick it up again), renamed ``<name>.<UTC stamp>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

QUARANTINE_DIR = "nightshift-quarantine"
DEEPSPEED_TRACKER = "latest"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
TRACKERS = (DEEPSPEED_TRACKER, MEGATRON_TRACKER)
DCP_METADATA = ".metadata"
MAX_TRACKER_BYTES = 256  # a tag or an iteration number; more is not a tracker file
MAX_ENTRIES = 100_000  # top-level entries considered (a listing is cut there)
# What the listings are read with (find -printf): each top-level entry's type letter and name, and the paths of the
# DCP metadata files two levels down, NUL-separated (a name may hold any other byte).
ENTRY_FORMAT = r"%y %f\0"
DCP_FORMAT = r"%P\0"

_MEGATRON_DIR = re.compile(r"iter_(\d{7})")
_HF_DIR = re.compile(r"checkpoint-(\d+)")
_TRAILING_NUMBER = re.compile(r"(\d+)$")


class Layout(StrEnum):
    DEEPSPEED = "deepspeed"
    MEGATRON = "megatron"
    HUGGINGFACE = "huggingface"
    DCP = "dcp"


class LayoutRefused(Exception):
    """The directory is not a layout Nightshift can roll back safely; the message says what it found."""


@dataclass(frozen=True)
class Listing:
    """What the action read from the checkpoint directory: its top-level entries (name → ``d`` directory,
    ``f`` file, ``l`` symlink, other), the subdirectories holding a DCP ``.metadata`` file, and the content of
    the tracker files present."""

    entries: Mapping[str, str]
    dcp_dirs: frozenset[str] = frozenset()
    trackers: Mapping[str, str] | None = None

    def dirs(self) -> list[str]:
        """Real subdirectories (never symlinks), quarantine excluded."""
        return [name for name, kind in self.entries.items() if kind == "d" and name != QUARANTINE_DIR]


@dataclass(frozen=True)
class Rollback:
    """The plan: write ``tracker`` (if any) with ``tracker_content`` first, then move ``current`` to
    ``quarantined`` (relative to the checkpoint directory). The framework then resumes from ``previous``."""

    layout: Layout
    current: str
    previous: str
    quarantined: str
    tracker: str | None = None
    tracker_content: str | None = None


def parse_entries(output: str) -> dict[str, str]:
    """``find DIR -mindepth 1 -maxdepth 1 -printf '%y %f\\0'`` output → name → type letter."""
    entries: dict[str, str] = {}
    for record in output.split("\0")[:MAX_ENTRIES]:
        kind, _, name = record.partition(" ")
        if name:
            entries[name] = kind
    return entries


def parse_dcp_dirs(output: str) -> frozenset[str]:
    """``find DIR -mindepth 2 -maxdepth 2 -type f -name .metadata -printf '%P\\0'`` → the subdirectory names."""
    return frozenset(path.split("/", 1)[0] for path in output.split("\0")[:MAX_ENTRIES] if path)


def detect(listing: Listing) -> Layout:
    """The one layout the directory is in; :class:`LayoutRefused` for none or several."""
    found = []
    if listing.entries.get(DEEPSPEED_TRACKER) == "f":
        found.append(Layout.DEEPSPEED)
    if listing.entries.get(MEGATRON_TRACKER) == "f":
        found.append(Layout.MEGATRON)
    dirs = listing.dirs()
    if any(_HF_DIR.fullmatch(name) for name in dirs):
        found.append(Layout.HUGGINGFACE)
    if any(name in listing.dcp_dirs for name in dirs):
        found.append(Layout.DCP)
    if not found:
        shown = ", ".join(sorted(listing.entries)[:8]) or "nothing"
        raise LayoutRefused(
            "no checkpoint layout recognised: expected DeepSpeed's 'latest' file, Megatron's "
            "'latest_checkpointed_iteration.txt', Hugging Face 'checkpoint-<N>' directories or PyTorch DCP "
            f"directories (holding '.metadata'); found {shown}"
        )
    if len(found) > 1:
        raise LayoutRefused(
            f"several checkpoint layouts in one directory ({', '.join(found)}): a person decides"
        )
    return found[0]


def plan_rollback(listing: Listing, stamp: str) -> Rollback:
    """The rollback of the checkpoint the framework would resume from now; :class:`LayoutRefused` when unsafe."""
    layout = detect(listing)
    trackers = listing.trackers or {}
    if layout is Layout.DEEPSPEED:
        tag = _tracker(trackers, DEEPSPEED_TRACKER)
        if listing.entries.get(tag) != "d":
            raise LayoutRefused(f"'latest' names {tag!r}, which is not a checkpoint directory here")
        candidates = _numbered(listing.dirs(), _TRAILING_NUMBER)
        previous = _before(candidates, tag, "DeepSpeed")
        return Rollback(layout, tag, previous, _quarantined(tag, stamp), DEEPSPEED_TRACKER, previous)
    if layout is Layout.MEGATRON:
        value = _tracker(trackers, MEGATRON_TRACKER)
        if value == "release":
            raise LayoutRefused(
                "latest_checkpointed_iteration.txt says 'release': not a training run to roll back"
            )
        if not value.isdigit():
            raise LayoutRefused(f"latest_checkpointed_iteration.txt holds {value[:40]!r}, not an iteration")
        current = f"iter_{int(value):07d}"
        if listing.entries.get(current) != "d":
            raise LayoutRefused(f"latest_checkpointed_iteration.txt names {current}, which is not here")
        candidates = _numbered(listing.dirs(), _MEGATRON_DIR)
        previous = _before(candidates, current, "Megatron")
        iteration = str(int(_MEGATRON_DIR.fullmatch(previous).group(1)))  # type: ignore[union-attr]
        return Rollback(layout, current, previous, _quarantined(current, stamp), MEGATRON_TRACKER, iteration)
    if layout is Layout.HUGGINGFACE:
        candidates = _numbered(listing.dirs(), _HF_DIR)
    else:
        unnumbered = sorted(
            n for n in listing.dcp_dirs if n in listing.dirs() and not _TRAILING_NUMBER.search(n)
        )
        if unnumbered:
            raise LayoutRefused(
                f"DCP checkpoint directories without a step number ({', '.join(unnumbered[:5])})"
            )
        candidates = _numbered([n for n in listing.dirs() if n in listing.dcp_dirs], _TRAILING_NUMBER)
    current = candidates[-1]
    previous = _before(candidates, current, str(layout))
    return Rollback(layout, current, previous, _quarantined(current, stamp))


def _tracker(trackers: Mapping[str, str], name: str) -> str:
    value = trackers.get(name)
    if value is None:
        raise LayoutRefused(f"{name} could not be read")
    value = value.strip()
    if not value or "/" in value or len(value) > MAX_TRACKER_BYTES:
        raise LayoutRefused(f"{name} holds {value[:40]!r}, not a checkpoint name")
    return value


def _numbered(names: Iterable[str], pattern: re.Pattern[str]) -> list[str]:
    """Names whose number ``pattern`` finds (full match for a directory pattern, trailing digits otherwise),
    oldest first."""
    keyed = []
    for name in names:
        match = pattern.fullmatch(name) if pattern is not _TRAILING_NUMBER else pattern.search(name)
        if match:
            keyed.append((int(match.group(1)), name))
    return [name for _, name in sorted(keyed)]


def _before(candidates: list[str], current: str, what: str) -> str:
    if current not in candidates:
        raise LayoutRefused(f"{what}: the current checkpoint {current!r} has no step number to order it by")
    index = candidates.index(current)
    if index == 0:
        raise LayoutRefused(
            f"{what}: {current} is the only checkpoint; rolling back would restart from scratch (a person decides)"
        )
    return candidates[index - 1]


def _quarantined(name: str, stamp: str) -> str:
    return f"{QUARANTINE_DIR}/{name}.{stamp}"
