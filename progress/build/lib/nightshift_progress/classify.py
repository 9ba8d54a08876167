"""Error lines to error classes, with the signatures Nightshift's diagnosis uses (pure apart from reading the
packaged catalogue once).

``signatures.json`` is generated from Nightshift's ``app/domain/diagnosis/signatures.yaml`` by
``progress/sync_signatures.py`` and kept equal to it by a test, so a line the job counts as ``nccl`` is a line
the diagnosis reads as an NCCL failure. It holds every log-line signature (category, regex, weight) and the
category of each error class (from the catalogue's ``error_class`` label signatures). A line votes once, for its
heaviest matching signature, as in the diagnosis; a line whose heaviest signature belongs to a category without
an error class (a generic traceback, say) counts as nothing.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

# The error classes of the contract (Nightshift's rules/README.md), in the order they are exported. "cuda" (a CUDA
# error outside a process group, e.g. after an Xid) has no log signature of its own: count it with error("cuda").
ERROR_CLASSES = (
    "nccl",
    "cuda",
    "cuda_oom",
    "storage_io",
    "object_store_timeout",
    "checkpoint_corrupt",
    "nan",
)
# Longest line examined; the rest of a huge line is ignored (a classifier must not cost more than the log).
MAX_LINE_CHARS = 4096
# Lines of one event examined (a traceback longer than this is cut).
MAX_EVENT_LINES = 200


@dataclass(frozen=True)
class LineSignature:
    error_class: str | None
    regex: re.Pattern[str]
    weight: float


@dataclass(frozen=True)
class Classifier:
    """Line signatures in catalogue order; :meth:`classify` names the error class of a line."""

    signatures: tuple[LineSignature, ...]

    def match(self, line: str) -> LineSignature | None:
        """The heaviest signature matching ``line`` (first in catalogue order on ties), or None."""
        line = line[:MAX_LINE_CHARS]
        best: LineSignature | None = None
        for signature in self.signatures:
            if (best is None or signature.weight > best.weight) and signature.regex.search(line):
                best = signature
        return best

    def classify(self, line: str) -> str | None:
        """The error class of ``line``: its heaviest signature's, or None."""
        best = self.match(line)
        return best.error_class if best is not None else None

    def classify_event(self, text: str) -> str | None:
        """The error class of one error event of several lines (a message and its traceback): the class of
        the heaviest signature matching any line, so an event counts once, however many lines name it."""
        matches = [m for m in (self.match(line) for line in text.splitlines()[:MAX_EVENT_LINES]) if m]
        best = max(matches, key=lambda m: m.weight, default=None)
        return best.error_class if best is not None else None


def build_classifier(document: Mapping[str, object]) -> Classifier:
    """A :class:`Classifier` from the ``signatures.json`` document (``classes``: category → error class,
    ``signatures``: list of {category, pattern, weight})."""
    classes = document["classes"]
    entries = document["signatures"]
    if not isinstance(classes, Mapping) or not isinstance(entries, Sequence):
        raise ValueError("signatures.json: 'classes' must be a mapping and 'signatures' a list")
    unknown = sorted(set(classes.values()) - set(ERROR_CLASSES))
    if unknown:
        raise ValueError(f"signatures.json: unknown error classes {unknown}")
    return Classifier(
        tuple(
            LineSignature(
                classes.get(entry["category"]), re.compile(entry["pattern"]), float(entry["weight"])
            )
            for entry in entries
        )
    )


@functools.lru_cache(maxsize=1)
def packaged_classifier() -> Classifier:
    """The classifier of the packaged ``signatures.json`` (loaded once)."""
    text = resources.files(__package__).joinpath("signatures.json").read_text(encoding="utf-8")
    return build_classifier(json.loads(text))
