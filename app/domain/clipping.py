"""Bounds on what Nightshift sends to people: text and label maps clipped before they reach a channel. Pure.

Each channel's documented limit (cited where it is used: :mod:`app.actions.notify`, :mod:`app.clients.pagerduty`)
is met by clipping here, never by a refusal at send time: a notice too large for a channel still arrives, shorter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ELLIPSIS = "…"
# A label map in a notice: this many entries, each value this long at most (label names are bounded at ingestion).
MAX_LABELS = 64
MAX_LABEL_VALUE = 500


def clip_text(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters; a clipped text ends with an ellipsis."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + ELLIPSIS


def clip_labels(
    labels: Mapping[str, Any], items: int = MAX_LABELS, value: int = MAX_LABEL_VALUE
) -> dict[str, str]:
    """The first ``items`` labels by name, each value clipped; a ``…`` entry counts the ones left out."""
    names = sorted(labels)
    clipped = {name: clip_text(str(labels[name]), value) for name in names[:items]}
    if len(names) > items:
        clipped[ELLIPSIS] = f"{len(names) - items} more label(s) left out"
    return clipped


def clip_data(data: Mapping[str, Any], value: int = MAX_LABEL_VALUE) -> dict[str, Any]:
    """A notice's ``data`` for machines: ``labels`` through :func:`clip_labels`, other strings clipped."""
    out: dict[str, Any] = {}
    for key, item in data.items():
        if key == "labels" and isinstance(item, Mapping):
            out[key] = clip_labels(item)
        elif isinstance(item, str):
            out[key] = clip_text(item, value)
        else:
            out[key] = item
    return out
