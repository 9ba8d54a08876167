"""NVIDIA Xid errors: the packaged catalogue, our action classes, and Xids found in labels and kernel logs.

Pure: the only file read is the packaged ``xid_catalog.csv`` (a copy of NVIDIA's Xid catalogue, Ampere and
newer), loaded once per process. Nothing here decides the diagnosis category; :mod:`app.domain.diagnosis` does.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources

# Our classes, least to most severe: when several Xids appear, the most severe one says what to do.
# contact_support and other rank above restart_app because they name hardware or firmware that a job restart
# does not fix; they rank below the explicit GPU/node workflows because those are actionable.
SEVERITY: tuple[str, ...] = (
    "ignore",
    "restart_app",
    "other",
    "contact_support",
    "nvlink",
    "reset_gpu",
    "reboot",
)
XID_CLASSES = frozenset(SEVERITY)

# The catalogue's "Resolution Bucket (Immediate Action)" → our class; anything unlisted is "other".
_IMMEDIATE_ACTION_CLASS = {
    "RESTART_APP": "restart_app",
    "RESET_GPU": "reset_gpu",
    "RESTART_BM": "reboot",
    "IGNORE": "ignore",
    "WORKFLOW_NVLINK_ERR": "nvlink",
    "WORKFLOW_NVLINK5_ERR": "nvlink",
    "WORKFLOW_XID_48": "reset_gpu",  # solo: RESET_GPU; with 63/64: drain and reset
    "CONTACT_SUPPORT": "contact_support",
    "": "contact_support",  # blank rows: newest codes NVIDIA has not bucketed yet
}

# Xid 154 names the driver's recovery action (NVML_GPU_RECOVERY_ACTION_*); it can raise the other Xid's class.
_RECOVERY_ACTION_CLASS = {
    "none": "ignore",
    "gpu reset required": "reset_gpu",
    "drain and reset": "reset_gpu",
    "node reboot required": "reboot",
    "drain p2p": "other",
}

# Kernel log line (tech.md §3), old drivers without "PCI:" included.
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+),")
_RECOVERY_CHANGE = re.compile(
    r"recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x[0-9a-fA-F]+ \((?P<to>[^)]*)\)"
)
_XID_LABELS = ("xid", "err_code")  # DCGM_EXP_XID_ERRORS_COUNT{xid=...}, DCGM_FI_DEV_XID_ERRORS{err_code=...}

RECOVERY_XID = 154  # "GPU Recovery Action Changed": informational about another Xid
PREEMPTIVE_CLEANUP_XID = 45  # with another Xid, follow the other one


@dataclass(frozen=True)
class XidInfo:
    """One catalogue row."""

    code: int
    mnemonic: str
    immediate_action: str
    investigatory_action: str


@dataclass(frozen=True)
class XidEvent:
    """One Xid seen in a label or a log line.

    ``evidence`` is the label fact (``label xid=79``) or the stripped log line; ``pci`` the bus id of the
    log line; ``recovery`` the driver's recommended action from an Xid 154 line (``Node Reboot Required``).
    """

    code: int
    evidence: str
    pci: str | None = None
    recovery: str | None = None

    @property
    def xid_class(self) -> str:
        """Our class: an Xid 154 line's recommendation when it names one, else the catalogue's bucket."""
        if self.recovery is not None:
            return _RECOVERY_ACTION_CLASS.get(self.recovery.strip().lower(), "other")
        return xid_class(self.code)


@dataclass(frozen=True)
class XidVerdict:
    """What Xid events amount to: the Xid to report, the class to act on, every event as evidence."""

    primary: XidEvent
    xid_class: str
    recovery: str | None  # the Xid 154 recommendation that set the class, if one did
    events: tuple[XidEvent, ...]


def _parse_catalogue(text: str) -> dict[int, XidInfo]:
    """Rows of the catalogue CSV by code; the csv module handles the quoted multi-line mnemonic of Xid 13."""
    rows: dict[int, XidInfo] = {}
    for row in csv.DictReader(io.StringIO(text, newline="")):
        code = int(row["code"])
        rows[code] = XidInfo(
            code=code,
            mnemonic=" ".join(row["mnemonic"].split()),
            immediate_action=row["immediate_action"].strip(),
            investigatory_action=row["investigatory_action"].strip(),
        )
    return rows


@functools.cache
def catalogue() -> Mapping[int, XidInfo]:
    """The packaged NVIDIA Xid catalogue, read once per process."""
    text = resources.files(__package__).joinpath("xid_catalog.csv").read_text(encoding="utf-8")
    return _parse_catalogue(text)


def xid_info(code: int) -> XidInfo | None:
    """The catalogue row of ``code``, or None for a code NVIDIA does not list."""
    return catalogue().get(code)


def xid_class(code: int) -> str:
    """Our action class of ``code`` from its immediate action; unknown codes are ``other``."""
    info = xid_info(code)
    if info is None:
        return "other"
    return _IMMEDIATE_ACTION_CLASS.get(info.immediate_action, "other")


def severity(cls: str) -> int:
    """Rank of a class in :data:`SEVERITY` (higher is more severe)."""
    return SEVERITY.index(cls)


def xids_from_labels(labels: Mapping[str, str]) -> list[XidEvent]:
    """Xids named by the ``xid`` / ``err_code`` labels; non-numbers and DCGM's ``0`` (no Xid) are skipped."""
    events = []
    for name in _XID_LABELS:
        value = labels.get(name, "").strip()
        if value.isdecimal() and 0 < int(value) < 100_000:
            events.append(XidEvent(code=int(value), evidence=f"label {name}={value}"))
    return events


def xid_from_line(line: str) -> XidEvent | None:
    """The Xid of one kernel log line (``NVRM: Xid (PCI:…): 79, …``), or None if the line is not one."""
    match = XID_LINE.search(line)
    if match is None:
        return None
    code = int(match["xid"])
    recovery = None
    if code == RECOVERY_XID and (change := _RECOVERY_CHANGE.search(line, match.end())):
        recovery = change["to"]
    return XidEvent(code=code, evidence=line.strip(), pci=match["pci"], recovery=recovery)


def judge(events: Iterable[XidEvent]) -> XidVerdict | None:
    """Reduce Xid events to one verdict; None when there are none.

    The reported Xid is the most severe fault (first seen on ties). Xid 45 yields to any other Xid, and Xid
    154 only reports itself when alone: it is guidance about another Xid, so its recommendation sets the class
    when it is more severe than the fault's own bucket.
    """
    ordered = tuple(dict.fromkeys(events))  # de-duplicate, keep first occurrences
    if not ordered:
        return None
    faults = [e for e in ordered if e.code != RECOVERY_XID] or list(ordered)
    if any(e.code != PREEMPTIVE_CLEANUP_XID for e in faults):
        faults = [e for e in faults if e.code != PREEMPTIVE_CLEANUP_XID]
    primary = max(faults, key=lambda e: severity(e.xid_class))  # max keeps the first of equals
    cls, recovery = primary.xid_class, primary.recovery
    for event in ordered:
        if event.recovery is not None and severity(event.xid_class) > severity(cls):
            cls, recovery = event.xid_class, event.recovery
    return XidVerdict(primary=primary, xid_class=cls, recovery=recovery, events=ordered)
