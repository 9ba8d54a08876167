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
the collective the others wait in: they are the culprits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_DUMP_CHARS = 4 * 1024 * 1024  # one rank's dump; bigger ones are cut, and unreadable
MAX_DUMPS = 4096

_HEADER = re.compile(r"^==> flight-recorder rank=(?P<rank>\d+)\b.*<==")


@dataclass(frozen=True)
class RankTrace:
    """What one rank's dump says of one process group."""

    rank: int
    group: str
    last_enqueued: int
    pending: str | None  # the oldest collective it waits in (not retired): "gloo:all_reduce #9"


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
            traces.append(RankTrace(rank, str(group), enqueued, pending.get(str(group))))
    return traces


def judge(traces: Sequence[RankTrace]) -> FlightVerdict | None:
    """The ranks behind the others in the first process group where some are behind; None when none are (or
    fewer than two ranks dumped)."""
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
    return None
