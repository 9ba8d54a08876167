"""Root-cause diagnosis: alert labels and log text in, one :class:`Diagnosis` out.

Pure: no network, store or clock; the only files read are the packaged catalogues (loaded once). Work is
bounded: at most the last :data:`MAX_LOG_CHARS` characters and :data:`MAX_LINES` lines are examined, each line
only up to :data:`MAX_LINE_CHARS`.

How a verdict is reached:
1. Each log line votes for its heaviest matching signature (``signatures.yaml``); a distinct line votes once,
   and a category's line votes are capped so a flood of one repeated error cannot drown everything else.
2. Label signatures (``alertname``, ``error_class``) add their weights; Xids from labels and kernel lines add
   one weight for the verdict of :func:`app.diagnosis.xid.judge`, by its class (a node reboot outweighs
   everything, a restart-the-app Xid barely counts).
3. Consequences are discounted: when a cause category has decisive evidence, the errors it usually drags
   along (a Python traceback, NCCL errors on the peers of a dead rank, NaNs from ECC corruption, a truncated
   checkpoint after a full disk) count for a quarter, so the specific cause wins.
4. Confidence grows with the winning score and its margin over the runner-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.diagnosis import xid as xids
from app.diagnosis.signatures import CATEGORIES, UNKNOWN, Signature, SignatureCatalogue, load_catalogue

__all__ = ["CATEGORIES", "UNKNOWN", "Diagnosis", "SignatureCatalogue", "diagnose", "load_catalogue"]

MAX_LOG_CHARS = 2 * 1024 * 1024
MAX_LINES = 20_000
MAX_LINE_CHARS = 4096  # a pathological multi-megabyte "line" is matched on its head only
MAX_EVIDENCE = 20
MAX_EVIDENCE_CHARS = 500

LINE_SCORE_CAP = 10.0  # per category: two decisive lines' worth
CAUSE_MIN = 5.0  # a category this strong is a cause whose consequences get discounted
CONSEQUENCE_FACTOR = 0.25
SOFT_XID_PENALTY = 0.75  # an application error next to an app-class Xid may still be a (rare) hardware fault
CONFIDENCE_SCALE = 5.0  # score at which strength reaches 1 - 1/e

# Weight of the Xid verdict, by class: hardware Xids must beat a capped flood of consequent NCCL errors;
# app-class Xids are too weak to be a cause, so an application traceback next to them still wins.
XID_WEIGHT = {
    "reboot": 12.0,
    "reset_gpu": 10.0,
    "nvlink": 10.0,
    "contact_support": 8.0,
    "other": 4.0,
    "restart_app": 1.0,
    "ignore": 0.5,
}
_SOFT_XID_CLASSES = frozenset({"restart_app", "ignore"})

# consequence -> the categories that typically cause it
_CAUSES: dict[str, frozenset[str]] = {
    "application_error": frozenset(CATEGORIES) - {"application_error"},
    "nccl_network": frozenset(CATEGORIES) - {"nccl_network", "application_error"},
    "numerical_divergence": frozenset({"gpu_hardware", "nvlink"}),
    "checkpoint_corrupt": frozenset({"storage_io", "object_store_timeout"}),
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
    "numerical_divergence": (
        "Numerical divergence",
        "roll back to an earlier checkpoint and lower the learning rate",
    ),
    "application_error": (
        "Application error",
        "fix the code or configuration; a restart alone will not help",
    ),
}

_NODE_LABELS = ("Hostname", "node", "nodename", "host")


@dataclass(frozen=True)
class Diagnosis:
    """The root cause of an incident, as far as labels and logs tell.

    ``category`` is one of :data:`CATEGORIES` or ``unknown``; ``confidence`` is in [0, 1] (0 for unknown);
    ``evidence`` holds the supporting label facts and log lines (at most 20, each at most 500 characters);
    ``xid``/``xid_class`` are set whenever an Xid was seen (class: see :data:`app.diagnosis.xid.SEVERITY`).
    """

    category: str
    confidence: float
    summary: str
    evidence: tuple[str, ...] = ()
    xid: int | None = None
    xid_class: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, for the ledger and the API."""
        return {
            "category": self.category,
            "confidence": self.confidence,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "xid": self.xid,
            "xid_class": self.xid_class,
        }


@dataclass
class _Tally:
    """Votes for one category."""

    line_score: float = 0.0
    other_score: float = 0.0  # labels and Xids: few, so uncapped
    facts: list[str] = field(default_factory=list)  # label facts
    lines: dict[str, None] = field(default_factory=dict)  # distinct matching lines, first occurrences
    top: Signature | None = None  # heaviest signature seen, first on ties

    @property
    def raw(self) -> float:
        return min(self.line_score, LINE_SCORE_CAP) + self.other_score

    def vote(self, signature: Signature) -> None:
        if self.top is None or signature.weight > self.top.weight:
            self.top = signature


def diagnose(
    labels: Mapping[str, str], logs: str = "", catalogue: SignatureCatalogue | None = None
) -> Diagnosis:
    """Diagnose one incident from its alert ``labels`` and ``logs`` (job output, kernel messages, in any mix).

    ``catalogue`` defaults to the packaged signatures. Never raises on odd input; nothing recognised gives
    category ``unknown`` with confidence 0.
    """
    if catalogue is None:
        catalogue = load_catalogue()
    lines = tail_lines(logs)
    tallies = {category: _Tally() for category in CATEGORIES}

    events = xids.xids_from_labels(labels)
    for line in lines:
        probe = line[:MAX_LINE_CHARS]
        if event := xids.xid_from_line(probe):
            events.append(event)
        elif signature := catalogue.match_line(probe):
            tally = tallies[signature.category]
            text = line.strip()
            if text not in tally.lines:  # a distinct line votes once
                tally.lines[text] = None
                tally.line_score += signature.weight
                tally.vote(signature)
    for signature, fact in catalogue.match_labels(labels):
        tally = tallies[signature.category]
        tally.other_score += signature.weight
        tally.facts.append(fact)
        tally.vote(signature)
    verdict = xids.judge(events)
    if verdict is not None:
        tallies[_xid_category(verdict.primary.code)].other_score += XID_WEIGHT[verdict.xid_class]

    scores = _discounted({category: tally.raw for category, tally in tallies.items()})
    ranked = sorted(CATEGORIES, key=lambda c: -scores[c])  # stable: catalogue order breaks ties
    winner, runner_up = ranked[0], ranked[1]
    best = scores[winner]
    if best <= 0:
        return Diagnosis(
            category=UNKNOWN,
            confidence=0.0,
            summary=f"No known failure signature in the alert labels or the {len(lines)} log lines examined.",
        )

    confidence = (1 - math.exp(-best / CONFIDENCE_SCALE)) * (0.5 + 0.5 * (best - scores[runner_up]) / best)
    if winner == "application_error" and verdict is not None and verdict.xid_class in _SOFT_XID_CLASSES:
        confidence *= SOFT_XID_PENALTY
    tally = tallies[winner]
    xid_evidence = [event.evidence for event in verdict.events] if verdict else []
    return Diagnosis(
        category=winner,
        confidence=round(confidence, 2),
        summary=_summary(winner, tally, verdict, labels),
        evidence=_evidence([*tally.facts, *xid_evidence, *tally.lines]),
        xid=verdict.primary.code if verdict else None,
        xid_class=verdict.xid_class if verdict else None,
    )


def tail_lines(logs: str) -> list[str]:
    """The last :data:`MAX_LINES` lines of the last :data:`MAX_LOG_CHARS` characters: what diagnosis reads."""
    if len(logs) > MAX_LOG_CHARS:
        logs = logs[-MAX_LOG_CHARS:]
        logs = logs[logs.find("\n") + 1 :]  # drop the cut-off partial first line
    return logs.splitlines()[-MAX_LINES:]


def _xid_category(code: int) -> str:
    """NVLink Xids (74, 144-150) are their own category; every other Xid is GPU hardware."""
    return "nvlink" if xids.xid_class(code) == "nvlink" else "gpu_hardware"


def _discounted(raw: Mapping[str, float]) -> dict[str, float]:
    """Scores with consequences of a decisive cause discounted (causes judged on raw scores)."""
    scores = dict(raw)
    for consequence, causes in _CAUSES.items():
        if any(raw[cause] >= CAUSE_MIN for cause in causes):
            scores[consequence] *= CONSEQUENCE_FACTOR
    return scores


def _evidence(items: list[str]) -> tuple[str, ...]:
    """De-duplicated, bounded evidence, first occurrences first."""
    bounded = (
        item if len(item) <= MAX_EVIDENCE_CHARS else item[: MAX_EVIDENCE_CHARS - 1] + "…" for item in items
    )
    return tuple(dict.fromkeys(bounded))[:MAX_EVIDENCE]


def _node(labels: Mapping[str, str]) -> str | None:
    return next((labels[name] for name in _NODE_LABELS if labels.get(name)), None)


def _summary(category: str, tally: _Tally, verdict: xids.XidVerdict | None, labels: Mapping[str, str]) -> str:
    """One sentence: what failed, where, and what to do."""
    node = _node(labels)
    if verdict is not None and category == _xid_category(verdict.primary.code):
        return _xid_summary(verdict, labels, node)
    title, advice = _WORDING[category]
    where = f" on {node}" if node else ""
    what = tally.top.description if tally.top else "signature matched"
    count = (
        f" ({len(tally.lines)} matching log line{'s' if len(tally.lines) != 1 else ''})"
        if tally.lines
        else ""
    )
    if category == "application_error" and verdict is not None and verdict.xid_class in _SOFT_XID_CLASSES:
        code = verdict.primary.code
        advice += f"; Xid {code} ({_xid_description(code, labels)}) points the same way"
    return f"{title}{where}: {what}{count}; {advice}."


def _xid_summary(verdict: xids.XidVerdict, labels: Mapping[str, str], node: str | None) -> str:
    primary = verdict.primary
    place = [node] if node else []
    if primary.pci:
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


def _xid_description(code: int, labels: Mapping[str, str]) -> str:
    """DCGM's ``err_msg`` text when the alert carries it for this code, else the catalogue mnemonic."""
    if labels.get("err_code") == str(code) and labels.get("err_msg"):
        return labels["err_msg"]
    info = xids.xid_info(code)
    return info.mnemonic if info else "unknown Xid"
