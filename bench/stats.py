"""Summary statistics for benchmark samples. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``: always a value that was observed."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean in milliseconds, rounded to microseconds."""
    if not seconds:
        return {}
    ms = [s * 1000 for s in seconds]
    summary = {f"p{q}": percentile(ms, q) for q in (50, 90, 99)}
    summary["max"] = max(ms)
    summary["mean"] = statistics.fmean(ms)
    return {key: round(value, 3) for key, value in summary.items()}


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements (e.g. one p99 per round)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
