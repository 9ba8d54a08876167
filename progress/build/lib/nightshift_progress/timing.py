"""Per-rank step timing, for finding the straggler of a synchronous job.

In a synchronous job every rank's *wall* time per step is the same: the fast ranks wait for the slowest in the
gradient all-reduce. What tells the slow rank apart is the time it spends on its own work before it waits, so a
rank reports that: ``progress.step_time(seconds)``, or ``with progress.timing(): ...`` around the work it does
alone (for DDP: the forward pass and the loss; backward already overlaps the all-reduce). Nightshift's
``TrainingStraggler`` rule compares each node's slowest rank with the job's median rank (``rules/training.yml``).

Exported as the summary ``training_rank_step_seconds{rank}`` (``_sum`` and ``_count``) on the node's endpoint,
with the node's identity labels. Only local rank 0 serves (:mod:`nightshift_progress.identity`), so the other
ranks of the node hand their figures over through small files in a directory local to the node
(:func:`exchange_dir`): each rank rewrites ``rank-<rank>.json`` at most once per ``publish_seconds``; the serving
rank reads them at scrape time. Bounds: at most :data:`MAX_RANKS_PER_NODE` ranks are exported per node (the
``rank`` label's cardinality), a file not rewritten for :data:`STALE_SECONDS` (a dead rank) is left out, and a
file that is not a well-formed record is skipped.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import SummaryMetricFamily

from nightshift_progress.identity import LABELS, Identity

METRIC = "training_rank_step_seconds"
# Ranks of one node exported at most (8 GPUs a node is usual; 64 leaves room and bounds the label).
MAX_RANKS_PER_NODE = 64
# A rank that has not published for this long is gone (killed, hung before its first step, finished).
STALE_SECONDS = 600.0
DEFAULT_PUBLISH_SECONDS = 1.0
_RECORD = re.compile(r"^rank-(\d{1,7})\.json$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def exchange_dir(identity: Identity, env: Mapping[str, str]) -> Path:
    """The node-local directory through which the ranks of one job on one node hand over their timing:
    ``NIGHTSHIFT_PROGRESS_DIR`` when set, else a directory under ``/dev/shm`` (the temporary directory where
    there is none) named by the user and the job (Slurm job id, else namespace and pod, else the job name)."""
    configured = env.get("NIGHTSHIFT_PROGRESS_DIR", "")
    if configured:
        return Path(configured)
    job = (
        identity.slurm_job_id
        or "-".join(filter(None, (identity.namespace, identity.pod)))
        or identity.train_job
    )
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / _UNSAFE.sub("_", f"nightshift-progress-{os.getuid()}-{job}")[:200]


@dataclass(frozen=True)
class RankTimes:
    """What one rank has measured: steps timed and their total seconds, as of ``updated`` (Unix time)."""

    rank: int
    count: int
    total: float
    updated: float

    def to_json(self) -> str:
        return json.dumps(
            {"rank": self.rank, "count": self.count, "sum": self.total, "updated": self.updated}
        )

    @classmethod
    def from_json(cls, text: str) -> RankTimes | None:
        """The record, or None when ``text`` is not a well-formed one."""
        try:
            data = json.loads(text)
            record = cls(int(data["rank"]), int(data["count"]), float(data["sum"]), float(data["updated"]))
        except (ValueError, TypeError, KeyError):
            return None
        finite = all(math.isfinite(v) for v in (record.total, record.updated))
        return record if finite and record.count >= 0 and record.total >= 0 and record.rank >= 0 else None


class RankTiming:
    """This rank's step timing; publishes it to the node's exchange directory unless it serves the endpoint,
    in which case :meth:`collect` exports it with its siblings'."""

    def __init__(
        self,
        identity: Identity,
        directory: Path,
        *,
        publish_seconds: float = DEFAULT_PUBLISH_SECONDS,
        clock: Callable[[], float] = time.time,
    ):
        self.identity = identity
        self.directory = directory
        self.publish_seconds = publish_seconds
        self._clock = clock
        self._count = 0
        self._total = 0.0
        self._published = -math.inf
        self.publishing = True  # False once this process serves the endpoint

    @property
    def own(self) -> RankTimes:
        return RankTimes(self.identity.rank, self._count, self._total, self._clock())

    def record(self, seconds: float) -> None:
        """One step of this rank took ``seconds`` of its own work (negative or non-finite values are ignored)."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        self._count += 1
        self._total += seconds
        now = self._clock()
        if self.publishing and now - self._published >= self.publish_seconds:
            self._publish()
            self._published = now

    def _publish(self) -> None:
        """Rewrite this rank's record atomically; a directory that cannot be written loses the figure, never
        the training step."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".rank-")
            with os.fdopen(fd, "w") as out:
                out.write(self.own.to_json())
            os.replace(tmp, self.directory / f"rank-{self.identity.rank}.json")
        except OSError:
            return

    def siblings(self) -> Iterator[RankTimes]:
        """The other ranks' fresh records in the exchange directory (bounded, malformed ones skipped)."""
        try:
            names = sorted(p.name for p in self.directory.iterdir() if _RECORD.match(p.name))
        except OSError:
            return
        now = self._clock()
        for name in names[:MAX_RANKS_PER_NODE]:
            try:
                record = RankTimes.from_json(
                    (self.directory / name).read_bytes()[:4096].decode(errors="replace")
                )
            except OSError:
                continue
            if record and record.rank != self.identity.rank and now - record.updated <= STALE_SECONDS:
                yield record

    def collect(self) -> Iterator[SummaryMetricFamily]:
        """The summary family for a scrape: this rank and its siblings, one ``rank`` child each."""
        family = SummaryMetricFamily(
            METRIC,
            "Seconds of a rank's own work per training step (before it waits for the others).",
            labels=(*LABELS, "rank"),
        )
        labels = self.identity.labels()
        records = [self.own, *self.siblings()][:MAX_RANKS_PER_NODE]
        for record in records:
            if record.count:
                family.add_metric(
                    [*(labels[name] for name in LABELS), str(record.rank)], record.count, record.total
                )
        yield family

    def describe(self) -> list[SummaryMetricFamily]:
        return []

    def close(self) -> None:
        """Remove this rank's record (a rank that ended is not a straggler)."""
        try:
            (self.directory / f"rank-{self.identity.rank}.json").unlink(missing_ok=True)
        except OSError:
            return
