"""The signature catalogue: regular expressions over log lines and alert labels, each voting for a category.

The catalogue is data (``signatures.yaml``, packaged); this module loads and validates it and matches lines
and labels. A signature is ``{category, pattern, weight, description}`` and applies to each log line, or, with
``label: <name>``, to the value of that alert label. Its optional ``role`` says what a match means (see
:data:`ROLES`): evidence of a fault (``cause``, the default), or one of the markers that keep a healthy run
quiet. Loading reports every mistake as ``file:line: message`` in a :class:`~app.domain.errors.ConfigError`. No I/O
beyond reading the catalogue file.
"""

from __future__ import annotations

import functools
import re
import re._constants as sre_constants  # the regex parser's node types, for required_literals
import re._parser as sre_parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from app.domain.errors import ConfigError

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
    # Lower-case strings one of which every match contains (None: unknown): a line holding none of them is not
    # searched at all, which is what keeps a 20,000-line log cheap.
    literals: tuple[str, ...] | None = None


@dataclass(frozen=True)
class LineMatch:
    """What one line is: its heaviest cause signature and its marker (noise, shutdown, progress...), if any."""

    cause: Signature | None
    marker: Signature | None


_NO_MATCH = LineMatch(None, None)


class _Ordered:
    """Signatures in a fixed order, found by their required literals first: one pass of substring checks over
    every literal of the group tells which few regular expressions can match a line at all."""

    def __init__(self, signatures: list[Signature]):
        self.signatures = signatures
        self.always = [i for i, s in enumerate(signatures) if s.literals is None]
        owners: dict[str, list[int]] = {}
        for i, signature in enumerate(signatures):
            for literal in signature.literals or ():
                owners.setdefault(literal, []).append(i)
        self.owners = owners

    def first(self, line: str, lowered: str) -> Signature | None:
        """The first signature (in order) whose pattern matches ``line``."""
        candidates = set(self.always)
        for literal, owners in self.owners.items():
            if literal in lowered:
                candidates.update(owners)
        for i in sorted(candidates):
            if self.signatures[i].regex.search(line):
                return self.signatures[i]
        return None


@dataclass(frozen=True)
class SignatureCatalogue:
    """Validated signatures, split by what they read, in catalogue order."""

    line_signatures: tuple[Signature, ...]
    label_signatures: tuple[Signature, ...]

    @functools.cached_property
    def _by_role(self) -> tuple[_Ordered, _Ordered, _Ordered]:
        """(noise markers, causes heaviest first, other markers), each in catalogue order within a weight."""
        causes = sorted((s for s in self.line_signatures if s.role == "cause"), key=lambda s: -s.weight)
        return (
            _Ordered([s for s in self.line_signatures if s.role == "noise"]),
            _Ordered(causes),
            _Ordered([s for s in self.line_signatures if s.role not in ("noise", "cause")]),
        )

    def classify(self, line: str) -> LineMatch:
        """The heaviest cause signature matching ``line`` (first in catalogue order on ties) and its first
        marker. A noise marker silences the line: it then has no cause."""
        noise, causes, markers = self._by_role
        lowered = line.lower()
        if silenced := noise.first(line, lowered):
            return LineMatch(None, silenced)
        cause, marker = causes.first(line, lowered), markers.first(line, lowered)
        return LineMatch(cause, marker) if cause or marker else _NO_MATCH

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
        literals=required_literals(pattern),
    )


MIN_LITERAL = 3  # shorter required strings filter too little to be worth checking


def required_literals(pattern: str) -> tuple[str, ...] | None:
    """Lower-case strings one of which every match of ``pattern`` contains, or None when none can be told.

    Read from the parse tree of Python's own regex parser: the longest run of literal characters that every
    match must contain, or, for an alternation, one such run per branch."""
    try:
        found = _required(sre_parse.parse(pattern).data)
    except (re.error, TypeError, ValueError):
        return None
    return tuple(sorted(found)) if found else None


def _required(items: list[Any]) -> set[str] | None:
    candidates: list[set[str]] = []
    run: list[str] = []

    def close() -> None:
        if len(run) >= MIN_LITERAL:
            candidates.append({"".join(run).lower()})
        run.clear()

    for op, av in items:
        if op is sre_constants.LITERAL:
            run.append(chr(av))
            continue
        close()
        if op is sre_constants.SUBPATTERN:
            inner = _required(av[-1].data)
        elif op is sre_constants.BRANCH:
            branches = [_required(branch.data) for branch in av[1]]
            inner = set().union(*branches) if all(branches) else None  # type: ignore[arg-type]
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT) and av[0] >= 1:
            inner = _required(av[2].data)
        else:
            inner = None
        if inner:
            candidates.append(inner)
    close()
    # The most selective choice: the alternatives whose shortest member is longest.
    return max(candidates, key=lambda found: min(len(text) for text in found), default=None)
