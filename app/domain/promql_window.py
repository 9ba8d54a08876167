"""Range selectors of a PromQL expression: found and shortened, so a verification sees only samples after the
recovery action whatever window the playbook's query uses. Pure: no I/O.

``increase(training_step_total{job="x"}[5m]) > 0`` polled 40 s after a requeue would still see the steps made
before the fault; :func:`clamp_ranges` rewrites it to ``[40s]``. Ranges inside string literals (``=~"a[0-9]"``)
are left alone; a subquery ``[5m:30s]`` has its range shortened and its resolution kept.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
# A range right after a selector or a closing parenthesis: [5m], [1h30m], [5m:], [5m:30s].
_RANGE = re.compile(r"\[\s*((?:\d+(?:ms|s|m|h|d|w|y))+)\s*(:\s*(?:(?:\d+(?:ms|s|m|h|d|w|y))+)?\s*)?\]")


def parse_duration(text: str) -> float:
    """Seconds in a PromQL duration such as ``1h30m``."""
    return sum(int(n) * _UNITS[unit] for n, unit in _DURATION.findall(text))


def _code_spans(expr: str) -> list[tuple[int, int]]:
    """(start, end) of the parts of ``expr`` outside string literals."""
    spans, start, i = [], 0, 0
    while i < len(expr):
        ch = expr[i]
        if ch in "\"'`":
            spans.append((start, i))
            i += 1
            while i < len(expr) and expr[i] != ch:
                i += 2 if expr[i] == "\\" and ch != "`" else 1
            start = i + 1
        i += 1
    spans.append((start, len(expr)))
    return spans


def ranges(expr: str) -> list[float]:
    """The range of every range selector or subquery in ``expr``, in seconds."""
    found = []
    for start, end in _code_spans(expr):
        found += [parse_duration(m.group(1)) for m in _RANGE.finditer(expr, start, end)]
    return found


def clamp_ranges(expr: str, limit: timedelta) -> str:
    """``expr`` with every range longer than ``limit`` (at least one second) shortened to it."""
    seconds = max(1, int(limit.total_seconds()))
    out, last = [], 0
    for start, end in _code_spans(expr):
        for m in _RANGE.finditer(expr, start, end):
            if parse_duration(m.group(1)) <= seconds:
                continue
            out.append(expr[last : m.start()])
            out.append(f"[{seconds}s{m.group(2) or ''}]")
            last = m.end()
    out.append(expr[last:])
    return "".join(out)
