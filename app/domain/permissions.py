"""The permissions whitelist: which actions Nightshift may take, optionally scoped to nodes, partitions,
namespaces and clusters of the incident's target.

No file (or no grants) means advisory mode: every changing step is recorded as ``would_run``. Read-only
actions (logs, queries, notifications) need no grant. A scope restricts a grant to targets whose field
matches; a target that lacks the field is not covered (fail closed). Pure apart from reading the file.

```yaml
apiVersion: nightshift/v1
kind: Permissions
allow:
  - action: slurm.drain_node          # exact name or glob like "slurm.*"
    nodes: "gpu-[0-9]+"               # optional regex, must match all of target.node
    partitions: [batch]               # optional lists of exact values
    namespaces: [training]
    clusters: [prod-a]
```
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.actions.base import Action
from app.actions.registry import ActionRegistry
from app.domain.config_documents import ConfigFileError, DocumentCheck, PathKey, read_documents
from app.domain.playbooks import API_VERSION

# Grant field → the target field it scopes.
LIST_SCOPES = {"partitions": "partition", "namespaces": "namespace", "clusters": "cluster"}
_GLOB_CHARS = re.compile(r"[*?\[]")

_STRING_LIST = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
PERMISSIONS_SCHEMA: Mapping[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "permissions",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "allow"],
    "properties": {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": "Permissions"},
        "allow": {
            "type": "array",
            "items": {
                "title": "grant",
                "type": "object",
                "additionalProperties": False,
                "required": ["action"],
                "properties": {
                    "action": {"type": "string", "minLength": 1},
                    "nodes": {"type": "string", "minLength": 1},
                    **dict.fromkeys(LIST_SCOPES, _STRING_LIST),
                },
            },
        },
    },
}


class PermissionsError(ConfigFileError):
    """permissions.yaml is invalid; ``errors`` lists every problem as ``file:line: message``."""


@dataclass(frozen=True)
class Grant:
    """Permission to run actions matching ``action`` (a name or glob) on targets inside every given scope."""

    action: str
    nodes: re.Pattern[str] | None = None
    partitions: tuple[str, ...] | None = None
    namespaces: tuple[str, ...] | None = None
    clusters: tuple[str, ...] | None = None
    source: str = ""
    line: int = 0

    def names(self, action: str) -> bool:
        """Whether this grant is about ``action``."""
        return fnmatch.fnmatchcase(action, self.action)

    def gap(self, target: Mapping[str, str]) -> str | None:
        """Why ``target`` falls outside this grant's scopes, or None when it is covered."""
        if self.nodes is not None and not self.nodes.fullmatch(target.get("node", "")):
            return self._outside("nodes", "node", target, self.nodes.pattern)
        for scope, key in LIST_SCOPES.items():
            allowed: tuple[str, ...] | None = getattr(self, scope)
            if allowed is not None and target.get(key, "") not in allowed:
                return self._outside(scope, key, target, ", ".join(allowed))
        return None

    def _outside(self, scope: str, key: str, target: Mapping[str, str], allowed: str) -> str:
        value = target.get(key, "")
        if not value:
            return f"grant for {self.action} is limited to {scope} {allowed} but the target names no {key}"
        return f"grant for {self.action} does not cover {key} {value!r} ({scope}: {allowed})"


class Permissions:
    """The grants of permissions.yaml, in file order."""

    def __init__(self, grants: Iterable[Grant] = ()):
        self.grants: tuple[Grant, ...] = tuple(grants)

    @property
    def advisory(self) -> bool:
        """No grants at all: nothing but read-only actions may run."""
        return not self.grants

    def allows(self, action: Action, target: Mapping[str, str]) -> Grant | None:
        """The first grant covering ``action`` on ``target`` (synthetic for read-only actions), else None."""
        if action.read_only:
            return Grant(action=action.name, source="read-only action")
        return next((g for g in self.grants if g.names(action.name) and g.gap(target) is None), None)

    def explain(self, action: Action, target: Mapping[str, str]) -> str:
        """In words: which grant allows ``action`` on ``target``, or why none does."""
        grant = self.allows(action, target)
        if grant is not None and action.read_only:
            return f"allowed: {action.name} is read-only"
        if grant is not None:
            return f"allowed by the grant for {grant.action} at {grant.source}:{grant.line}"
        gaps = [gap for g in self.grants if g.names(action.name) and (gap := g.gap(target)) is not None]
        return "; ".join(gaps) or f"no grant for {action.name}"


def load_permissions(path: str | Path | None, registry: ActionRegistry) -> Permissions:
    """Read permissions.yaml (None: no grants, advisory). Raises :class:`PermissionsError`, listing all."""
    if path is None:
        return Permissions()
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PermissionsError([f"{source}: cannot read: {exc}"]) from None
    documents, errors = read_documents(text, source)
    if not documents and not errors:
        errors.append(f"{source}:1: no Permissions document (to grant nothing, write `allow: []`)")
    grants: list[Grant] = []
    for doc in documents:
        check = DocumentCheck(doc, source, PERMISSIONS_SCHEMA)
        items = doc.data.get("allow") if check.typed(("allow",)) else None
        for index, raw in enumerate(items or []):
            if check.sound(("allow", index)):
                grant = _grant(check, ("allow", index), raw, registry)
                if grant is not None:
                    grants.append(grant)
        errors.extend(check.messages())
    if errors:
        raise PermissionsError(errors)
    return Permissions(grants)


def _grant(
    check: DocumentCheck, path: PathKey, raw: Mapping[str, Any], registry: ActionRegistry
) -> Grant | None:
    """One schema-checked grant, or None after recording what is wrong with it."""
    ok = True
    action = raw["action"]
    known = ", ".join(registry.names())
    if _GLOB_CHARS.search(action):
        if not fnmatch.filter(registry.names(), action):
            check.fail((*path, "action"), f"{action!r} matches no known action (known: {known})")
            ok = False
    elif action not in registry:
        check.fail((*path, "action"), f"unknown action {action!r} (known: {known})")
        ok = False
    nodes = None
    if "nodes" in raw:
        try:
            nodes = re.compile(raw["nodes"])
        except re.error as exc:
            check.fail((*path, "nodes"), f"bad regex {raw['nodes']!r}: {exc}")
            ok = False
    if not ok:
        return None
    scopes = {scope: tuple(raw[scope]) for scope in LIST_SCOPES if scope in raw}
    return Grant(action=action, nodes=nodes, source=check.source, line=check.doc.line_of(path), **scopes)
