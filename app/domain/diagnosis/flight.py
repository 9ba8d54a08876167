"""Which ranks never joined the stuck collective, from PyTorch's Flight Recorder dumps.

Pure: text in, a :class:`FlightVerdict` out. The Flight Recorder (``TORCH_FR_BUFFER_SIZE``, formerly
``TORCH_NCCL_TRACE_BUFFER_SIZE``) keeps each rank's last collectives; ``_dump_fr_trace_json()`` (and
``_dump_nccl_trace_json()`` for NCCL) returns them as one JSON document: ``entries`` (``collective_seq_id``,
``profiling_name`` such as ``gloo:all_reduce`` or ``nccl:all_reduce``, ``retired``, ``state``...) and
``pg_status`` (per process group: ``last_enqueued_collective``, ``last_completed_collective``). Checked on torch
2.13.0+cpu: it records gloo collectives too (state stays ``scheduled``: gloo does not time them; ``retired``
tells completion).

The dump does not say which rank wrote it, so each dump comes under a header naming the rank, as the collect step
(and ``tests/data/diagnosis/real/produce.py``) writes it: ``==> flight-recorder rank=R ... <==`` then the JSON.

The verdict: in a process group, the ranks whose last enqueued collective is behind the others' never reached
the collective the others wait in: they are the culprits. A rank whose dump was asked for and did not come (its
header with no JSON after it: the collect step's read timed out, as it does on a stopped process) is the culprit
when every rank that answered waits in the same collective, and the group's members (``pg_config``) include it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_DUMP_CHARS = 4 * 1024 * 1024  # one rank's dump; bigger ones are cut, and unreadable
MAX_DUMPS = 4096

_HEADER = re.compile(r"^==> flight-recorder rank=(?P<rank>\d+)\b.*<==")
_NODE = re.compile(r"\bnode=(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,252})(?=\s)")


def nodes(lines: Sequence[str]) -> dict[int, str]:
    """The node each rank's dump came from, as the collect step's headers say (``node=N``)."""
    found: dict[int, str] = {}
    for line in lines:
        header = _HEADER.match(line) if line.startswith("==> flight-recorder") else None
        if header and (node := _NODE.search(line)):
            found.setdefault(int(header["rank"]), node["node"])
    return found


@dataclass(frozen=True)
class RankTrace:
    """What one rank's dump says of one process group."""

    rank: int
    group: str
    last_enqueued: int
    pending: str | None  # the oldest collective it waits in (not retired): "gloo:all_reduce #9"
    members: tuple[
        int, ...
    ] = ()  # the group's ranks, when its pg_config says (the default group: every rank)


@dataclass(frozen=True)
class FlightVerdict:
    """The ranks missing from the collective the others wait in, and the lines that say so."""

    missing: tuple[int, ...]
    waiting: tuple[int, ...]
    collective: str  # "gloo:all_reduce #9 of process group 0"
    evidence: tuple[str, ...]


def parse_dumps(lines: Sequence[str]) -> list[RankTrace]:
    """Every process group of every dump under a flight-recorder header; unreadable dumps are skipped."""
    traces: list[RankTrace] = []
    rank: int | None = None
    body: list[str] = []

    def finish() -> None:
        if rank is None or not body or len(traces) >= MAX_DUMPS:
            return
        text = "\n".join(body)[:MAX_DUMP_CHARS]
        try:
            dump = json.loads(text)
        except ValueError:
            return
        if isinstance(dump, dict):
            traces.extend(_traces(rank, dump))

    for line in lines:
        if line.startswith("==> "):
            finish()
            header = _HEADER.match(line)
            rank, body = (int(header["rank"]) if header else None), []
        elif rank is not None:
            body.append(line)
    finish()
    return traces


def silent_ranks(lines: Sequence[str]) -> frozenset[int]:
    """The ranks whose Flight Recorder header has no JSON document under it: asked, and no dump came."""
    silent: set[int] = set()
    rank: int | None = None
    answered = False
    for line in [*lines, "==> end <=="]:
        if line.startswith("==> "):
            if rank is not None and not answered:
                silent.add(rank)
            header = _HEADER.match(line)
            rank, answered = (int(header["rank"]) if header else None), False
        elif rank is not None and line.lstrip().startswith("{"):
            answered = True
    return frozenset(silent)


def _members(config: object, group: str, groups: int) -> tuple[int, ...]:
    """The ranks of process group ``group`` from a dump's ``pg_config`` (keyed by the group, or by '' for the only
    group: torch 2.13 writes the default group's config under '' and its status under '0')."""
    if not isinstance(config, dict):
        return ()
    entry = config.get(group) or (next(iter(config.values())) if len(config) == 1 and groups == 1 else None)
    ranks = entry.get("ranks") if isinstance(entry, dict) else None
    try:
        parsed = json.loads(ranks) if isinstance(ranks, str) else ranks
    except ValueError:
        return ()
    if not isinstance(parsed, list) or len(parsed) > MAX_DUMPS:
        return ()
    return tuple(r for r in parsed if isinstance(r, int))


def _traces(rank: int, dump: dict[str, object]) -> list[RankTrace]:
    status = dump.get("pg_status")
    entries = dump.get("entries")
    if not isinstance(status, dict):
        return []
    pending: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("retired") is False and not entry.get("is_p2p"):
            group = str(entry.get("pg_id", ""))
            pending.setdefault(
                group, f"{entry.get('profiling_name', 'collective')} #{entry.get('collective_seq_id')}"
            )
    traces = []
    for group, state in status.items():
        if isinstance(state, dict):
            try:
                enqueued = int(state.get("last_enqueued_collective", -1))
            except (TypeError, ValueError):
                continue
            members = _members(dump.get("pg_config"), str(group), len(status))
            traces.append(RankTrace(rank, str(group), enqueued, pending.get(str(group)), members))
    return traces


def judge(traces: Sequence[RankTrace], silent: frozenset[int] = frozenset()) -> FlightVerdict | None:
    """The ranks behind the others in the first process group where some are behind, else the ``silent`` ranks of
    a group whose every answering rank waits in one collective; None when neither (or too little was dumped)."""
    groups: dict[str, list[RankTrace]] = {}
    for trace in traces:
        groups.setdefault(trace.group, []).append(trace)
    for group, members in sorted(groups.items()):
        if len({t.rank for t in members}) < 2:
            continue
        ahead = max(t.last_enqueued for t in members)
        missing = tuple(sorted({t.rank for t in members if t.last_enqueued < ahead}))
        if not missing:
            continue
        waiting = tuple(sorted({t.rank for t in members if t.last_enqueued == ahead}))
        what = next(
            (t.pending for t in members if t.last_enqueued == ahead and t.pending), f"collective #{ahead}"
        )
        behind = {t.rank: t.last_enqueued for t in members if t.rank in missing}
        evidence = (
            f"Flight Recorder: ranks {', '.join(map(str, waiting))} wait in {what} of process group {group}",
            *(
                f"Flight Recorder: rank {rank} last enqueued collective #{seq}"
                for rank, seq in behind.items()
            ),
        )
        return FlightVerdict(missing, waiting, f"{what} of process group {group}", evidence)
    return _silent_verdict(groups, silent)


def _silent_verdict(groups: dict[str, list[RankTrace]], silent: frozenset[int]) -> FlightVerdict | None:
    """The members of a group that did not answer, when every member that did waits in the same collective."""
    for group, members in sorted(groups.items()):
        expected = {r for t in members for r in t.members}
        missing = tuple(sorted((silent & expected) - {t.rank for t in members}))
        waits = {(t.last_enqueued, t.pending) for t in members}
        if not missing or len(waits) != 1 or next(iter(waits))[1] is None:
            continue
        waiting = tuple(sorted({t.rank for t in members}))
        what = f"{members[0].pending} of process group {group}"
        evidence = (
            f"Flight Recorder: ranks {', '.join(map(str, waiting))} wait in {what}",
            *(f"Flight Recorder: rank {rank} did not answer (stopped or hung hard)" for rank in missing),
        )
        return FlightVerdict(missing, waiting, what, evidence)
    return None
