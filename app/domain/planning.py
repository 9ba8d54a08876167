"""From a playbook's steps and an incident's context to a concrete plan. Pure: no I/O.

Each planned step says whether it will run (whitelisted), would run (advisory), is skipped by its ``when:``, or is
invalid because a rendered value failed its action's schema (then it is never passed on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.actions.base import Action
from app.actions.registry import ActionRegistry
from app.domain.errors import ParamError
from app.domain.matchers import matches_all
from app.domain.permissions import Permissions
from app.domain.playbooks import Step
from app.domain.states import StepStatus
from app.domain.templates import TemplateError, render_promql, render_value

RUN, WOULD_RUN, SKIPPED, INVALID = (
    StepStatus.PENDING,
    StepStatus.WOULD_RUN,
    StepStatus.SKIPPED,
    StepStatus.INVALID,
)


@dataclass(frozen=True)
class PlannedStep:
    idx: int
    name: str
    action: Action
    status: StepStatus  # pending (will run) | would_run | skipped | invalid
    params: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    command: str = ""
    reason: str = ""
    approval: bool = False

    @property
    def runs(self) -> bool:
        return self.status == RUN

    @property
    def mutating(self) -> bool:
        return not self.action.read_only

    @property
    def destructive(self) -> bool:
        return self.mutating and not self.action.return_to_service


def nodes_taken_out(planned: Sequence[PlannedStep]) -> frozenset[str]:
    """The nodes the steps that will run take out of service (drain, cordon, reboot): what blast radius counts."""
    return frozenset(
        str(p.params["node"]) for p in planned if p.runs and p.action.takes_out and p.params.get("node")
    )


def when_context(
    labels: Mapping[str, str], diagnosis: Mapping[str, Any] | None, attempt: int, job_phase: str = ""
) -> dict[str, str]:
    """What ``when:`` matchers see: the labels plus ``diagnosis``, ``xid_class``, ``attempt`` and ``job_phase``
    (a job incident: what the scheduler said of the job before acting, ``running``, ``waiting``, ``died`` or
    ``unknown``; "" elsewhere)."""
    diagnosis = diagnosis or {}
    return {
        **labels,
        "diagnosis": str(diagnosis.get("category") or ""),
        "xid_class": str(diagnosis.get("xid_class") or ""),
        "attempt": str(attempt),
        "job_phase": job_phase,
    }


def render_params(
    action: Action, raw: Mapping[str, Any], context: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Render a step's ``with:``; PromQL parameters get values escaped for PromQL string literals, markup
    parameters for their markup (``Param.escape``). A reference that renders empty in a required parameter is a
    :class:`ParamError` (``dir: /root/{{ labels.job }}`` without the label must not name the root), except in free
    text for people (``Param.prose``: a reason, a message), where it leaves a gap."""
    rendered = {}
    for name, value in raw.items():
        spec = action.params.get(name)
        try:
            if spec is not None and spec.promql and isinstance(value, str):
                rendered[name] = render_promql(value, context)
            else:
                # Free text for people (Param.prose) keeps a gap where a reference is empty.
                required = spec is not None and spec.required and not spec.prose
                escape = spec.escape if spec is not None else None
                rendered[name] = render_value(value, context, required=required, escape=escape)
        except TemplateError as exc:
            raise ParamError(action.name, name, f"template {exc}") from None
    return rendered


def plan_steps(
    steps: Sequence[Step],
    *,
    registry: ActionRegistry,
    permissions: Permissions,
    template_context: Mapping[str, Mapping[str, Any]],
    when: Mapping[str, str],
    target: Mapping[str, str],
) -> list[PlannedStep]:
    planned = []
    for idx, step in enumerate(steps):
        action = registry.get(step.action)
        base: dict[str, Any] = {"idx": idx, "name": step.name, "action": action, "approval": step.approval}
        if step.when and not matches_all(step.when, when):
            conditions = ", ".join(str(m) for m in step.when)
            planned.append(PlannedStep(**base, status=SKIPPED, reason=f"when: {conditions} does not hold"))
            continue
        rendered: Mapping[str, Any] = step.with_
        try:
            rendered = render_params(action, step.with_, template_context)
            params = action.validate(rendered)
        except ParamError as exc:
            planned.append(PlannedStep(**base, status=INVALID, params=rendered, reason=str(exc)))
            continue
        plan = action.plan(params)
        granted = permissions.allows(action, target) is not None
        planned.append(
            PlannedStep(
                **base,
                status=RUN if granted else WOULD_RUN,
                params=params,
                summary=plan.summary,
                command=plan.command,
                reason="" if granted else permissions.explain(action, target),
            )
        )
    return planned
