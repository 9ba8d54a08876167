"""Root-cause diagnosis: alert labels and log text in, one :class:`Diagnosis` out.

Pure: no network, store or clock; the only files read are the packaged catalogues (loaded once). Work is
bounded: at most the last :data:`MAX_LOG_CHARS` characters are read; the last :data:`MAX_LINES` lines are
classified in full, each only up to :data:`MAX_LINE_CHARS`, and the lines before them are searched for buried
causes (:data:`BURIED`: an Xid 20,000 lines before the end is still found).

How a verdict is reached:
1. One pass over the lines (:mod:`app.domain.diagnosis.evidence`): each line votes for its heaviest matching cause
   signature (``signatures.yaml``) unless it is known noise; markers note shutdown, completion, progress and
   recovery; Xids, NCCL's rank table, torchrun's failure summary, gradient norms and py-spy dumps are read.
2. What a healthy run explains away is dropped: errors after the job was cancelled or timed out (shutdown
   noise), Xid 45 after a cancel, errors followed by sustained training progress or by their own recovery
   (``nfs: server OK``, a retry that succeeded).
3. Patterns across lines add votes: the same app-class Xid on one GPU across processes (suspect the GPU) or on
   many GPUs (the application), NaN from one rank at several iterations across restarts (silent data
   corruption), gradient norms exploding, a long gap without progress before a time limit (a hang), the ranks'
   stacks (:mod:`app.domain.diagnosis.stacks`).
4. Label signatures and the Xid verdict add their weights; consequences of a decisive cause are discounted
   (the tracebacks and peer NCCL errors a dead rank drags along), and an application exception that comes
   before the first NCCL error is the cause of it rather than its consequence.
5. Confidence grows with the winning score and its margin. Below ``confidence_floor`` the answer is
   ``unknown`` (or ``benign`` when the run shows it is healthy), with what was seen in the summary.
6. The culprit (:class:`Culprit`) is the rank, node and GPU the decisive evidence points at: the odd rank out
   of a collective timeout, the first rank to fail, the node a kernel line came from, the GPU a PCI address
   maps to.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from app.domain.diagnosis import flight
from app.domain.diagnosis import launcher as launchers
from app.domain.diagnosis import stacks as stackdumps
from app.domain.diagnosis import xid as xids
from app.domain.diagnosis.evidence import MAX_LINE_CHARS, Reading, Vote, exploding, iteration_of, read
from app.domain.diagnosis.lines import LogLine, normalise_pci, parse_line
from app.domain.diagnosis.signatures import (
    BENIGN,
    CATEGORIES,
    UNKNOWN,
    SignatureCatalogue,
    load_catalogue,
)

if TYPE_CHECKING:
    from app.config import Settings

__all__ = [
    "BENIGN",
    "CATEGORIES",
    "DEFAULT_CONFIDENCE_FLOOR",
    "UNKNOWN",
    "Culprit",
    "Diagnosis",
    "SignatureCatalogue",
    "diagnose",
    "for_settings",
    "load_catalogue",
    "render",
]

MAX_LOG_CHARS = 8 * 1024 * 1024
MAX_LINES = 20_000
MAX_BURIED = 200
# Causes a flood of later lines must not hide: looked for in every line before the last MAX_LINES.
BURIED = re.compile(
    r"NVRM: Xid|SXid \(PCI|fallen off the bus|uncorrectable ECC|Out of memory: Kill|invoked oom-killer|"
    r"Kernel panic|LustreError: |This client was evicted|nfs: server \S+ not responding|NODE FAILURE"
)
MAX_EVIDENCE = 20
MAX_EVIDENCE_CHARS = 500
DEFAULT_CONFIDENCE_FLOOR = 0.35

LINE_SCORE_CAP = 10.0  # per category: two decisive lines' worth
CAUSE_MIN = 5.0  # a category this strong is a cause whose consequences get discounted
CONSEQUENCE_FACTOR = 0.25
CONFIDENCE_SCALE = 5.0  # score at which strength reaches 1 - 1/e
SERIOUS = 3.0  # a vote at least this heavy is an error that sustained progress must follow to be survived
PROGRESS_TO_RESOLVE = 3  # progress lines after an error that show the run survived it
HANG_GAP_SECONDS = 1800.0  # no progress this long before a time limit or cancel is a hang
# The launcher reporting that a worker failed, not what failed in it.
_LAUNCHER_ERROR = re.compile(
    r"ChildFailedError|SignalException|ProcessExitedException|ProcessRaisedException"
)
# NCCL errors that only report a peer gone: a consequence when the log shows why it went.
_PEER_GONE = re.compile(
    r"remote process exited|ncclRemoteError|Connection closed by (?:remote )?peer|socket progress error|"
    r"exiting prematurely|Connection reset by peer|Connection refused|Broken pipe|"
    r"ncclUniqueId from \[\d+\] via c10d key-value store|received errors while waiting for send/recv from rank"
)
# Communication errors that the waiting side reports: they name a victim, never the culprit.
_VICTIM = re.compile(
    _PEER_GONE.pattern
    + r"|Timed out waiting|Watchdog caught|detected by watchdog|[Tt]imed out|TCPStore|C10d store|"
    r"[Ff]ailed to recv|DistBackendError|NCCL error in|Some NCCL operations"
)
# A line about one worker process, by its pid (torchrun's summary and agent lines, the signal text).
_PID_NAMED = re.compile(r"\(pid: (?P<a>\d+)\)|\bby PID (?P<b>\d+)\b")
# Categories a restart (off the culprit, from the last good checkpoint) can recover without a change to the
# code or the configuration.
RESTARTABLE = frozenset(
    {"gpu_hardware", "nvlink", "nccl_network", "storage_io", "object_store_timeout", "checkpoint_corrupt",
     "node_failure", "hang"}
)  # fmt: skip
_KILLED_ONLY = "a process was killed (SIGKILL, typically the OOM killer)"
_NAN_VALUE = re.compile(r"(?i)\b(?:nan|inf)\b")
_YEAR_2001 = 978307200.0  # times before this were parsed from formats without a year
SHUTDOWN_NOISE = frozenset({"application_error", "nccl_network", "hang"})

# Weight of the Xid verdict, by class: hardware Xids must beat a capped flood of consequent NCCL errors.
# Application-class Xids (13, 31, 43...) vote for application_error (see _xid_votes).
XID_WEIGHT = {
    "reboot": 12.0,
    "reset_gpu": 10.0,
    "nvlink": 10.0,
    "contact_support": 8.0,
    "other": 4.0,
    "restart_app": 4.0,
    "ignore": 0.5,
}
_SEVERE_XID = frozenset({"reboot", "reset_gpu", "nvlink", "contact_support"})

# consequence -> the categories that typically cause it
_CAUSES: dict[str, frozenset[str]] = {
    "application_error": frozenset(CATEGORIES) - {"application_error"},
    "nccl_network": frozenset(CATEGORIES) - {"nccl_network", "application_error"},
    # a collective timeout or the tracebacks of the ranks that waited are what a hung rank causes, not its cause
    "hang": frozenset(CATEGORIES) - {"hang", "nccl_network", "application_error"},
    "numerical_divergence": frozenset({"gpu_hardware", "nvlink"}),
    "checkpoint_corrupt": frozenset({"storage_io", "object_store_timeout"}),
    "node_failure": frozenset({"gpu_hardware", "nvlink"}),
}

# Xid class -> what to do, for the summary sentence
_XID_ACTION = {
    "reboot": "drain and reboot the node",
    "reset_gpu": "drain the node and reset the GPU",
    "nvlink": "drain the node, reset the GPU and reboot if NVLink errors persist",
    "contact_support": "drain the node and contact NVIDIA support",
    "restart_app": "restart the job; the GPU stays in service",
    "ignore": "no action required",
}

# category -> (title, advice) for the summary sentence
_WORDING = {
    "gpu_hardware": ("GPU hardware fault", "drain the node and run DCGM diagnostics"),
    "nvlink": ("NVLink fault", _XID_ACTION["nvlink"]),
    "nccl_network": (
        "NCCL/network failure",
        "check the fabric and the peer ranks, then restart from the last checkpoint",
    ),
    "storage_io": (
        "Storage I/O failure",
        "check the mount and free space, then restart from the last good checkpoint",
    ),
    "object_store_timeout": ("Object store timeouts", "check the endpoint and request rate, then retry"),
    "checkpoint_corrupt": ("Corrupt checkpoint", "resume from the previous checkpoint"),
    "cuda_oom": (
        "CUDA out of memory",
        "reduce batch size or memory use; an unchanged restart will fail again",
    ),
    "host_oom": (
        "Host out of memory",
        "give the job more host memory or fewer data-loader workers; an unchanged restart will fail again",
    ),
    "node_failure": ("Node failure", "take the node out and requeue the job elsewhere"),
    "numerical_divergence": (
        "Numerical divergence",
        "roll back to an earlier checkpoint and lower the learning rate",
    ),
    "hang": ("Training hang", "dump the ranks' stacks, then restart from the last checkpoint"),
    "application_error": (
        "Application error",
        "fix the code or configuration; a restart alone will not help",
    ),
}

# host_oom when the only evidence is a SIGKILL: the OOM killer is the usual sender, but not the only one.
_KILLED_WORDING = (
    "Rank killed (SIGKILL)",
    "the kernel's OOM killer, a lost node or an operator sent it (the log does not say which); restart from the "
    "last checkpoint, and give the job more host memory if it recurs",
)

_NODE_LABELS = ("Hostname", "node", "nodename", "host", "instance_hostname")


@dataclass(frozen=True)
class Culprit:
    """Who the decisive evidence points at: a node, a rank, a GPU (any may be unknown), and the lines that
    say so."""

    node: str | None
    rank: int | None
    gpu: str | None
    evidence: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "gpu": self.gpu, "evidence": list(self.evidence)}

    def describe(self) -> str:
        parts = []
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.node:
            parts.append(f"on {self.node}" if parts else self.node)
        if self.gpu is not None:
            parts.append(f"GPU {self.gpu}")
        return " ".join(parts)


@dataclass(frozen=True)
class Diagnosis:
    """The root cause of an incident, as far as labels and logs tell.

    ``category`` is one of :data:`CATEGORIES`, ``benign`` (the run is healthy or was stopped on purpose:
    nothing to act on) or ``unknown`` (not enough evidence); ``confidence`` is in [0, 1] (0 for unknown);
    ``evidence`` holds the supporting label facts and log lines (at most 20, each at most 500 characters);
    ``xid``/``xid_class`` are set whenever an Xid was seen (class: see :data:`app.domain.diagnosis.xid.SEVERITY`);
    ``culprit`` is the node/rank/GPU the evidence points at, when it points at one; ``restartable`` whether a
    restart (off the culprit, from the last good checkpoint) can recover the job without a change to its code or
    configuration (False for benign and unknown verdicts: there is nothing to restart for).
    """

    category: str
    confidence: float
    summary: str
    evidence: tuple[str, ...] = ()
    xid: int | None = None
    xid_class: str | None = None
    culprit: Culprit | None = None
    restartable: bool = False

    @property
    def actionable(self) -> bool:
        """Whether this verdict names a fault worth acting on (not ``unknown``, not ``benign``)."""
        return self.category in CATEGORIES

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, for the ledger and the API."""
        return {
            "category": self.category,
            "confidence": self.confidence,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "xid": self.xid,
            "xid_class": self.xid_class,
            "actionable": self.actionable,
            "culprit": self.culprit.as_dict() if self.culprit else None,
            "restartable": self.restartable,
        }


@dataclass
class _Tally:
    """Votes for one category."""

    line_score: float = 0.0
    other_score: float = 0.0  # labels, Xids and patterns: few, so uncapped
    facts: list[str] = field(default_factory=list)  # label facts and pattern findings
    lines: dict[str, None] = field(default_factory=dict)  # distinct matching lines, first occurrences
    votes: list[Vote] = field(default_factory=list)
    top: str | None = None  # description of the heaviest evidence, first on ties
    top_weight: float = 0.0
    culprit: Culprit | None = None  # set by a pattern that names one

    @property
    def raw(self) -> float:
        return min(self.line_score, LINE_SCORE_CAP) + self.other_score

    def describe(self, description: str, weight: float) -> None:
        if self.top is None or weight > self.top_weight:
            self.top, self.top_weight = description, weight

    def add_vote(self, vote: Vote) -> None:
        text = vote.line.raw.strip()
        if text not in self.lines:  # a distinct line votes once
            self.lines[text] = None
            self.line_score += vote.weight
            self.votes.append(vote)
            self.describe(vote.signature.description, vote.weight)

    def add_fact(
        self, fact: str | None, weight: float, description: str, culprit: Culprit | None = None
    ) -> None:
        """A vote that is not one log line: a label, the Xid verdict, a pattern across lines (``fact`` says
        what was found, None when the evidence lines say it already)."""
        self.other_score += weight
        if fact is not None:
            self.facts.append(fact)
        self.describe(description, weight)
        if culprit is not None and (self.culprit is None or weight >= self.top_weight):
            self.culprit = culprit


def diagnose(
    labels: Mapping[str, str],
    logs: str = "",
    catalogue: SignatureCatalogue | None = None,
    *,
    confidence_floor: float = DEFAULT_CONFIDENCE_FLOOR,
) -> Diagnosis:
    """Diagnose one incident from its alert ``labels`` and ``logs`` (job output, kernel messages, py-spy dumps,
    in any mix).

    ``catalogue`` defaults to the packaged signatures; a verdict needs a confidence of at least
    ``confidence_floor`` (settings: ``diagnosis.confidence_floor``). Never raises on odd input; nothing
    recognised gives category ``unknown`` with confidence 0.
    """
    if catalogue is None:
        catalogue = load_catalogue()
    lines = tail_lines(logs)
    reading = read(lines, catalogue)
    tallies = {category: _Tally() for category in CATEGORIES}
    shutdown = reading.last("shutdown")
    explained: list[str] = []  # why errors were set aside, for a benign summary

    votes = _shutdown_filtered(_without_teardown(reading), reading, explained)
    survived = _survived_categories(votes, reading, explained)
    votes = [v for v in votes if v.category not in survived]
    for vote in votes:
        tallies[vote.category].add_vote(vote)
    for signature, fact in catalogue.match_labels(labels):
        if signature.category in survived:  # the alert counted errors the log shows were survived
            explained.append(f"the alert's {fact} names errors the job survived")
            continue
        tallies[signature.category].add_fact(fact, signature.weight, signature.description)

    _launcher_votes(reading, tallies)
    verdict = _xid_votes(labels, reading, tallies, explained)
    _pattern_votes(reading, votes, shutdown, tallies, lines)

    scores = _discounted({category: tally.raw for category, tally in tallies.items()}, tallies, reading)
    ranked = sorted(CATEGORIES, key=lambda c: -scores[c])  # stable: catalogue order breaks ties
    winner, runner_up = ranked[0], ranked[1]
    best = scores[winner]
    confidence = 0.0
    if best > 0:
        confidence = (1 - math.exp(-best / CONFIDENCE_SCALE)) * (
            0.5 + 0.5 * (best - scores[runner_up]) / best
        )
    if best <= 0 or confidence < confidence_floor:
        return _no_fault(reading, tallies, scores, winner, confidence, explained, labels)

    tally = tallies[winner]
    culprit = _culprit(winner, tally, reading)
    xid_evidence = [event.evidence for event in verdict.events] if verdict else []
    killed_only = winner == "host_oom" and all(v.signature.description == _KILLED_ONLY for v in tally.votes)
    return Diagnosis(
        category=winner,
        confidence=round(confidence, 2),
        summary=_summary(winner, tally, verdict, labels, culprit, killed_only),
        evidence=_evidence([*tally.facts, *xid_evidence, *tally.lines]),
        xid=verdict.primary.code if verdict else None,
        xid_class=verdict.xid_class if verdict else None,
        culprit=culprit,
        restartable=winner in RESTARTABLE or killed_only,
    )


def for_settings(settings: Settings) -> Callable[..., Diagnosis]:
    """:func:`diagnose` with the configured confidence floor: what the engine and ``explain`` call."""
    return functools.partial(diagnose, confidence_floor=settings.diagnosis.confidence_floor)


def render(diagnosis: Diagnosis) -> str:
    """The diagnosis for a person: verdict, summary, culprit, evidence (``nightshift diagnose``)."""
    verdict = "act" if diagnosis.actionable else "do not act"
    lines = [
        f"verdict: {diagnosis.category} ({diagnosis.confidence:.2f}, {verdict})",
        f"summary: {diagnosis.summary}",
    ]
    if diagnosis.xid is not None:
        lines.append(f"xid: {diagnosis.xid} ({diagnosis.xid_class})")
    culprit = diagnosis.culprit
    if culprit is not None:
        lines.append(
            f"culprit: node {culprit.node or '-'}, rank {'-' if culprit.rank is None else culprit.rank}, "
            f"gpu {'-' if culprit.gpu is None else culprit.gpu}"
        )
        lines.extend(f"  because: {line}" for line in culprit.evidence)
    else:
        lines.append("culprit: none named")
    lines.append("evidence:" if diagnosis.evidence else "evidence: none")
    lines.extend(f"  {item}" for item in diagnosis.evidence)
    return "\n".join(lines)


def tail_lines(logs: str) -> list[str]:
    """What diagnosis reads: the last :data:`MAX_LINES` lines of the last :data:`MAX_LOG_CHARS` characters, after
    the lines before them that name a buried cause (an Xid, a GPU off the bus, the OOM killer: see
    :data:`BURIED`), at most :data:`MAX_BURIED` of them, the last ones. Every line is looked at; only the last
    :data:`MAX_LINES` are classified in full."""
    if len(logs) > MAX_LOG_CHARS:
        logs = logs[-MAX_LOG_CHARS:]
        logs = logs[logs.find("\n") + 1 :]  # drop the cut-off partial first line
    lines = logs.splitlines()
    if len(lines) <= MAX_LINES:
        return lines
    head = lines[:-MAX_LINES]
    buried = [line for line in head if BURIED.search(line, 0, MAX_LINE_CHARS)][-MAX_BURIED:]
    return buried + lines[-MAX_LINES:]


# --- what a healthy run explains away ---------------------------------------------------------------------


def _without_teardown(reading: Reading) -> list[Vote]:
    """The votes without the lines about workers torchrun's agent killed itself when it tore the group down
    after another worker failed (their SIGTERM, or the SIGKILL when they ignored it): victims, not causes."""
    victims = reading.launcher.closed_pids
    if not victims:
        return list(reading.votes)
    kept = []
    for vote in reading.votes:
        named = _PID_NAMED.search(vote.line.body)
        if (
            named
            and int(named["a"] or named["b"]) in victims
            and vote.category in ("host_oom", "application_error")
        ):
            continue
        kept.append(vote)
    return kept


def _shutdown_filtered(votes: list[Vote], reading: Reading, explained: list[str]) -> list[Vote]:
    """Votes without the shutdown noise that follows a cancel, time limit or SIGTERM, or the job's end (the
    tracebacks of interpreter teardown after training finished), up to the job's next run (progress or a
    restart)."""
    kept: list[Vote] = []
    dropped: dict[str, int] = {}
    for vote in votes:
        # A SIGKILL after a stop is the stop's own escalation (SIGTERM, then SIGKILL when the grace period ends).
        noise_kind = vote.category in SHUTDOWN_NOISE or (
            vote.category == "host_oom" and (vote.weight < 5 or vote.signature.description == _KILLED_ONLY)
        )
        stop = reading.stopped_before(vote.line.index) if noise_kind else None
        if stop is not None and not reading.restarted_between(stop.index, vote.line.index):
            dropped[stop.signature.description] = dropped.get(stop.signature.description, 0) + 1
        else:
            kept.append(vote)
    for description, count in dropped.items():
        explained.append(f"{count} error line(s) after {description} are shutdown noise")
    return kept


def _survived_categories(votes: list[Vote], reading: Reading, explained: list[str]) -> set[str]:
    """The categories whose errors the run survived: their last error is followed by their recovery marker,
    by the job finishing, or by sustained progress (at least :data:`PROGRESS_TO_RESOLVE` progress lines
    without an error of their own)."""
    vote_lines = {v.line.index for v in votes}
    progress = [
        m.index for m in reading.markers if m.signature.role == "progress" and m.index not in vote_lines
    ]
    completed = [m.index for m in reading.markers if m.signature.role == "completed"]
    recovered: dict[str, int] = {}
    for marker in reading.markers:
        if marker.signature.role == "recovered":
            recovered[marker.signature.category] = marker.index
    last: dict[str, int] = {}
    for vote in votes:
        if vote.weight >= SERIOUS or vote.category not in last:
            last[vote.category] = max(last.get(vote.category, -1), vote.line.index)
    survived: set[str] = set()
    for category, index in last.items():
        after = sum(1 for p in progress if p > index)
        # A model non-finite at its last logged step has not survived by finishing: it ran on to the end diverged.
        finished = any(c > index for c in completed) and (category != "numerical_divergence" or after > 0)
        if recovered.get(category, -1) > index:
            survived.add(category)
            explained.append(f"{_WORDING[category][0].lower()} cleared later in the log")
        elif after >= PROGRESS_TO_RESOLVE or finished:
            survived.add(category)
            explained.append(
                f"{_WORDING[category][0].lower()} followed by "
                + ("the job finishing" if finished else f"{after} progress lines")
            )
    return survived


# --- Xids and patterns across lines -----------------------------------------------------------------------


def _xid_votes(
    labels: Mapping[str, str],
    reading: Reading,
    tallies: dict[str, _Tally],
    explained: list[str],
) -> xids.XidVerdict | None:
    """Vote the Xids of labels and kernel lines; returns the Xid verdict (None without Xids)."""
    events = xids.xids_from_labels(labels)
    located: list[tuple[LogLine, xids.XidEvent]] = []
    for line, event in reading.xid_lines:
        # Xid 45 is the driver cleaning up after processes that were killed; with a stop in the log (kernel
        # lines and job lines are often collected in separate sections, in either order), that is the stop.
        if event.code == xids.PREEMPTIVE_CLEANUP_XID and reading.first("shutdown") is not None:
            explained.append("Xid 45 (preemptive cleanup) after the job was stopped")
            continue
        if event.xid_class not in _SEVERE_XID and (
            _survived(reading, line.index) or reading.first("completed")
        ):
            explained.append(f"Xid {event.code} ({event.xid_class}) and the job kept training or finished")
            continue
        events.append(event)
        located.append((line, event))
    verdict = xids.judge(events)
    if verdict is None:
        return None
    app_class = [(line, e) for line, e in located if e.xid_class == "restart_app"]
    if verdict.xid_class == "restart_app" and app_class:
        by_gpu = Counter(line.pci for line, _ in app_class)
        pids = {_pid(line.body) for line, _ in app_class}
        code = verdict.primary.code
        if len(by_gpu) == 1 and len(pids - {None}) >= 2:
            line = app_class[0][0]
            culprit: Culprit | None = Culprit(
                line.host, None, _gpu_of(line, reading, labels), (line.raw.strip(),)
            )
            tallies["gpu_hardware"].add_fact(
                f"Xid {code} {len(app_class)} times on PCI {line.pci} across {len(pids)} processes",
                XID_WEIGHT["contact_support"],
                f"Xid {code} repeats on one GPU across jobs: suspect the GPU, not the application",
                culprit,
            )
            return verdict
        if len(by_gpu) >= 2:
            tallies["application_error"].add_fact(
                f"Xid {code} on {len(by_gpu)} different GPUs",
                XID_WEIGHT["restart_app"] + 2,
                f"Xid {code} on many GPUs: the application, not one GPU",
            )
            return verdict
    if verdict.primary.code == xids.PREEMPTIVE_CLEANUP_XID or verdict.xid_class == "ignore":
        weight = XID_WEIGHT["ignore"]
    else:
        weight = XID_WEIGHT[verdict.xid_class]
    category = (
        "application_error" if verdict.xid_class == "restart_app" else _xid_category(verdict.primary.code)
    )
    primary_line = next((line for line, e in located if e == verdict.primary), None)
    culprit = None
    if primary_line is not None:
        culprit = Culprit(
            primary_line.host, None, _gpu_of(primary_line, reading, labels), (primary_line.raw.strip(),)
        )
    tallies[category].add_fact(
        None,
        weight,
        _xid_title(verdict.primary.code, labels),
        culprit,
    )
    return verdict


def _launcher_votes(reading: Reading, tallies: dict[str, _Tally]) -> None:
    """What the launcher saw a worker die of, as one vote per cause: a SIGKILL it did not send (the OOM killer, a
    lost node, an operator) explains the peers' lost connections and timeouts; a crash signal (SIGSEGV, SIGBUS...)
    is the program's. A SIGABRT counts as a crash only without a communication timeout: c10d's watchdog aborts
    the process when a collective times out."""
    timed_out = bool(reading.timeouts) or any(
        v.signature.description.startswith("collective") for v in reading.votes
    )
    for failure in reading.launcher.killed()[:1]:
        who = _who(failure, reading.launcher)
        if failure.signal_name == "SIGKILL":
            tallies["host_oom"].add_fact(f"torchrun: {who} was killed by SIGKILL", CAUSE_MIN, _KILLED_ONLY)
        elif failure.signal_name in launchers.CRASH_SIGNALS and not (
            failure.signal_name == "SIGABRT" and timed_out
        ):
            tallies["application_error"].add_fact(
                f"the launcher: {who} crashed ({failure.signal_name})",
                CAUSE_MIN,
                f"the process crashed ({failure.signal_name})",
            )


def _rank_of(failure: launchers.Failure, launcher: launchers.LauncherReading) -> int | None:
    """The failure's job rank where the launcher names it (torchrun's summary: ``rank : 1 (local_rank: 0)``; DeepSpeed's
    world info numbers each host's slots in order, so a local rank on a host it names is that host's first rank
    plus it); its local rank only where the launcher says the job has one node. With several, local rank 0 is on
    every node, and one agent's report is no sign of one node: while torchrun restarts, the failed node's agent has
    reported and the others have not yet."""
    if failure.rank is not None:
        return failure.rank
    if failure.local_rank is not None and failure.host in launcher.first_ranks:
        return (
            launcher.first_ranks[failure.host] + failure.local_rank
        )  # DeepSpeed: the host's first rank + its own
    return failure.local_rank if launcher.nodes == 1 else None


def _who(failure: launchers.Failure, launcher: launchers.LauncherReading) -> str:
    """The failed worker in words: its rank, else its node, else its local rank on a node the log does not name."""
    if (rank := _rank_of(failure, launcher)) is not None:
        return f"rank {rank}"
    if host := _host(failure):
        return f"a worker on {host}"
    if failure.local_rank is not None:
        return f"the worker of local rank {failure.local_rank} on a node the log does not name"
    return "a worker"


def _survived(reading: Reading, index: int) -> bool:
    """Whether the job finished, or made :data:`PROGRESS_TO_RESOLVE` progress lines, after line ``index``."""
    after = reading.after("progress", index)
    return len(after) >= PROGRESS_TO_RESOLVE or bool(reading.after("completed", index))


def _pattern_votes(
    reading: Reading,
    votes: list[Vote],
    shutdown: Any,
    tallies: dict[str, _Tally],
    lines: Sequence[str],
) -> None:
    """Votes from patterns across lines: SDC, exploding gradients, a gap before a time limit, stacks."""
    culprit: Culprit | None
    if sdc := _silent_corruption(reading, votes):
        culprit, fact = sdc
        tallies["gpu_hardware"].add_fact(
            fact,
            XID_WEIGHT["contact_support"],
            "NaN on the same GPU at different iterations: suspect silent data corruption",
            culprit,
        )
    if boom := exploding(reading.grad_norms):
        baseline, peak, line = boom
        tallies["numerical_divergence"].add_fact(
            f"gradient norm rose from {baseline:g} to {peak:g}",
            5.0,
            "exploding gradient norm",
        )
        tallies["numerical_divergence"].lines.setdefault(line.raw.strip(), None)
    if shutdown is not None and (gap := _progress_gap(reading, shutdown, lines)):
        tallies["hang"].add_fact(
            f"no training progress for {_duration(gap)} before: {shutdown.raw[:200]}",
            6.0,
            f"no progress for {_duration(gap)} before the job was stopped",
        )
    if any(line.startswith(("Thread ", "==> py-spy")) for line in lines):
        stack_verdict = stackdumps.judge(stackdumps.parse_dumps(lines))
        if stack_verdict is not None:
            culprit = None
            if stack_verdict.culprit is not None:
                c = stack_verdict.culprit
                rank = c.rank if c.rank is not None else (c.local_rank if reading.layout.one_node else None)
                culprit = Culprit(
                    c.node or (reading.rank_hosts.get(rank) if rank is not None else None),
                    rank,
                    reading.rank_gpus.get(rank) if rank is not None else None,
                    (c.describe(),),
                )
            tallies[stack_verdict.category].add_fact(
                "py-spy: " + stack_verdict.description,
                stack_verdict.weight,
                stack_verdict.description,
                culprit,
            )
            for item in stack_verdict.evidence:
                tallies[stack_verdict.category].facts.append("py-spy: " + item)
    if any(line.startswith("==> flight-recorder") for line in lines):
        recorded = flight.judge(flight.parse_dumps(lines), flight.silent_ranks(lines))
        if recorded is not None:
            culprit = None
            if len(recorded.missing) == 1:
                (rank,) = recorded.missing
                node = reading.rank_hosts.get(rank) or flight.nodes(lines).get(rank)
                culprit = Culprit(node, rank, reading.rank_gpus.get(rank), recorded.evidence)
            who = ", ".join(map(str, recorded.missing))
            tallies["hang"].add_fact(
                None,
                8.0,
                f"rank{'s' if len(recorded.missing) > 1 else ''} {who} never joined {recorded.collective} "
                "(Flight Recorder)",
                culprit,
            )
            tallies["hang"].facts.extend(recorded.evidence)


def _silent_corruption(reading: Reading, votes: list[Vote]) -> tuple[Culprit, str] | None:
    """NaN values from one rank (or one GPU) only, at two or more iterations or across a restart, in a job of
    several ranks: the same numbers on the other GPUs stayed finite, so suspect that GPU (silent data
    corruption), not the model. Rank 0 alone does not count unless the check is per rank (Megatron's "found
    NaN"): it is often the only rank that logs the loss, which is the same on every rank."""
    nan_votes = [
        v
        for v in votes
        if v.category == "numerical_divergence" and v.weight >= 5 and _NAN_VALUE.search(v.line.body)
    ]
    sources = {(v.line.rank, v.line.host) for v in nan_votes if v.line.rank is not None or v.line.host}
    if len(nan_votes) < 2 or len(sources) != 1:
        return None
    rank, host = next(iter(sources))
    if rank == 0 and not all("found NaN" in v.line.body or "found Inf" in v.line.body for v in nan_votes):
        return None
    hosts = set(reading.rank_hosts.values()) | {v.line.host for v in votes if v.line.host}
    several = bool(reading.ranks_seen - {rank} or rank or (reading.world_size or 1) > 1 or len(hosts) > 1)
    restarts = [r for r in reading.restarts if nan_votes[0].line.index < r < nan_votes[-1].line.index]
    iterations = sorted({i for i in map(iteration_of, (v.line for v in nan_votes)) if i is not None})
    if not several or not (restarts or len(iterations) >= 2):
        return None
    gpu = next((v.line.gpu for v in nan_votes if v.line.gpu), None)
    culprit = Culprit(
        host or (reading.rank_hosts.get(rank) if rank is not None else None),
        rank,
        gpu or (reading.rank_gpus.get(rank) if rank is not None else None),
        tuple(v.line.raw.strip() for v in nan_votes[:3]),
    )
    who = f"rank {rank}" if rank is not None else f"{host}"
    when = f"across {len(restarts)} restarts" if restarts else f"at iterations {iterations}"
    return culprit, f"NaN only on {who}, {len(nan_votes)} times {when}"


def _progress_gap(reading: Reading, shutdown: Any, lines: Sequence[str]) -> float | None:
    """Seconds between the last progress line and the stop, when that is a hang: over
    :data:`HANG_GAP_SECONDS` and over ten times the usual interval between progress lines."""
    before = [m for m in reading.markers if m.signature.role == "progress" and m.index < shutdown.index]
    if not before:
        return None
    last = parse_line(before[-1].index, lines[before[-1].index][:MAX_LINE_CHARS]).time
    # The stop that ended this run: the first of the stop lines after its last progress that tells the time.
    stops = [m for m in reading.markers if m.signature.role == "shutdown" and m.index > before[-1].index]
    stop_time = next((t for m in stops if (t := _stop_time(lines[m.index])) is not None), None)
    if last is None or stop_time is None:
        return None
    last, stop_time = _comparable(last, stop_time)
    if stop_time - last < HANG_GAP_SECONDS:
        return None
    recent = [parse_line(m.index, lines[m.index][:MAX_LINE_CHARS]).time for m in before[-50:]]
    times = [t for t in recent if t is not None]
    intervals = [b - a for a, b in itertools.pairwise(times) if b > a]
    usual = statistics.median(intervals) if intervals else 0.0
    gap = stop_time - last
    return gap if gap > 10 * usual else None


def _comparable(a: float, b: float) -> tuple[float, float]:
    """Two parsed times on one calendar: formats without a year (glog, syslog) parse into 2000, so a time
    with a year is moved to 2000 when the other has none."""
    if (a < _YEAR_2001) == (b < _YEAR_2001):
        return a, b

    def to_2000(t: float) -> float:
        moment = datetime.fromtimestamp(t, tz=UTC)
        return moment.replace(year=2000).timestamp() if t >= _YEAR_2001 else t

    return to_2000(a), to_2000(b)


def _stop_time(line: str) -> float | None:
    """When a stop line was written: its timestamp prefix, else Slurm's ``CANCELLED AT <time>``."""
    parsed = parse_line(0, line[:MAX_LINE_CHARS])
    return parsed.time if parsed.time is not None else _cancel_time(parsed.body)


def _cancel_time(body: str) -> float | None:
    marker = body.find("CANCELLED AT ")
    if marker < 0:
        return None
    return parse_line(0, body[marker + len("CANCELLED AT ") :]).time


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h {rest // 60:02d}m" if hours else f"{rest // 60}m"


def _pid(body: str) -> str | None:
    marker = body.find("pid=")
    if marker < 0:
        return None
    return body[marker + 4 :].split(",", 1)[0].strip() or None


# --- scoring ----------------------------------------------------------------------------------------------


def _xid_category(code: int) -> str:
    """NVLink Xids (74, 144-150) are their own category; every other Xid is GPU hardware."""
    return "nvlink" if xids.xid_class(code) == "nvlink" else "gpu_hardware"


def _discounted(
    raw: Mapping[str, float], tallies: Mapping[str, _Tally], reading: Reading
) -> dict[str, float]:
    """Scores with consequences of a decisive cause discounted (causes judged on raw scores).

    An application exception that precedes the first NCCL error is that error's cause: one rank's bug makes
    every peer's collective fail. NCCL errors that only say a peer went away ("remote process exited") are the
    consequence of whatever made it go (a crash, the OOM killer) whenever the log shows one."""
    scores = dict(raw)
    first_app = _first_specific(tallies["application_error"])
    first_nccl = min((v.line.index for v in tallies["nccl_network"].votes), default=None)
    app_first = first_app is not None and (first_nccl is None or first_app < first_nccl)
    nccl_votes = tallies["nccl_network"].votes
    peer_gone = bool(nccl_votes) and all(_PEER_GONE.search(v.line.body) for v in nccl_votes)
    # a named crash, not just a traceback
    crash_seen = first_app is not None or raw["host_oom"] >= SERIOUS or bool(reading.launcher.killed())
    for consequence, causes in _CAUSES.items():
        decisive = [cause for cause in causes if raw[cause] >= CAUSE_MIN]
        if consequence == "application_error" and decisive == ["nccl_network"] and (app_first or peer_gone):
            continue
        if decisive:
            scores[consequence] *= CONSEQUENCE_FACTOR
    if (app_first and raw["application_error"] >= CAUSE_MIN) or (peer_gone and crash_seen):
        scores["nccl_network"] *= CONSEQUENCE_FACTOR
    return scores


def _first_specific(tally: _Tally) -> int | None:
    """The line index of the first application error that names what went wrong (an exception type or a
    crash), not just that something did (a traceback header, an exit code)."""
    return min(
        (v.line.index for v in tally.votes if v.weight >= 3 and not _LAUNCHER_ERROR.search(v.line.body)),
        default=None,
    )


def _no_fault(
    reading: Reading,
    tallies: Mapping[str, _Tally],
    scores: Mapping[str, float],
    winner: str,
    confidence: float,
    explained: list[str],
    labels: Mapping[str, str],
) -> Diagnosis:
    """``benign`` when the run shows it is healthy or was stopped on purpose, else ``unknown``; either way
    the summary says what was seen."""
    shutdown = reading.first("shutdown")
    completed = reading.first("completed")
    progress = sum(1 for m in reading.markers if m.signature.role == "progress")
    seen = ""
    if scores[winner] > 0:
        seen = f" Weak evidence only: {tallies[winner].top} ({winner}, confidence {confidence:.2f})."
    evidence = [*tallies[winner].facts, *tallies[winner].lines] if scores[winner] > 0 else []
    quiet = not scores[winner]
    if shutdown is not None or completed is not None or explained or ((progress or reading.noise) and quiet):
        reasons = []
        if completed is not None:
            reasons.append("the job finished")
        if shutdown is not None:
            reasons.append(shutdown.signature.description)
        reasons.extend(explained)
        if not reasons and progress:
            reasons.append(f"training progressed ({progress} progress lines) with no failure signature")
        if not reasons:
            reasons.append(
                f"only known harmless messages ({reading.noise} lines: warnings, NCCL information)"
            )
        markers = [m.raw for m in (shutdown, completed) if m is not None]
        return Diagnosis(
            category=BENIGN,
            confidence=0.8 if (shutdown or completed or explained) else 0.6,
            summary="No fault to act on: " + "; ".join(dict.fromkeys(reasons)) + "." + seen,
            evidence=_evidence([*markers, *evidence]),
        )
    node = _node(labels)
    where = f" for {node}" if node else ""
    return Diagnosis(
        category=UNKNOWN,
        confidence=0.0,
        summary=f"No known failure signature{where} in the alert labels or the {reading.line_count} log lines "
        f"examined.{seen}",
        evidence=_evidence(evidence),
    )


# --- the culprit ------------------------------------------------------------------------------------------


def _culprit(category: str, tally: _Tally, reading: Reading) -> Culprit | None:
    """The rank, node and GPU the evidence for ``category`` points at (None when it points nowhere)."""
    culprit = _pointed_at(category, tally, reading)
    if (
        culprit is not None
        and culprit.node is None
        and culprit.rank is not None
        and culprit.rank not in reading.missing
    ):
        hosts = _hosts_named(reading)
        # A single-node job (or one node's log): that node. Not for a rank the others name as missing: the
        # host their lines name is theirs, and the missing rank may run on a node whose log this is not.
        if len(hosts) == 1:
            return Culprit(next(iter(hosts)), culprit.rank, culprit.gpu, culprit.evidence)
    return culprit


def _hosts_named(reading: Reading) -> set[str]:
    """Every host the log names: ranks' hosts, voting lines, kernel lines, torchrun's summary."""
    named = set(reading.rank_hosts.values())
    named.update(v.line.host for v in reading.votes if v.line.host)
    named.update(line.host for line, _ in reading.xid_lines if line.host)
    named.update(h for f in reading.launcher.failures if (h := _host(f)))
    return named


def _pointed_at(category: str, tally: _Tally, reading: Reading) -> Culprit | None:
    named = tally.culprit  # from the Xid verdict or a pattern across lines
    if named is not None and named.node and named.rank is None:
        named = Culprit(named.node, _rank_on(named.node, tally, reading), named.gpu, named.evidence)
    if named is not None and (named.node or named.rank is not None):
        return _completed(named, reading)
    hosts = {vote.line.host for vote in tally.votes if vote.line.host}
    if named is not None and named.gpu is not None:  # a kernel line without its host: the evidence's one host
        return Culprit(next(iter(hosts)) if len(hosts) == 1 else None, None, named.gpu, named.evidence)
    if category in ("nccl_network", "hang") and (odd := _odd_rank_out(reading)):
        return _completed(odd, reading)
    if category in _NO_NODE_AT_FAULT:
        return None
    if category in _SHARED_SERVICES and _several_reporters(tally.votes, reading):
        return None  # several ranks lost the same file system or endpoint: the service, not a node
    if category in _WORKER_DEATH and (worker := _failed_worker(reading)):
        return _completed(worker, reading)
    if category == "nccl_network" and (killed := _killed_node(reading)):
        return killed
    if category == "nccl_network" and len(reading.unreachable) == 1:
        ((host, line),) = reading.unreachable.items()
        return Culprit(
            host, None, None, (f"the ranks could not reach the rendezvous store on {host}", line.raw.strip())
        )
    for vote in sorted(tally.votes, key=lambda v: (-min(v.weight, 5), v.line.index)):
        line = vote.line
        if category == "nccl_network" and _VICTIM.search(line.body):
            continue  # the rank that reports a lost peer or a timeout is the one that waited, not the cause
        if line.rank is not None or line.host or line.pci:
            # Evidence of one category from a single host: that host, even on the lines naming only a rank.
            writer = line.host or (next(iter(hosts)) if len(hosts) == 1 else None)
            return _completed(Culprit(writer, line.rank, line.gpu, (line.raw.strip(),)), reading)
    if odd := _odd_rank_out(reading):  # a storage or GPU hang: the rank that reports nothing
        return _completed(odd, reading)
    root = reading.launcher.root()
    if root is not None and root.rank is not None and category not in ("nccl_network", "hang"):
        return _completed(Culprit(_host(root), root.rank, None, (root.text,)), reading)
    # Last resort: the log names one host in all (a single-node job, or one node's log).
    named_hosts = _hosts_named(reading)
    if len(named_hosts) == 1 and category not in ("nccl_network", "hang"):
        (host,) = named_hosts
        return Culprit(host, None, None, (f"every line that names a host names {host}",))
    return None


def _rank_on(node: str, tally: _Tally, reading: Reading) -> int | None:
    """The rank on ``node`` that a kernel line (which names the node, not the process) points at: the one rank there
    whose lines hold the same fault's evidence, else the launcher's first failed worker there (torchrun's root
    cause); None when the log does not single one out."""
    ranks = {
        v.line.rank
        for v in tally.votes
        if v.line.rank is not None and (v.line.host or reading.rank_hosts.get(v.line.rank)) == node
    }
    if len(ranks) == 1:
        return next(iter(ranks))
    root = reading.launcher.root()
    if not ranks and root is not None and _host(root) == node:
        return _rank_of(root, reading.launcher)
    return None


# Categories whose evidence names no node, whichever rank logged it. A model that diverges: the rank that logs the
# loss (often rank 0 only) or the first of the ranks that found NaN is no more at fault than the others (one rank's
# repeated NaN is the other verdict: silent data corruption, gpu_hardware, named by _silent_corruption). A checkpoint
# that does not load: every rank that reads it fails, on any node (the file is at fault, and the rollback fixes it).
_NO_NODE_AT_FAULT = frozenset({"numerical_divergence", "checkpoint_corrupt"})
# Services the nodes share: one node's failure to reach them names that node (a stale mount), several ranks'
# failure names the service (a full or failing file system, an object store timing out).
_SHARED_SERVICES = frozenset({"storage_io", "object_store_timeout"})
# Categories in which a worker's death, as torchrun reports it, names the culprit before any log line does.
_WORKER_DEATH = frozenset({"nccl_network", "hang", "host_oom", "application_error", "node_failure"})


def _failed_worker(reading: Reading) -> Culprit | None:
    """The worker torchrun's agent saw die of a signal it did not send (killed from outside or crashed), else
    the one that ignored its SIGTERM (stopped or stuck): the others' errors are the consequence."""
    agent = reading.launcher
    for failures, why in (
        (agent.killed(), "was killed by {signal}"),
        (agent.unresponsive(), "did not answer SIGTERM"),
    ):
        placed = [
            f
            for f in failures
            if (_rank_of(f, agent) is not None or _host(f)) and not _watchdog_abort(f, reading)
        ]
        if placed:
            first = placed[0]
            reason = (
                f"{_who(first, agent)} {why.format(signal=first.signal_name)} (the launcher: {first.text})"
            )
            return Culprit(_host(first), _rank_of(first, agent), None, (reason,))
    return None


def _watchdog_abort(failure: launchers.Failure, reading: Reading) -> bool:
    """Whether the worker is a rank that reported a collective timeout and then died of SIGABRT: c10d's watchdog
    takes its own process down after the timeout ("To avoid data inconsistency, we are taking the entire process
    down"). That rank waited for another; its abort is not the cause."""
    rank = _rank_of(failure, reading.launcher)
    return failure.signal_name == "SIGABRT" and rank is not None and rank in reading.timeouts


def _several_reporters(votes: Sequence[Vote], reading: Reading) -> bool:
    """Whether the evidence comes from more than one rank or more than one host (a node's own kernel lines and its
    rank's traceback are one reporter when nothing says they differ)."""
    ranks = {v.line.rank for v in votes if v.line.rank is not None}
    hosts = {
        host
        for v in votes
        if (host := v.line.host or (reading.rank_hosts.get(v.line.rank) if v.line.rank is not None else None))
    }
    return len(ranks) > 1 or len(hosts) > 1


def _killed_node(reading: Reading) -> Culprit | None:
    """The one node whose task srun saw killed by SIGKILL while the others' exited on their own: its processes
    died from outside (the node lost, the OOM killer), and the others' network errors are the consequence (a lost
    rendezvous store, a lost peer). None when more than one was killed (a cancel) or none exited."""
    if len(reading.srun_killed) != 1 or not reading.srun_exited - set(reading.srun_killed):
        return None
    ((host, line),) = reading.srun_killed.items()
    return Culprit(host, None, None, (f"srun: the task on {host} was killed (SIGKILL)", line.raw.strip()))


def _host(failure: launchers.Failure) -> str | None:
    """The host a failure names, unless it is torchrun --standalone's ``localhost``."""
    return failure.host if failure.host and failure.host != "localhost" else None


def _odd_rank_out(reading: Reading) -> Culprit | None:
    """In a collective timeout the stuck rank is the one that does not report it, or the one whose sequence
    number differs from everyone else's."""
    if len(reading.missing) == 1:  # the others name the one rank that did not arrive or publish
        ((rank, line),) = reading.missing.items()
        return Culprit(reading.rank_hosts.get(rank), rank, reading.rank_gpus.get(rank), (line.raw.strip(),))
    if len(reading.enqueued) >= 3:  # the rank that never enqueued the collective the others wait in
        (low, (count, line)), *rest = sorted(reading.enqueued.items(), key=lambda item: item[1][0])
        if count < min(other for _, (other, _) in rest):
            return Culprit(
                reading.rank_hosts.get(low),
                low,
                reading.rank_gpus.get(low),
                (
                    f"rank {low} last enqueued NCCL work {count}; every other rank got further",
                    line.raw.strip(),
                ),
            )
    timeouts = reading.timeouts
    if not timeouts or (len(timeouts) < 2 and not reading.world_size and len(reading.ranks_seen) < 2):
        return None
    highest = max(reading.ranks_seen | set(timeouts)) + 1
    # Without the world size in the log, the job has at least highest ranks, and usually a multiple of 8 (or
    # a power of two): the silent rank may be the last one.
    worlds = (
        [reading.world_size]
        if reading.world_size
        else [highest, -(-highest // 8) * 8, 1 << (highest - 1).bit_length()]
    )
    for world in dict.fromkeys(worlds):
        silent = sorted(set(range(world)) - set(timeouts))
        if len(silent) == 1 and len(timeouts) >= world - 1:
            rank = silent[0]
            return Culprit(
                reading.rank_hosts.get(rank),
                rank,
                reading.rank_gpus.get(rank),
                (f"ranks {_ranges(sorted(timeouts))} report the collective timeout; rank {rank} does not",),
            )
    seqs = Counter((seq, op) for seq, op, _ in timeouts.values())
    if len(seqs) > 1:
        (common, _), *_ = seqs.most_common(1)
        odd = [r for r, (seq, op, _) in timeouts.items() if (seq, op) != common]
        if len(odd) == 1:
            seq, op, line = timeouts[odd[0]]
            return Culprit(
                line.host or reading.rank_hosts.get(odd[0]),
                odd[0],
                reading.rank_gpus.get(odd[0]),
                (
                    f"rank {odd[0]} times out in {op} #{seq} while the others wait in #{common[0]}",
                    line.raw.strip(),
                ),
            )
    return None


def _completed(culprit: Culprit, reading: Reading) -> Culprit:
    """Fill in the node and GPU of a culprit rank from what the log says about that rank, and the rank of a culprit
    GPU from NCCL's rank table (the one rank on that node's GPU), where the table is of one communicator: a
    sub-communicator's (tensor parallel, pipeline) ranks are not the job's."""
    node, rank, gpu = culprit.node, culprit.rank, culprit.gpu
    if rank is not None:
        node = node or reading.rank_hosts.get(rank)
        gpu = gpu or reading.rank_gpus.get(rank)
    elif node is not None and gpu is not None and len(reading.comm_sizes) == 1:
        on_gpu = [
            r for r, host in reading.rank_hosts.items() if host == node and reading.rank_gpus.get(r) == gpu
        ]
        rank = on_gpu[0] if len(on_gpu) == 1 else None
    return Culprit(node, rank, gpu, culprit.evidence)


def _gpu_of(line: LogLine, reading: Reading, labels: Mapping[str, str]) -> str | None:
    """The GPU index of a kernel line's PCI address: from NCCL's rank table, else from the alert's
    ``pci_bus_id``/``gpu`` labels when they name the same device."""
    if line.pci is None:
        return line.gpu
    for (host, pci), gpu in reading.pci_gpus.items():
        if pci == line.pci and (host is None or line.host is None or host == line.host):
            return gpu
    bus = labels.get("pci_bus_id") or labels.get("PCI_BUS_ID")
    if bus and labels.get("gpu") and normalise_pci(bus) == line.pci:
        return labels["gpu"]
    return None


def _ranges(ranks: list[int]) -> str:
    """``0-2,4-7``: a compact list of rank numbers."""
    parts: list[str] = []
    start = prev = None
    for rank in ranks:
        if prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = rank
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


# --- wording ----------------------------------------------------------------------------------------------


def _evidence(items: list[str]) -> tuple[str, ...]:
    """De-duplicated, bounded evidence, first occurrences first."""
    bounded = (
        item if len(item) <= MAX_EVIDENCE_CHARS else item[: MAX_EVIDENCE_CHARS - 1] + "…" for item in items
    )
    return tuple(dict.fromkeys(bounded))[:MAX_EVIDENCE]


def _same_host(a: str, b: str) -> bool:
    """``gpu-node07`` and ``gpu-node07.cluster.local`` are one host."""
    return a.split(".")[0].lower() == b.split(".")[0].lower()


def _node(labels: Mapping[str, str]) -> str | None:
    return next((labels[name] for name in _NODE_LABELS if labels.get(name)), None)


def _summary(
    category: str,
    tally: _Tally,
    verdict: xids.XidVerdict | None,
    labels: Mapping[str, str],
    culprit: Culprit | None,
    killed_only: bool = False,
) -> str:
    """One sentence: what failed, where, and what to do."""
    node = _node(labels)
    elsewhere = (
        culprit is not None
        and culprit.node is not None
        and node is not None
        and not _same_host(culprit.node, node)
    )
    # Only a launcher's word that a worker was killed, placed on no node: the alert's node is where the alert came
    # from (a peer's error), not where the worker died.
    unplaced = killed_only and culprit is None
    where_node = (
        culprit.node if elsewhere and culprit is not None else node or (culprit.node if culprit else None)
    )
    if unplaced:
        where_node = None
    if verdict is not None and tally.top == _xid_title(verdict.primary.code, labels):
        text = _xid_summary(verdict, labels, where_node, culprit)
    else:
        title, advice = _KILLED_WORDING if killed_only else _WORDING[category]
        where = f" on {where_node}" if where_node else ""
        what = tally.top or "signature matched"
        count = (
            f" ({len(tally.lines)} matching log line{'s' if len(tally.lines) != 1 else ''})"
            if tally.lines
            else ""
        )
        who = f"; culprit {culprit.describe()}" if culprit is not None and culprit.describe() else ""
        text = f"{title}{where}: {what}{count}{who}; {advice}."
    if elsewhere:
        text += f" The alert came from {node}; the log points at {culprit.node}."  # type: ignore[union-attr]
    elif unplaced and node:
        text += f" The alert came from {node}; the log does not say which node the worker was killed on."
    return text


def _xid_summary(
    verdict: xids.XidVerdict, labels: Mapping[str, str], node: str | None, culprit: Culprit | None
) -> str:
    primary = verdict.primary
    place = (
        [f"rank {culprit.rank} on {node}" if node else f"rank {culprit.rank}"]
        if culprit and culprit.rank is not None
        else []
    )
    place = place or ([node] if node else [])
    if culprit is not None and culprit.gpu is not None:
        place.append(f"GPU {culprit.gpu}")
        if primary.pci:
            place.append(f"(PCI {primary.pci})")
    elif primary.pci:
        place.append(f"PCI {primary.pci}")
    elif labels.get("gpu"):
        place.append(f"GPU {labels['gpu']}")
    where = f" on {' '.join(place)}" if place else ""
    info = xids.xid_info(primary.code)
    if verdict.xid_class in _XID_ACTION:
        action = _XID_ACTION[verdict.xid_class]
    elif info is not None:
        action = f"follow NVIDIA's {info.immediate_action} guidance"
    else:
        action = "not in NVIDIA's Xid catalogue; investigate"
    recovery = f" (driver recovery action: {verdict.recovery})" if verdict.recovery else ""
    return f"Xid {primary.code} ({_xid_description(primary.code, labels)}){where}: {action}{recovery}."


def _xid_title(code: int, labels: Mapping[str, str]) -> str:
    return f"Xid {code} ({_xid_description(code, labels)})"


def _xid_description(code: int, labels: Mapping[str, str]) -> str:
    """DCGM's ``err_msg`` text when the alert carries it for this code, else the catalogue mnemonic."""
    if labels.get("err_code") == str(code) and labels.get("err_msg"):
        return labels["err_msg"]
    info = xids.xid_info(code)
    return info.mnemonic if info else "unknown Xid"
