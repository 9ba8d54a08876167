"""How long the store keeps what, checked against the history the guards read (pure: no I/O).

Retention never shortens a guard's memory: every window a guard, the lemon rule or the checkpoint advice reads
back through closed incidents, attempts and repairs (:meth:`app.config.Settings.history_windows`, and every loaded
playbook's budget window, cooldown and ``exclude_node`` window) must fit in ``retention.incidents_days``;
:func:`check_windows` refuses playbooks that would not, naming ``file:line``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.config import RetentionSettings, Settings
from app.domain.playbooks import Playbook

DAY = timedelta(days=1)


def playbook_windows(playbooks: Iterable[Playbook]) -> list[tuple[str, float]]:
    """``(file:line: name: key, seconds)`` of each playbook's look back through closed history."""
    found = []
    for p in playbooks:
        found.append(
            (f"{p.source}:{p.line_of(('budget', 'window'))}: {p.name}: budget.window", p.budget.window)
        )
        found.append((f"{p.source}:{p.line_of(('cooldown',))}: {p.name}: cooldown", p.cooldown))
        if p.exclude_node is not None:
            line = p.line_of(("exclude_node", "window"))
            found.append((f"{p.source}:{line}: {p.name}: exclude_node.window", p.exclude_node.window))
    return [(where, window.total_seconds()) for where, window in found]


def check_windows(settings: Settings, playbooks: Iterable[Playbook]) -> None:
    """ConfigError when a playbook reads back further than ``retention.incidents_days`` keeps (the settings' own
    windows were checked when they were loaded)."""
    settings.check_retention(playbook_windows(playbooks))


@dataclass(frozen=True)
class Cutoffs:
    """Rows older than these may go: ``alerts`` for alerts and raw notifications, ``incidents`` for the rest."""

    alerts: datetime
    incidents: datetime


def cutoffs(settings: RetentionSettings, now: datetime) -> Cutoffs:
    """The cutoffs of ``settings`` at ``now``."""
    return Cutoffs(alerts=now - settings.alerts_days * DAY, incidents=now - settings.incidents_days * DAY)
