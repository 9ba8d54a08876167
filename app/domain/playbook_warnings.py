"""Warnings about playbooks that load but may not do what their author expects. Pure: no I/O.

``nightshift lint`` prints them as ``file:line: warning: ...`` (the line of the key they are about) and still
succeeds, unless ``--strict``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from app.domain.config_documents import PathKey
from app.domain.playbooks import Playbook
from app.domain.promql_window import ranges
from app.domain.templates import TemplateError, template_refs

# Sections whose templates render for an alert: the target is left out here, as its empty values are dropped on
# purpose (a job label absent means a node-only target).
_RENDERED = ("collect", "steps", "on_resolved", "node_repair", "verify", "recheck")


def warnings(
    playbooks: Iterable[Playbook], alert_labels: Mapping[str, frozenset[str]] | None = None
) -> list[str]:
    """Every warning of ``playbooks``. With ``alert_labels`` (alert name → labels it carries:
    :func:`app.alert_labels.alert_labels`), also each template naming a label that an alert the playbook matches
    never carries."""
    found: list[str] = []
    for playbook in playbooks:
        found.extend(_verify_window(playbook))
        if alert_labels:
            found.extend(_missing_labels(playbook, alert_labels))
    return found


def _verify_window(playbook: Playbook) -> Iterator[str]:
    if playbook.verify is None:
        return
    longest = max(ranges(playbook.verify.promql), default=0.0)
    first_poll = playbook.verify.interval.total_seconds()
    if longest > first_poll:
        yield (
            f"{playbook.source}:{playbook.line_of(('verify', 'promql'))}: warning: {playbook.name}: verify.promql "
            f"looks back {longest:g}s, longer than the first poll ({first_poll:g}s after the action): samples "
            "from before the action would count, so the engine shortens the window to the time since the action "
            "(make verify.interval at least as long as the window to poll the query as written)"
        )


def _missing_labels(playbook: Playbook, alert_labels: Mapping[str, frozenset[str]]) -> Iterator[str]:
    names = [m for m in playbook.match if m.name == "alertname"]
    if not names or playbook.document is None:
        return
    matched = {
        alert: labels
        for alert, labels in alert_labels.items()
        if all(m.matches({"alertname": alert}) for m in names)
    }
    data = playbook.document.data
    for section in _RENDERED:
        if section not in data:
            continue
        for path, text, guarded in _strings(data[section], (section,), frozenset()):
            try:
                refs = template_refs(text)
            except TemplateError:
                continue  # the loader reported it
            for label in dict.fromkeys(key for namespace, key in refs if namespace == "labels"):
                if label in guarded:
                    continue
                lacking = sorted(alert for alert, labels in matched.items() if label not in labels)
                if lacking:
                    yield (
                        f"{playbook.source}:{playbook.line_of(path)}: warning: {playbook.name}: "
                        f"{{{{ labels.{label} }}}} renders empty for {', '.join(lacking)}, which never carr"
                        f"{'y' if len(lacking) > 1 else 'ies'} {label!r} (rules/; docs/playbooks.md lists the labels "
                        "of every alert)"
                    )


def _strings(
    value: Any, path: PathKey, guarded: frozenset[str]
) -> Iterator[tuple[PathKey, str, frozenset[str]]]:
    """Every string under ``value`` with its path, and the labels a step's ``when:`` names (a step that runs only
    when the label is there may use it)."""
    if isinstance(value, str):
        yield path, value, guarded
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*path, index), guarded)
    elif isinstance(value, dict):
        when = value.get("when")
        if isinstance(when, list):
            guarded = guarded | {str(item).split("=")[0].split("!")[0].strip() for item in when}
        for key, item in value.items():
            if key != "when":
                yield from _strings(item, (*path, key), guarded)
