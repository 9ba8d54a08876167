"""Playbooks: the model, the YAML loader with ``file:line`` errors, the JSON schema, and indexed matching.

Pure: nothing here runs an action or talks to a backend; the only I/O is reading playbook files (and writing
the shipped JSON schema on request). Loading happens in two passes per YAML document: jsonschema checks the
structure (keys, types, which ``with:`` keys each action takes), then Python checks the meaning (matchers,
templates, literal parameter values, durations) of every section the first pass found sound, so one run
reports every error it can.

The YAML reader and the per-document error collector live in :mod:`app.domain.config_documents` (shared with
:mod:`app.domain.permissions`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from app.actions.base import Action
from app.actions.registry import ActionRegistry
from app.domain import schedulers as scheduling
from app.domain.config_documents import (
    DURATION_HINT,
    ConfigFileError,
    Document,
    DocumentCheck,
    PathKey,
    read_documents,
    show,
)
from app.domain.errors import ParamError
from app.domain.matchers import Matcher, MatcherError, equality_value, matches_all, parse_matchers
from app.domain.params import (
    K8S_NAME,
    K8S_NAMESPACE,
    NODE_NAME,
    SLURM_JOB_ID,
    Param,
    validate_params,
)
from app.domain.templates import (
    NAMESPACES,
    TemplateError,
    check_promql_template,
    check_template,
    is_templated,
    render,
    template_refs,
)

API_VERSION = "nightshift/v1"
SCHEMA_PATH = Path(__file__).parents[1] / "schema" / "playbook.schema.json"
PLAYBOOK_NAME = r"[a-z0-9](?:[-a-z0-9_.]{0,61}[a-z0-9])?"
DURATION = re.compile(r"(?=[0-9])(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
SERIALIZE = ("node", "job", "none")
# The alert is all a target can be built from: the rest of the context is derived from the target.
TARGET_NAMESPACES = ("labels", "annotations")
NODE_REPAIR_NAMESPACES = (*NAMESPACES, "node")  # {{ node.name }}: the node being repaired
# What a rendered target may hold; a missing label renders "" and leaves that key out of the target.
TARGET_PARAMS: Mapping[str, Param] = {
    "scheduler": Param(
        required=False,
        choices=(*scheduling.NAMES, scheduling.NO_SCHEDULER),
        description=f"{', '.join(scheduling.NAMES)} or {scheduling.NO_SCHEDULER}",
    ),
    "node": Param(required=False, pattern=NODE_NAME, description="the node the alert is about"),
    "job": Param(
        required=False,
        pattern=f"(?:{SLURM_JOB_ID}|{K8S_NAME})",
        description="Slurm job id or Kubernetes job name",
    ),
    "namespace": Param(required=False, pattern=K8S_NAMESPACE, description="Kubernetes namespace"),
    "pod": Param(required=False, pattern=K8S_NAME, description="Kubernetes pod"),
    "cluster": Param(
        required=False, pattern=r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", description="cluster name"
    ),
    "partition": Param(required=False, pattern=r"[A-Za-z0-9_.-]{1,64}", description="Slurm partition"),
    "kind": Param(
        required=False,
        choices=("Job", "PyTorchJob", "JobSet", "TrainJob"),
        description="Job, PyTorchJob, JobSet or TrainJob (from the object itself: app/workloads.py)",
    ),
}

# --- model -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One action of a playbook. ``with_`` holds templates; the engine renders, then validates, them.

    The engine evaluates ``when`` against the alert labels plus ``diagnosis``, ``xid_class`` and ``attempt``.
    """

    action: str
    with_: Mapping[str, Any]
    when: tuple[Matcher, ...] = ()
    approval: bool = False
    name: str = ""
    line: int = 0


@dataclass(frozen=True)
class Budget:
    """At most ``attempts`` remediations per target within ``window``, ``backoff`` apart; then needs_human."""

    attempts: int = 3
    window: timedelta = timedelta(hours=24)
    backoff: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class Verify:
    """Recovery holds when ``promql`` (a template) returns a non-empty result within ``timeout``."""

    promql: str
    timeout: timedelta = timedelta(minutes=20)
    interval: timedelta = timedelta(seconds=15)


@dataclass(frozen=True)
class NodeRepair:
    """What happens to a culprit node this playbook names: repaired (``repair`` steps, possibly none), then
    validated (``validate``; None: the scheduler's default validation) before it returns to service or is held.
    Taking the node out and returning it are the scheduler's own actions (drain/resume, cordon/uncordon)."""

    repair: tuple[Step, ...] = ()
    validate: Step | None = None


@dataclass(frozen=True)
class ExcludeNode:
    """The alert's node is a culprit the job's recovery keeps off but not a fault (a straggler): it is excluded
    without being taken out of service, until it has been excluded ``repair_after`` times within ``window`` (by
    any playbook with ``exclude_node``); then it goes through the repair lifecycle (``node_repair`` says how,
    else the scheduler's defaults)."""

    repair_after: int = 3
    window: timedelta = timedelta(hours=24)


# Bound on exclude_node.repair_after (a count of exclusions looked up in the incidents of the window).
MAX_REPAIR_AFTER = 100
# Bounds on self_recovery: a job trains again when its step counter grew over the last minute, all after the fault
# (app.domain.incident_policy.PROGRESS_WINDOW is half the shortest grace); longer than an hour is a job left broken.
SELF_RECOVERY_MIN = timedelta(minutes=2)
SELF_RECOVERY_MAX = timedelta(hours=1)


MAX_REMEMBERED_TARGETS = 4096  # rendered targets a playbook remembers


@dataclass(frozen=True)
class Playbook:
    """One remediation recipe, as loaded from ``source`` (the document starts at ``line``)."""

    name: str
    description: str
    match: tuple[Matcher, ...]
    target: Mapping[str, str]
    serialize: str
    budget: Budget = field(default_factory=Budget)
    cooldown: timedelta = timedelta(minutes=30)
    recheck: str | None = None
    collect: tuple[Step, ...] = ()
    steps: tuple[Step, ...] = ()
    verify: Verify | None = None
    on_resolved: tuple[Step, ...] = ()
    # Among the playbooks matched by the alerts of one job's failure episode, the highest priority plans the
    # job's one recovery (a GPU fault's playbook over the NCCL timeouts it causes on every rank).
    priority: int = 0
    # Set on node-scoped playbooks (Xid, ECC, NVLink...): the alert's node is a culprit of its job's episode, and
    # is repaired through the node lifecycle.
    node_repair: NodeRepair | None = None
    # Set on playbooks naming a culprit that is excluded from the job without a repair (stragglers).
    exclude_node: ExcludeNode | None = None
    # How long a running job's own launcher (torchrun --max-restarts, a pod's restart policy) is given to bring it
    # back after the fault before the playbook acts; a job that trains again closes ``self_recovered``.
    self_recovery: timedelta | None = None
    source: str = ""
    line: int = 0
    # The YAML document as written, with the line of every key (lint's warnings point at the line they mean).
    document: Document | None = field(default=None, compare=False, repr=False)
    # Targets rendered, by the values of the labels and annotations their templates read (render_target).
    _targets: dict[tuple[str | None, ...], dict[str, str]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def line_of(self, path: PathKey) -> int:
        """The line of ``path`` in the playbook's document (its first line when unknown)."""
        return self.document.line_of(path) if self.document is not None else self.line

    @property
    def schedulers(self) -> frozenset[str]:
        """The schedulers this playbook acts on: its target's ``scheduler`` and its actions' backends
        (``slurm.*``, ``kubernetes.*``)."""
        steps = [*self.collect, *self.steps, *self.on_resolved]
        if self.node_repair is not None:
            steps += [
                *self.node_repair.repair,
                *([self.node_repair.validate] if self.node_repair.validate else []),
            ]
        found = {step.action.partition(".")[0] for step in steps} & set(scheduling.NAMES)
        declared = self.target.get("scheduler", "")
        if declared in scheduling.NAMES:
            found.add(declared)
        return frozenset(found)

    def render_target(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, str]:
        """The target for one alert: templates rendered, empty values left out, every value checked.

        Raises :class:`app.domain.errors.ParamError` when a rendered value fails its pattern (a node with spaces).
        """
        context = {"labels": labels, "annotations": annotations}
        # A template reads only the values it names: alerts that agree on them (a node's ranks, a job's nodes) share
        # one target, rendered and checked once (a failing one is not remembered: it raises every time).
        read = tuple(
            context[namespace].get(key) if namespace in context else None
            for text in self.target.values()
            for namespace, key in template_refs(text)
        )
        known = self._targets.get(read)
        if known is not None:
            return dict(known)
        rendered = {key: render(text, context) for key, text in self.target.items()}
        target = validate_params("target", TARGET_PARAMS, rendered)
        scheduler = scheduling.of(target)
        if scheduler is not None:
            scheduler.check_target(target)
        if len(self._targets) >= MAX_REMEMBERED_TARGETS:
            self._targets.clear()
        self._targets[read] = dict(target)
        return target


class PlaybookSet:
    """Loaded playbooks, indexed by the ``alertname`` each one requires (if any) so matching stays cheap.

    ``schedulers``: those this deployment acts on (setting ``schedulers``); a playbook for another one is set
    aside in :attr:`excluded`, never matched (:meth:`excluded_matches` says which would have been, for explain).

    ``candidates_examined`` counts the playbooks whose matchers :meth:`match` evaluated, over its lifetime: a
    statistic (and the test hook showing that matching is indexed), not a limit.
    """

    def __init__(self, playbooks: Iterable[Playbook] = (), schedulers: Iterable[str] = scheduling.NAMES):
        chosen = frozenset(schedulers)
        every = sorted(playbooks, key=lambda p: p.name)
        self.schedulers = chosen
        self.excluded: tuple[Playbook, ...] = tuple(p for p in every if not p.schedulers <= chosen)
        self.playbooks: tuple[Playbook, ...] = tuple(p for p in every if p.schedulers <= chosen)
        self._by_name = {p.name: p for p in self.playbooks}
        if len(self._by_name) != len(self.playbooks):
            raise ValueError("playbook names must be unique")
        self._by_alertname: dict[str, list[Playbook]] = {}
        self._any_alertname: list[Playbook] = []
        for playbook in self.playbooks:
            alertname = equality_value(playbook.match, "alertname")
            if alertname is None:
                self._any_alertname.append(playbook)
            else:
                self._by_alertname.setdefault(alertname, []).append(playbook)
        self.candidates_examined = 0

    def match(self, labels: Mapping[str, str]) -> list[Playbook]:
        """Every playbook whose matchers all hold for ``labels``, ordered by name."""
        candidates = self._by_alertname.get(labels.get("alertname", ""), []) + self._any_alertname
        self.candidates_examined += len(candidates)
        return sorted((p for p in candidates if matches_all(p.match, labels)), key=lambda p: p.name)

    def excluded_matches(self, labels: Mapping[str, str]) -> list[str]:
        """Why each playbook set aside for its scheduler would have matched ``labels`` (explain's notes)."""
        return [
            f"playbook {p.name} acts on {', '.join(sorted(p.schedulers - self.schedulers))}, which this deployment "
            f"does not (schedulers: {', '.join(sorted(self.schedulers))}): not loaded"
            for p in self.excluded
            if matches_all(p.match, labels)
        ]

    def get(self, name: str) -> Playbook | None:
        """The playbook called ``name``, if loaded."""
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self.playbooks)


def parse_duration(text: str) -> timedelta:
    """``30s``, ``10m``, ``24h``, ``7d``, ``1h30m`` (units in this order, each once). Raises ValueError."""
    found = DURATION.fullmatch(text)
    if not found:
        raise ValueError(f"bad duration {text!r} ({DURATION_HINT})")
    days, hours, minutes, seconds = (int(group or 0) for group in found.groups())
    try:
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:
        raise ValueError(f"duration {text!r} is too long") from None


# --- errors ------------------------------------------------------------------------------------------------


class PlaybookError(ConfigFileError):
    """One or more playbooks are invalid."""


# --- JSON schema -------------------------------------------------------------------------------------------


def playbook_schema(registry: ActionRegistry) -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of a playbook document, with the ``with:`` keys of every action."""
    step_list = {"type": "array", "items": {"$ref": "#/$defs/step"}}
    duration = {"$ref": "#/$defs/duration"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:nightshift:playbook:v1",
        "title": "playbook",
        "description": "A Nightshift remediation playbook (one YAML document; a file may hold several).",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "match"],
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"const": "Playbook"},
            "metadata": {
                "title": "metadata",
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"title": "playbook name", "type": "string", "pattern": f"^{PLAYBOOK_NAME}$"},
                    "description": {"type": "string"},
                },
            },
            "match": {
                "description": 'Alertmanager matchers, all of which must hold, e.g. alertname="GpuXidError"',
                "type": "array",
                "minItems": 1,
                "items": {"type": "string"},
            },
            "target": {
                "title": "target",
                "description": "What the incident is about; templates may use labels and annotations.",
                "type": "object",
                "additionalProperties": False,
                # No enums: a value may be a template; literal values are checked against TARGET_PARAMS.
                "properties": {
                    key: {"type": "string", "description": spec.description}
                    for key, spec in TARGET_PARAMS.items()
                },
            },
            "serialize": {
                "enum": list(SERIALIZE),
                "description": "At most one open incident per node or job.",
            },
            "budget": {
                "title": "budget",
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "attempts": {"type": "integer", "minimum": 1},
                    "window": duration,
                    "backoff": duration,
                },
            },
            "cooldown": duration,
            "self_recovery": {
                "anyOf": [duration, {"type": "null"}],
                "description": "How long a running job's own launcher (torchrun --max-restarts, a restart "
                "policy) is given to bring it back before the steps run; a job that trains again after the fault "
                f"is left alone. Between {SELF_RECOVERY_MIN.seconds // 60}m and "
                f"{SELF_RECOVERY_MAX.seconds // 3600}h; job targets only.",
            },
            "priority": {
                "type": "integer",
                "minimum": -1000,
                "maximum": 1000,
                "description": "Which playbook plans a job's recovery when several match its alerts: the highest.",
            },
            "recheck": {
                "type": ["string", "null"],
                "description": 'PromQL checked just before acting; references sit inside "..." literals.',
            },
            "collect": step_list | {"description": "Read-only steps whose output feeds the diagnosis."},
            "steps": step_list,
            "verify": {
                "title": "verify",
                "type": ["object", "null"],
                "additionalProperties": False,
                "required": ["promql"],
                "properties": {
                    "promql": {"type": "string", "description": 'references must sit inside "..." literals'},
                    "timeout": duration,
                    "interval": duration,
                },
            },
            "on_resolved": step_list,
            "exclude_node": {
                "title": "exclude_node",
                "type": ["object", "null"],
                "additionalProperties": False,
                "description": "The alert's node is a culprit excluded from the job's recovery without being "
                "taken out of service (a straggler), until it was excluded repair_after times within window.",
                "properties": {
                    "repair_after": {"type": "integer", "minimum": 1, "maximum": MAX_REPAIR_AFTER},
                    "window": duration,
                },
            },
            "node_repair": {
                "title": "node_repair",
                "type": ["object", "null"],
                "additionalProperties": False,
                "description": "Makes the playbook node-scoped: its alert's node is a culprit, repaired and "
                "validated before it returns to service. Templates may also use {{ node.name }}.",
                "properties": {
                    "repair": step_list,
                    "validate": {"$ref": "#/$defs/step"},
                },
            },
        },
        "$defs": {
            "duration": {"title": "duration", "type": "string", "pattern": f"^{DURATION.pattern}$"},
            "step": _step_schema(registry),
        },
    }


def _step_schema(registry: ActionRegistry) -> dict[str, Any]:
    return {
        "title": "step",
        "type": "object",
        "additionalProperties": False,
        "required": ["action"],
        "properties": {
            "action": {"title": "action", "enum": registry.names()},
            "name": {"type": "string", "description": "defaults to the action name"},
            "with": {"type": "object", "description": "the action's parameters; values may be templates"},
            "when": {
                "type": "array",
                "items": {"type": "string"},
                "description": "matchers on the labels plus diagnosis, xid_class and attempt",
            },
            "approval": {"enum": ["required", "none"]},
        },
        "allOf": [_with_rule(action) for action in registry],
    }


def _with_rule(action: Action) -> dict[str, Any]:
    """``if action == name then with: {its params}``; ``with`` may be left out unless a param is required."""
    required = sorted(name for name, spec in action.params.items() if spec.required and spec.default is None)
    with_schema: dict[str, Any] = {
        "title": f"parameters of {action.name}",
        "type": "object",
        "additionalProperties": False,
        "properties": {name: spec.json_schema() for name, spec in action.params.items()},
    }
    then: dict[str, Any] = {"title": f"a {action.name} step", "properties": {"with": with_schema}}
    if required:
        with_schema["required"] = required
        then["required"] = ["with"]
    return {"if": {"required": ["action"], "properties": {"action": {"const": action.name}}}, "then": then}


def write_schema(path: str | Path, registry: ActionRegistry) -> None:
    """Write :func:`playbook_schema` as stable, diffable JSON (the file shipped for editors)."""
    Path(path).write_text(
        json.dumps(playbook_schema(registry), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


# --- loading -----------------------------------------------------------------------------------------------


def load_playbooks(
    paths: Sequence[str | Path], registry: ActionRegistry, schedulers: Iterable[str] = scheduling.NAMES
) -> PlaybookSet:
    """Load every ``*.yaml``/``*.yml`` file named (or directly inside a named directory, sorted); those for a
    scheduler outside ``schedulers`` are checked, then set aside (:class:`PlaybookSet`).

    Raises :class:`PlaybookError` listing every problem in every file, including a name defined twice.
    """
    errors: list[str] = []
    playbooks: list[Playbook] = []
    for file in _playbook_files(paths, errors):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{file}: cannot read: {exc}")
            continue
        found, problems = _parse(text, str(file), registry)
        playbooks.extend(found)
        errors.extend(problems)
    errors.extend(_duplicates(playbooks))
    if errors:
        raise PlaybookError(errors)
    return PlaybookSet(playbooks, schedulers)


def parse_playbooks(text: str, source: str, registry: ActionRegistry) -> list[Playbook]:
    """The playbooks in one YAML text (several documents allowed). Raises :class:`PlaybookError`."""
    playbooks, errors = _parse(text, source, registry)
    errors.extend(_duplicates(playbooks))
    if errors:
        raise PlaybookError(errors)
    return playbooks


def _playbook_files(paths: Sequence[str | Path], errors: list[str]) -> Iterator[Path]:
    for path in map(Path, paths):
        if path.is_dir():
            yield from sorted(
                p
                for p in path.iterdir()
                if p.suffix in (".yaml", ".yml") and p.is_file() and not p.name.startswith(".")
            )
        elif path.is_file():
            yield path
        else:
            errors.append(f"{path}: no such file or directory")


def _duplicates(playbooks: Sequence[Playbook]) -> list[str]:
    first: dict[str, Playbook] = {}
    errors = []
    for playbook in playbooks:
        if playbook.name in first:
            other = first[playbook.name]
            errors.append(
                f"{playbook.source}:{playbook.line}: duplicate playbook name {playbook.name!r} "
                f"(first defined at {other.source}:{other.line})"
            )
        else:
            first[playbook.name] = playbook
    return errors


def _parse(text: str, source: str, registry: ActionRegistry) -> tuple[list[Playbook], list[str]]:
    documents, errors = read_documents(text, source)
    schema = playbook_schema(registry)
    playbooks = []
    for doc in documents:
        reader = _PlaybookReader(DocumentCheck(doc, source, schema), registry)
        playbook = reader.read()
        if playbook is None:
            errors.extend(reader.check.messages())
        else:
            playbooks.append(playbook)
    return playbooks, errors


class _PlaybookReader:
    """The semantic pass over one schema-checked document: builds the :class:`Playbook` or records why not."""

    def __init__(self, check: DocumentCheck, registry: ActionRegistry):
        self.check = check
        self.registry = registry
        self.data: dict[str, Any] = check.doc.data if isinstance(check.doc.data, dict) else {}

    def read(self) -> Playbook | None:
        target = self._target()
        playbook = Playbook(
            name=self._value(("metadata", "name")) or "",
            description=self._value(("metadata", "description")) or "",
            match=self._match(),
            target=target,
            serialize=self._serialize(target),
            budget=Budget(
                attempts=self._value(("budget", "attempts")) or Budget.attempts,
                window=self._duration(("budget", "window"), Budget.window, positive=True),
                backoff=self._duration(("budget", "backoff"), Budget.backoff),
            ),
            cooldown=self._duration(("cooldown",), Playbook.cooldown),
            recheck=self._promql(("recheck",)),
            collect=self._steps("collect", read_only=True),
            steps=self._steps("steps", read_only=False),
            verify=self._verify(),
            on_resolved=self._steps("on_resolved", read_only=False),
            node_repair=self._node_repair(),
            exclude_node=self._exclude_node(),
            self_recovery=self._self_recovery(target),
            priority=self._value(("priority",)) or 0,
            source=self.check.source,
            line=self.check.doc.line,
            document=self.check.doc,
        )
        self._require_work()
        return playbook if self.check.ok else None

    def _value(self, path: PathKey) -> Any:
        """The value at ``path`` if it is there with the schema's type (its contents unchecked), else None."""
        if not self.check.typed(path):
            return None
        value: Any = self.data
        for part in path:
            indexable = isinstance(value, list) and isinstance(part, int) and part < len(value)
            if not (indexable or (isinstance(value, dict) and part in value)):
                return None
            value = value[part]
        return value

    def _match(self) -> tuple[Matcher, ...]:
        matchers = self._matchers(("match",))
        if matchers == () and self.check.sound(("match",)):
            # ['{}'] parses to no matchers at all, which would match every alert.
            self.check.fail(("match",), "names no matcher: a playbook must not match every alert")
        return matchers or ()

    def _matchers(self, path: PathKey) -> tuple[Matcher, ...] | None:
        """The matchers of every entry of the list at ``path``; None when some entry is bad (reported)."""
        matchers: list[Matcher] = []
        bad = False
        for index, text in enumerate(self._value(path) or []):
            if not self.check.sound((*path, index)):
                bad = True
                continue
            try:
                matchers.extend(parse_matchers(text))
            except MatcherError as exc:
                self.check.fail((*path, index), f"bad matcher {show(text)}: {exc}")
                bad = True
        return None if bad else tuple(matchers)

    def _target(self) -> dict[str, str]:
        target = self._value(("target",)) or {}
        for key, text in target.items():
            if self.check.sound(("target", key)):
                self._literal_or_template(
                    ("target", key), "target", TARGET_PARAMS[key], text, TARGET_NAMESPACES
                )
        return dict(target)

    def _serialize(self, target: Mapping[str, str]) -> str:
        serialize = self._value(("serialize",))
        if serialize is None:
            # Default: serialise on the most specific thing the target names.
            return next((key for key in ("node", "job") if key in target), "none")
        if serialize != "none" and serialize not in target and self.check.typed(("target",)):
            self.check.fail(("serialize",), f"{serialize!r} needs target.{serialize}")
        return str(serialize)

    def _duration(self, path: PathKey, default: timedelta, *, positive: bool = False) -> timedelta:
        text = self._value(path)
        if text is None:
            return default
        try:
            value = parse_duration(text)
        except ValueError as exc:
            self.check.fail(path, str(exc))
            return default
        if positive and not value:
            self.check.fail(path, "must be longer than 0s")
        return value

    def _promql(self, path: PathKey) -> str | None:
        text: str | None = self._value(path)
        if text is not None:
            try:
                check_promql_template(text)
            except TemplateError as exc:
                self.check.fail(path, f"template: {exc}")
        return text

    def _verify(self) -> Verify | None:
        if self._value(("verify",)) is None:
            return None
        return Verify(
            promql=self._promql(("verify", "promql")) or "",
            timeout=self._duration(("verify", "timeout"), Verify.timeout, positive=True),
            interval=self._duration(("verify", "interval"), Verify.interval, positive=True),
        )

    def _steps(
        self, key: str, *, read_only: bool, at: PathKey = (), namespaces: Sequence[str] = NAMESPACES
    ) -> tuple[Step, ...]:
        steps = []
        for index in range(len(self._value((*at, key)) or [])):
            step = self._step((*at, key, index), key, read_only=read_only, namespaces=namespaces)
            if step is not None:
                steps.append(step)
        return tuple(steps)

    def _step(
        self, path: PathKey, key: str, *, read_only: bool, namespaces: Sequence[str] = NAMESPACES
    ) -> Step | None:
        if not self.check.typed(path) or not self.check.sound((*path, "action")):
            return None
        raw = self._value(path)
        action = self.registry.get(raw["action"])
        if read_only and not action.read_only:
            self.check.fail(
                (*path, "action"),
                f"{key} steps must be read-only; {action.name} changes things (move it to steps)",
            )
        with_ = self._value((*path, "with")) or {}
        for name, value in with_.items():
            if self.check.sound((*path, "with", name)):
                spec = action.params[name]
                self._literal_or_template((*path, "with", name), action.name, spec, value, namespaces)
        return Step(
            action=action.name,
            with_=with_,
            when=self._matchers((*path, "when")) or (),
            approval=raw.get("approval") == "required",
            name=raw.get("name") or action.name,
            line=self.check.doc.line_of(path),
        )

    def _node_repair(self) -> NodeRepair | None:
        if "node_repair" in self.data and self.data["node_repair"] is None:
            self.check.fail(
                ("node_repair",),
                "is null, which means nothing: write node_repair: {} for a node-scoped playbook with the default "
                "repair (take out, validate, return), or remove the key",
            )
            return None
        if self._value(("node_repair",)) is None:
            return None
        if "node" not in self.data.get("target", {}):
            self.check.fail(("node_repair",), "a node-scoped playbook needs target.node")
        validate = None
        if self._value(("node_repair", "validate")) is not None:
            validate = self._step(
                ("node_repair", "validate"), "validate", read_only=False, namespaces=NODE_REPAIR_NAMESPACES
            )
        return NodeRepair(
            repair=self._steps(
                "repair", read_only=False, at=("node_repair",), namespaces=NODE_REPAIR_NAMESPACES
            ),
            validate=validate,
        )

    def _exclude_node(self) -> ExcludeNode | None:
        if self._value(("exclude_node",)) is None:
            return None
        if "node" not in self.data.get("target", {}):
            self.check.fail(("exclude_node",), "a playbook excluding its node needs target.node")
        repair_after = self._value(("exclude_node", "repair_after"))
        if repair_after is None:
            repair_after = ExcludeNode.repair_after
        elif not 1 <= repair_after <= MAX_REPAIR_AFTER:
            self.check.fail(("exclude_node", "repair_after"), f"must be between 1 and {MAX_REPAIR_AFTER}")
        window = self._duration(("exclude_node", "window"), ExcludeNode.window, positive=True)
        return ExcludeNode(repair_after=repair_after, window=window)

    def _self_recovery(self, target: Mapping[str, str]) -> timedelta | None:
        if self._value(("self_recovery",)) is None:
            return None
        grace = self._duration(("self_recovery",), SELF_RECOVERY_MIN)
        if not SELF_RECOVERY_MIN <= grace <= SELF_RECOVERY_MAX:
            self.check.fail(
                ("self_recovery",),
                f"must be between {SELF_RECOVERY_MIN.seconds // 60}m and {SELF_RECOVERY_MAX.seconds // 3600}h",
            )
        if "job" not in target:
            self.check.fail(
                ("self_recovery",), "only a playbook whose target names a job can wait for its launcher"
            )
        return grace

    def _literal_or_template(
        self, path: PathKey, owner: str, spec: Param, value: Any, namespaces: Sequence[str]
    ) -> None:
        """Check a templated value's templates, or a literal value against its parameter's pattern now."""
        if spec.kind == "list" and isinstance(value, list):
            for index, item in enumerate(value):
                self._literal_or_template(
                    (*path, index), owner, replace(spec, kind="string"), item, namespaces
                )
            return
        if spec.literal and is_templated(value):
            self.check.fail(
                path, "must be written out in the playbook, not templated (it says where data is sent)"
            )
            return
        if not is_templated(value):
            try:
                validate_params(owner, {str(path[-1]): spec}, {str(path[-1]): value})
            except ParamError as exc:
                # The path already names the parameter: keep only what is wrong with it.
                self.check.fail(path, str(exc).removeprefix(f"{exc.action}: parameter {exc.param!r}: "))
            return
        try:
            (check_promql_template if spec.promql else check_template)(value, namespaces)
        except TemplateError as exc:
            self.check.fail(path, f"template: {exc}")

    def _require_work(self) -> None:
        if not (self.check.typed(("steps",)) and self.check.typed(("collect",))):
            return
        if not self.data.get("steps") and not self.data.get("collect"):
            at: PathKey = ("steps",) if "steps" in self.data else ()
            self.check.fail(at, "a playbook needs at least one step (in steps or collect)")
