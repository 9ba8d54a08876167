"""Built-in actions. Each backend module exposes ``ACTIONS``; :func:`default_registry` collects them."""

from __future__ import annotations

from app.actions.registry import ActionRegistry


def default_registry() -> ActionRegistry:
    """Every built-in action, in a fresh registry."""
    from app.actions import (
        checkpoint,
        checkpoint_request,
        checkpoint_rollback,
        grafana,
        kubernetes,
        kubernetes_exec,
        kubernetes_rollback,
        notify,
        prometheus,
        slurm,
        stacks,
    )

    modules = [
        checkpoint,
        checkpoint_request,
        checkpoint_rollback,
        grafana,
        kubernetes,
        kubernetes_exec,
        kubernetes_rollback,
        notify,
        prometheus,
        slurm,
        stacks,
    ]
    return ActionRegistry(action for module in modules for action in module.ACTIONS)
