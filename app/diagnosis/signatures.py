"""The signature catalogue: regular expressions over log lines and alert labels, each voting for a category.

The catalogue is data (``signatures.yaml``, packaged); this module loads and validates it and matches lines
and labels. A signature is ``{category, pattern, weight, description}`` and applies to each log line, or, with
``label: <name>``, to the value of that alert label. Its optional ``role`` says what a match means (see
:data:`ROLES`): evidence of a fault (``cause``, the default), or one of the markers that keep a healthy run
quiet. Loading reports every mistake as ``file:line: message`` in a :class:`~app.errors.ConfigError`. No I/O
beyond reading the catalogue file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from app.errors import ConfigError

# Every fault category a signature may vote for. "benign" (a verdict that there is nothing to act on) and
# "unknown" (not enough evidence either way) are verdicts, never votes of a cause signature.
CATEGORIES: tuple[str, ...] = (
    "gpu_hardware",
    "nvlink",
    "nccl_network",
    "storage_io",
    "object_store_timeout",
    "checkpoint_corrupt",
    "cuda_oom",
    "host_oom",
    "node_failure",
    "numerical_divergence",
    "hang",
    "application_error",
)
BENIGN = "benign"
UNKNOWN = "unknown"
MAX_WEIGHT = 20.0

# What a match means:
# - cause: evidence for ``category`` with ``weight``;
# - noise: known harmless chatter (NCCL async GID events, deprecation warnings, fp16 overflow skips); the line
#   votes for nothing, whatever else it matches;
# - shutdown: the job was stopped from outside (scancel, time limit, SIGTERM): the tracebacks, NCCL errors and
#   Xid 45 that follow are shutdown noise;
# - completed: the job finished normally;
# - progress: a training progress line (step, loss); progress after an error means it was survived;
# - recovered: the condition of ``category`` cleared (``nfs: server X OK``), cancelling earlier votes for it.
ROLES: tuple[str, ...] = ("cause", "noise", "shutdown", "completed", "progress", "recovered")
MARKER_ROLES = frozenset({"shutdown", "completed", "progress"})  # category: benign

_REQUIRED = ("category", "pattern", "weight", "description")
_OPTIONAL = ("label", "role")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Signature:
    """One catalogue entry. ``label`` is None for a log-line signature, else the alert label it reads."""

    category: str
    regex: re.Pattern[str]
    weight: float
    description: str
    label: str | None = None
    role: str = "cause"


@dataclass(frozen=True)
class LineMatch:
    """What one line is: its heaviest cause signature and its marker (noise, shutdown, progress...), if any."""

    cause: Signature | None
    marker: Signature | None


_NO_MATCH = LineMatch(None, None)


@dataclass(frozen=True)
class SignatureCatalogue:
    """Validated signatures, split by what they read, in catalogue order."""

    line_signatures: tuple[Signature, ...]
    label_signatures: tuple[Signature, ...]

    @functools.cached_property
    def _prefilter(self) -> re.Pattern[str]:
        """One alternation of every line pattern: most lines of a healthy log match none, and one search of
        this is far cheaper than one search per signature."""
        return re.compile("|".join(f"(?:{_scoped(s.regex.pattern)})" for s in self.line_signatures))

    def classify(self, line: str) -> LineMatch:
        """The heaviest cause signature matching ``line`` (first in catalogue order on ties) and its first
        marker. A noise marker silences the line: it then has no cause."""
        if not self.line_signatures or not self._prefilter.search(line):
            return _NO_MATCH
        cause: Signature | None = None
        marker: Signature | None = None
        for signature in self.line_signatures:
            if signature.role == "cause":
                if (cause is None or signature.weight > cause.weight) and signature.regex.search(line):
                    cause = signature
            elif marker is None and signature.regex.search(line):
                marker = signature
        if marker is not None and marker.role == "noise":
            return LineMatch(None, marker)
        return LineMatch(cause, marker)

    def match_line(self, line: str) -> Signature | None:
        """The heaviest cause signature matching ``line``, or None (a noise line has none).

        A line votes once: ``RuntimeError: CUDA out of memory`` is OOM evidence, not also a generic exception.
        """
        return self.classify(line).cause

    def match_labels(self, labels: Mapping[str, str]) -> Iterator[tuple[Signature, str]]:
        """Each label signature whose label is present and matches, with its ``label name=value`` fact."""
        for signature in self.label_signatures:
            assert signature.label is not None  # label_signatures holds only label signatures
            value = labels.get(signature.label)
            if value is not None and signature.regex.search(value):
                yield signature, f"label {signature.label}={value}"


def load_catalogue(path: Path | None = None) -> SignatureCatalogue:
    """Load and validate a signature catalogue; ``None`` means the packaged ``signatures.yaml`` (loaded once).

    Raises :class:`ConfigError` naming ``file:line`` for unreadable files, YAML errors, unknown or missing
    keys, unknown categories, bad weights and invalid or match-everything regular expressions.
    """
    if path is None:
        return _packaged_catalogue()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read signature catalogue: {exc.strerror or exc}") from exc
    return parse_catalogue(text, str(path))


@functools.cache
def _packaged_catalogue() -> SignatureCatalogue:
    text = resources.files(__package__).joinpath("signatures.yaml").read_text(encoding="utf-8")
    return parse_catalogue(text, "signatures.yaml")


def parse_catalogue(text: str, source: str) -> SignatureCatalogue:
    """Validate catalogue YAML ``text``; ``source`` names it in error messages."""
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # the same document again, for line numbers
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    if not isinstance(data, list) or not isinstance(root, yaml.SequenceNode):
        raise ConfigError(f"{source}:1: the catalogue must be a list of signatures")
    signatures = [
        _parse_entry(entry, node, source, index)
        for index, (entry, node) in enumerate(zip(data, root.value, strict=True), start=1)
    ]
    return SignatureCatalogue(
        line_signatures=tuple(s for s in signatures if s.label is None),
        label_signatures=tuple(s for s in signatures if s.label is not None),
    )


def _parse_entry(entry: Any, node: yaml.Node, source: str, index: int) -> Signature:
    """One entry, validated field by field; errors point at the offending key's line."""
    where = f"{source}:{node.start_mark.line + 1}"
    if not isinstance(entry, dict) or not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where}: signature #{index} must be a mapping")
    key_lines = {key.value: f"{source}:{key.start_mark.line + 1}" for key, _ in node.value}

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{key_lines.get(key, where)}: signature #{index}: {message}")

    for key in entry:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise fail(key, f"unknown key {key!r}")
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise ConfigError(f"{where}: signature #{index}: missing {', '.join(missing)}")

    role = entry.get("role", "cause")
    if role not in ROLES:
        raise fail("role", f"unknown role {role!r} (one of {', '.join(ROLES)})")
    category = entry["category"]
    allowed = (BENIGN,) if role in MARKER_ROLES or role == "noise" else CATEGORIES
    if category not in allowed:
        raise fail("category", f"unknown category {category!r} for role {role} (one of {', '.join(allowed)})")
    if role != "cause" and "label" in entry:
        raise fail("role", "label signatures are always causes")
    weight = entry["weight"]
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= MAX_WEIGHT:
        raise fail("weight", f"weight must be a number in (0, {MAX_WEIGHT:g}]")
    description = entry["description"]
    if not isinstance(description, str) or not description.strip():
        raise fail("description", "description must be non-empty text")
    label = entry.get("label")
    if label is not None and (not isinstance(label, str) or not _LABEL_NAME.fullmatch(label)):
        raise fail("label", f"label must be a label name, not {label!r}")
    pattern = entry["pattern"]
    if not isinstance(pattern, str) or not pattern:
        raise fail("pattern", "pattern must be a non-empty string")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise fail("pattern", f"invalid regex {pattern!r}: {exc}") from exc
    if regex.search(""):
        raise fail("pattern", f"regex {pattern!r} matches the empty string, so it would match everything")
    return Signature(
        category=category,
        regex=regex,
        weight=float(weight),
        description=description.strip(),
        label=label,
        role=role,
    )


def _scoped(pattern: str) -> str:
    """``pattern`` with leading global flags (``(?i)``) turned into a scoped group, so it can sit in an
    alternation."""
    if match := re.match(r"\(\?([aiLmsux]+)\)", pattern):
        return f"(?{match.group(1)}:{pattern[match.end() :]})"
    return pattern
