"""Actions looked up by name. One registry instance per app: no class-level shared state."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from app.actions.base import Action
from app.domain.errors import ConfigError


class ActionRegistry:
    """Name → action. Built by :func:`app.actions.default_registry` or by tests with their own actions."""

    def __init__(self, actions: Iterable[Action] = ()):
        self._actions: dict[str, Action] = {}
        for action in actions:
            self.register(action)

    def register(self, action: Action) -> None:
        if action.name in self._actions:
            raise ConfigError(f"action {action.name!r} registered twice")
        self._actions[action.name] = action

    def get(self, name: str) -> Action:
        try:
            return self._actions[name]
        except KeyError:
            raise ConfigError(
                f"unknown action {name!r} (known: {', '.join(sorted(self._actions))})"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._actions

    def __iter__(self) -> Iterator[Action]:
        return iter(sorted(self._actions.values(), key=lambda a: a.name))

    def names(self) -> list[str]:
        return sorted(self._actions)
