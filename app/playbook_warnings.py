"""Warnings about playbooks that load but may not do what their author expects. Pure: no I/O.

``nightshift lint`` prints them as ``file:line: warning: ...`` and still succeeds.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.playbooks import Playbook
from app.promql_window import ranges


def warnings(playbooks: Iterable[Playbook]) -> list[str]:
    found = []
    for playbook in playbooks:
        if playbook.verify is None:
            continue
        longest = max(ranges(playbook.verify.promql), default=0.0)
        first_poll = playbook.verify.interval.total_seconds()
        if longest > first_poll:
            found.append(
                f"{playbook.source}:{playbook.line}: warning: {playbook.name}: verify.promql looks back "
                f"{longest:g}s, longer than the first poll ({first_poll:g}s after the action): samples from "
                "before the action would count, so the engine shortens the window to the time since the action "
                "(make verify.interval at least as long as the window to poll the query as written)"
            )
    return found
