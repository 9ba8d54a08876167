"""Log files and labels from the command line for ``nightshift diagnose``: the I/O edge of :mod:`app.domain.diagnosis`.

Each file is read from its tail: at most :data:`app.domain.diagnosis.MAX_LOG_CHARS` bytes of it, which is as much as
diagnosis examines of all of them together, so a multi-gigabyte log costs no more than a small one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from app.domain.diagnosis import MAX_LOG_CHARS

MAX_LABELS = 64
_LABEL = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]{0,127})=(?P<value>.{0,1024})", re.DOTALL)


def read_tails(paths: Iterable[str | os.PathLike[str]]) -> str:
    """The tails of ``paths`` (each at most ``MAX_LOG_CHARS`` bytes, decoded leniently), joined in order."""
    texts = []
    for path in paths:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - MAX_LOG_CHARS))
            texts.append(handle.read(MAX_LOG_CHARS).decode("utf-8", errors="replace"))
    return "\n".join(texts)


def label_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``k=v`` strings as alert labels; ValueError naming the first that is not a label (Prometheus names,
    values up to 1024 characters, at most :data:`MAX_LABELS`)."""
    labels: dict[str, str] = {}
    for pair in pairs:
        match = _LABEL.fullmatch(pair)
        if match is None:
            raise ValueError(f"{pair[:80]!r} is not NAME=VALUE (a label name, '=', up to 1024 characters)")
        labels[match["name"]] = match["value"]
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{len(labels)} labels; at most {MAX_LABELS}")
    return labels
