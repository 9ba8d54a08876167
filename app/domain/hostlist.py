"""Slurm hostlist expressions (``gpu[01-03,7],login1``) expanded to node names, and names compressed back into
one: pure, bounded.

Used wherever Nightshift needs the nodes of a job or a partition (:meth:`app.clients.slurm.SlurmClient.expand_hostlist`
parses here instead of asking ``scontrol show hostnames`` over SSH; :mod:`app.domain.discovery`), so it costs no round
trip. An expression this parser does not accept raises :class:`HostlistError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Nodes one expression may expand to.
MAX_HOSTLIST_NODES = 16_384

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


class HostlistError(ValueError):
    """A hostlist expression that is malformed or expands to more than :data:`MAX_HOSTLIST_NODES` names."""


def expand_hostlist(expression: str, limit: int = MAX_HOSTLIST_NODES) -> list[str]:
    """The node names of a Slurm hostlist: ``gpu[01-03,7],login1`` → gpu01, gpu02, gpu03, gpu7, login1;
    several bracket groups multiply (``r[1-2]n[1-2]``). Zero padding follows the lower bound's width."""
    names: list[str] = []
    for part in _split_top_level(expression):
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", part):
            expanded = [prefix + literal for prefix in expanded]
            if ranges:
                values = _range_values(ranges, limit)
                # The bound is checked on the product's size before the product is built (a[1-3000]b[1-3000]
                # would be 9 million strings first).
                if len(expanded) * len(values) + len(names) > limit:
                    raise HostlistError(f"hostlist {expression[:100]!r} expands to more than {limit} names")
                expanded = [prefix + value for prefix in expanded for value in values]
        names += [name for name in expanded if name]
        if len(names) > limit:  # many comma-separated parts
            raise HostlistError(f"hostlist {expression[:100]!r} expands to more than {limit} names")
    return names


_NUMBERED = re.compile(r"(.*?)([0-9]+)")


def compress_hostlist(names: Iterable[str]) -> str:
    """One hostlist expression for ``names`` (as ``scontrol show hostlist`` writes one): names that differ only in
    a trailing number share a bracket of ranges, ``gpu00064 ... gpu00127`` → ``gpu[00064-00127]``. Expanding it
    gives the same set of names (:func:`expand_hostlist`), sorted; a number keeps its own zero padding."""
    plain: list[str] = []
    numbered: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        match = _NUMBERED.fullmatch(name)
        if match and "[" not in name and "," not in name:
            numbered.setdefault(match.group(1), []).append(match.group(2))
        else:
            plain.append(name)
    parts = list(plain)
    for prefix, digits in sorted(numbered.items()):
        items = _ranges(sorted(digits, key=lambda d: (int(d), len(d))))
        parts.append(
            f"{prefix}{items[0]}"
            if len(items) == 1 and "-" not in items[0]
            else f"{prefix}[{','.join(items)}]"
        )
    return ",".join(parts)


def _ranges(digits: list[str]) -> list[str]:
    """``["01", "02", "03", "7"]`` → ``["01-03", "7"]``: runs of consecutive numbers written as the expansion
    reads them back (each value padded to the width of its run's first)."""
    runs: list[list[str]] = []
    for value in digits:
        run = runs[-1] if runs else None
        if run is not None and int(value) == int(run[-1]) + 1 and value == str(int(value)).zfill(len(run[0])):
            run.append(value)
        else:
            runs.append([value])
    return [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]


def _split_top_level(expression: str) -> list[str]:
    """Split at commas outside brackets; unbalanced brackets are a :class:`HostlistError`."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(expression):
        depth += (char == "[") - (char == "]")
        if depth not in (0, 1):
            raise HostlistError(f"unbalanced brackets in hostlist {expression[:100]!r}")
        if char == "," and depth == 0:
            parts.append(expression[start:index])
            start = index + 1
    if depth:
        raise HostlistError(f"unbalanced brackets in hostlist {expression[:100]!r}")
    return [*parts, expression[start:]]


def _range_values(ranges: str, limit: int) -> list[str]:
    values: list[str] = []
    for item in ranges.split(","):
        match = _RANGE.fullmatch(item)
        if not match:
            raise HostlistError(f"bad range {item!r} in a hostlist")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low) or int(high) - int(low) + len(values) >= limit:
            raise HostlistError(f"range {item!r} is reversed or larger than {limit}")
        values += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return values
