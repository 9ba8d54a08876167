"""The node repair worker: one tick of one due repair (claim, decide, run one step, write), and operator controls.

What comes next is decided by :mod:`app.domain.repair_policy` (pure); this module does the I/O around it. Each
transition is one transaction that writes the repair and its ledger row (:func:`app.store.repairs.write_transition`). A
step is marked ``running`` durably before its action starts; a later claimer that finds it so holds the node for a
person (never re-run blind), except validation, which only looks. Every wait is bounded: a step's retries by
``worker.step_retry_limit``, the node's return by ``repair.return_timeout_seconds``, each action by its own timeouts;
the worker's claim is the incidents' one (:mod:`app.engine.claims`: its lease renewed while a step runs), and a tick
that raises ``worker.max_tick_errors`` times in a row holds the node for a person.

The plan of a repair, from take-out to return (one step each, run one per tick)::

    take_out   the scheduler's (slurm.drain_node, kubernetes.cordon_node: app/domain/schedulers.py); someone
               else's mark: not ours
    repair:<i> the playbook's node_repair.repair steps     (e.g. slurm.reboot_node; none by default)
    validate   node_repair.validate, or the scheduler's validate_node with repair.validation_command
    return     the scheduler's (slurm.resume_node, kubernetes.uncordon_node): only what carries our mark

Every step of the plan must be whitelisted before anything runs; otherwise the repair is advisory (plan recorded).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from app.domain import guards, paging, schedulers
from app.domain import repair_policy as policy
from app.domain.outcome import Outcome, Retry, tail
from app.domain.planning import SKIPPED, PlannedStep, plan_steps, when_context
from app.domain.playbooks import Step
from app.domain.repair_policy import RETURN, TAKE_OUT, VALIDATE
from app.domain.states import REPAIR_SETTLED, Guard, GuardDecision, LedgerKind, RepairState, StepStatus
from app.engine import claims, guard_facts
from app.engine.claims import Claim
from app.engine.context import repair_context
from app.engine.deps import EngineDeps
from app.engine.effects import blast_radius_reached, tell
from app.engine.scheduler_backends import hold_default, pool_facts
from app.engine.steps import action_context, run_action
from app.store import records, repairs
from app.store.claims import REPAIRS
from app.store.rows import Incident, Repair

log = logging.getLogger(__name__)

RepairView = dict[str, Any]  # what the API shows of a node's repairs
_UNSAFE_REASON = re.compile(r"[^A-Za-z0-9 _.,:/=@+#%()\[\]-]")
RETRY_LEDGER_EVERY = 20  # looks at one wait between two of its ledger rows


STEP_NAMES = {TAKE_OUT: "take out", VALIDATE: "validate", RETURN: "return to service"}


def default_steps(scheduler: str) -> dict[str, Step]:
    """The take-out, validation and return steps of the scheduler
    (:meth:`app.domain.schedulers.Scheduler.default_steps`)."""
    return {
        marker: Step(action=action, with_=with_, name=STEP_NAMES[marker])
        for marker, (action, with_) in schedulers.named(scheduler).default_steps().items()
    }


def plan_repair(deps: EngineDeps, repair: Repair, incident: Incident | None) -> dict[str, PlannedStep]:
    """Every step of a repair of ``repair.node``, rendered, validated and checked against the grants, by step
    marker; ``incident`` is the one that asked for it (its labels and diagnosis fill the templates; None: no
    incident asked, or it is gone). Used by the
    repair worker and by ``nightshift explain``."""
    scheduler = repair.scheduler
    defaults = default_steps(scheduler)
    playbook = deps.playbooks.get(repair.playbook) if repair.playbook else None
    node_repair = playbook.node_repair if playbook is not None else None
    validate = (
        node_repair.validate if node_repair is not None and node_repair.validate else defaults[VALIDATE]
    )
    if "run" in deps.registry.get(validate.action).params and "run" not in validate.with_:
        # A validation pod is named after its repair, so a verdict is never read from an earlier one's pod.
        validate = replace(validate, with_={**validate.with_, "run": "{{ node.repair_id }}"})
    steps = {
        TAKE_OUT: defaults[TAKE_OUT],
        **{policy.repair_step(i): step for i, step in enumerate(node_repair.repair if node_repair else ())},
        VALIDATE: validate,
        RETURN: defaults[RETURN],
    }
    labels = incident.labels if incident is not None else {}
    diagnosis = (incident.diagnosis if incident is not None else None) or {}
    node = {
        "name": repair.node,
        "repair_id": str(repair.id),
        "scheduler": scheduler,
        "reason": safe_reason(repair.reason),
    }
    context = repair_context(repair, incident, node)
    planned = plan_steps(
        list(steps.values()),
        registry=deps.registry,
        permissions=deps.permissions,
        template_context=context,
        when=when_context(labels, diagnosis, repair.repairs),
        target={"scheduler": scheduler, "node": repair.node},
    )
    return dict(zip(steps, planned, strict=True))


def safe_reason(text: str) -> str:
    """A repair's reason as a drain reason may carry it (SAFE_TEXT), at most 150 characters."""
    return " ".join(_UNSAFE_REASON.sub(" ", text).split())[:150] or "node repair"


class NodeRepairs:
    """Advances node repairs (one step of one repair per :meth:`work_once`); operator controls and views."""

    def __init__(self, deps: EngineDeps):
        self.deps = deps
        self.claims = claims.Lifecycle(REPAIRS, repairs.get_repair, self._tick, self._tick_failed)

    # --- claiming -----------------------------------------------------------------------------------------------

    def work_once(self, worker: str) -> int | None:
        """Claim one due repair, run its next step, release it. Returns its id, or None when none is due."""
        return claims.work_once(self.deps, self.claims, worker)

    def _tick_failed(self, claimed: Repair, exc: Exception) -> claims.Schedule:
        """Count the failure on the repair as stored: looked at again later, and after ``worker.max_tick_errors``
        in a row the node is held for a person (as an incident goes to one)."""
        deps = self.deps
        with deps.store.read() as conn:
            repair = repairs.get_repair(conn, claimed.id) or claimed
        errors, limit = repair.tick_errors + 1, deps.settings.worker.max_tick_errors
        if errors >= limit:
            held = policy.held(f"processing failed {errors} times in a row: {exc!r}")
            self._transition(repair, held, kind=LedgerKind.ENGINE_ERROR, tick_errors=errors)
            return claims.Schedule.WRITTEN
        later = deps.clock.now() + timedelta(seconds=deps.settings.guards.defer_seconds)
        with deps.store.transaction() as conn:
            repairs.write_transition(
                conn, repair, deps.clock.now(), kind=LedgerKind.ENGINE_ERROR,
                message=f"tick failed ({errors} of {limit}), will retry: {exc!r}",
                next_run_at=later, tick_errors=errors,
            )  # fmt: skip
        return claims.Schedule.WRITTEN

    # --- operator controls and views ------------------------------------------------------------------------------

    def release(self, node: str, by: str, note: str = "") -> RepairView:
        """Release a held node: the worker returns what we took out; nothing else is touched. Raises LookupError
        (no open repair) or ValueError (not held)."""
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            repair = self._open(conn, node)
            following = policy.release(repair.state, repair.taken_out_by_us, by)
            note = f"{following.note}" + (f" ({note})" if note else "")
            values: dict[str, Any] = {"state": following.state, "step": following.step, "held_reason": None}
            if following.step is not None:
                values.update(step_status=StepStatus.PENDING, next_run_at=now, poked=True, released_by=by)
            repairs.write_transition(
                conn, repair, now, kind=LedgerKind.REPAIR_RELEASED, message=note, data={"by": by}, **values
            )
        if following.state in REPAIR_SETTLED:
            self.deps.metrics.node_repairs.labels(following.state).inc()
        return self.node(node)

    def hold(self, node: str, by: str, note: str = "", scheduler: str | None = None) -> RepairView:
        """Hold a node for a person: an open repair stops where it is; a node with none gets a held record, so no
        later request repairs or returns it until released. Raises ValueError (already held, or a step in
        flight right now)."""
        now = self.deps.clock.now()
        with self.deps.store.transaction() as conn:
            repair = repairs.open_repair_of(conn, node)
            following = policy.hold(repair.state if repair else None, by, note)
            if repair is None:
                scheduler = scheduler or hold_default(self.deps.settings)
                repairs.insert_held(
                    conn, node=node, scheduler=scheduler, reason=following.held_reason or "", now=now
                )
            else:
                if (
                    repair.claimed_by is not None
                    and repair.claim_expires_at
                    and repair.claim_expires_at > now
                ):
                    raise ValueError(
                        f"a step of node {node}'s repair is running right now; try again in a moment"
                    )
                repairs.write_transition(
                    conn, repair, now, kind=LedgerKind.REPAIR_HELD, message=following.note, data={"by": by},
                    state=following.state, held_reason=following.held_reason,
                )  # fmt: skip
        self.deps.metrics.node_repairs.labels(RepairState.HELD).inc()
        return self.node(node)

    def _open(self, conn: Any, node: str) -> Repair:
        repair = repairs.open_repair_of(conn, node)
        if repair is None:
            raise LookupError(f"node {node} has no open repair")
        return repair

    def nodes(self, limit: int = 200) -> dict[str, Any]:
        """Every node's latest repair (newest first, at most ``limit``), and the held ones."""
        with self.deps.store.read() as conn:
            rows = repairs.list_repairs(conn, limit=repairs.MAX_LIST)
        latest: dict[str, Repair] = {}
        for row in rows:
            latest.setdefault(row.node, row)
        nodes = [row.as_dict() for row in list(latest.values())[:limit]]
        # Every held repair, also one that a newer repair of the node (or the listing's limit) hides above.
        held = [row.as_dict() for row in rows if row.state == RepairState.HELD]
        return {"nodes": nodes, "held": held}

    def node(self, node: str, limit: int = 50) -> RepairView:
        """A node's repairs, newest first, and its current one (the open repair, else the latest)."""
        with self.deps.store.read() as conn:
            rows = [row.as_dict() for row in repairs.list_repairs(conn, node=node, limit=limit)]
        return {"node": node, "current": rows[0] if rows else None, "repairs": rows}

    def held(self) -> int:
        with self.deps.store.read() as conn:
            return repairs.held_count(conn)

    # --- one tick -----------------------------------------------------------------------------------------------

    def _tick(self, repair: Repair) -> claims.Schedule:
        """One look at a claimed repair; every way through writes the repair's next look itself."""
        crashed = policy.in_flight(repair.step, repair.step_status)
        if crashed is not None:
            self._transition(repair, crashed, kind=LedgerKind.REPAIR_AMBIGUOUS)
        elif repair.state == RepairState.REQUESTED:
            self._start(repair)
        elif repair.step:
            self._run_step(repair)
        else:  # settled or held: nothing is due
            with self.deps.store.transaction() as conn:
                repairs.update_repair(conn, repair.id, self.deps.clock.now(), next_run_at=None)
        return claims.Schedule.WRITTEN

    def _start(self, repair: Repair) -> None:
        """Requested: kill switch, the whole plan whitelisted, blast radius; then take the node out."""
        deps, now = self.deps, self.deps.clock.now()
        defer = timedelta(seconds=deps.settings.guards.defer_seconds)
        with deps.store.read() as conn:
            paused, why = deps.pause_state(conn)
        if paused:
            verdict = guards.Verdict(
                Guard.KILL_SWITCH, GuardDecision.WAIT, f"automation paused: {why or 'no reason given'}"
            )
            return self._wait(repair, verdict, now + defer)
        plan = self._plan(repair)
        problem = policy.plan_problem([(p.name, p.status, p.reason) for p in plan.values()])
        described = [{"step": marker, "command": p.command, "status": p.status} for marker, p in plan.items()]
        if problem is not None:
            state, reason = problem
            settle = policy.held(reason) if state == RepairState.HELD else policy.Next(state, None, reason)
            return self._transition(repair, settle, kind=LedgerKind.REPAIR_PLAN, data={"plan": described})
        facts, note = pool_facts(deps, schedulers.named(repair.scheduler), repair.node)
        window = guard_facts.blast_window(deps.settings)
        with deps.store.read() as conn:
            out = guard_facts.taken_out_nodes(conn, deps.settings, deps.registry, now)
            earlier = repairs.earlier_repairs(
                conn,
                repair.node,
                now - timedelta(seconds=deps.settings.repair.lemon_window_seconds),
                repair.id,
            )
        verdict = guards.blast_radius(
            guards.GuardFacts(
                now=now,
                playbook=repair.playbook or "node-repair",
                node=repair.node,
                alert_starts_at=now,
                takes_out=frozenset({repair.node}),
                taken_out=out,
                blast_max_nodes=deps.settings.guards.blast_radius_max_nodes,
                blast_window=window,
                defer=defer,
                **facts,
            )
        )
        deps.metrics.guard_verdicts.labels(verdict.guard, verdict.decision).inc()
        if verdict.decision != GuardDecision.PASS:
            self._wait(repair, verdict, verdict.until or now + defer)
            # The node keeps its fault and stays in service meanwhile: a person is told (once per blast window).
            blast_radius_reached(
                deps, repair.incident_id, verdict.reason, f"The repair of node {repair.node}"
            )
            return None
        begin = policy.Next(
            RepairState.TAKING_OUT, TAKE_OUT, f"repair {earlier + 1} of this node: taking it out"
        )
        self._transition(
            repair,
            begin,
            kind=LedgerKind.REPAIR_STARTED,
            data={"plan": described, "guard": verdict.as_dict(), "pool": note},
            repairs=earlier + 1,
        )

    def _wait(self, repair: Repair, verdict: guards.Verdict, until: datetime) -> None:
        """Held by a guard: look again at ``until``; the ledger says why once per reason, not once per look."""
        deps = self.deps
        with deps.store.transaction() as conn:
            quiet = repair.held_reason == verdict.reason
            values = {"next_run_at": until, "held_reason": verdict.reason}
            if quiet:
                repairs.update_repair(conn, repair.id, deps.clock.now(), **values)
            else:
                repairs.write_transition(
                    conn, repair, deps.clock.now(), kind=LedgerKind.GUARD, message=f"{verdict.guard}: {verdict.reason}",
                    data=verdict.as_dict(), **values,
                )  # fmt: skip

    def _run_step(self, repair: Repair) -> None:
        deps = self.deps
        marker = repair.step
        assert marker is not None  # _tick runs a step only when one is due
        planned = self._plan(repair).get(marker)
        if planned is None:
            return self._transition(
                repair, policy.held(f"step {marker} is no longer in the plan"), kind=LedgerKind.REPAIR_HELD
            )
        if planned.status == SKIPPED:
            result = policy.Result(StepStatus.OK, reason=planned.reason)
            outcome: Outcome | None = None
        elif not planned.runs:
            reason = f"step {planned.name} is {planned.status} now: {planned.reason}"
            return self._transition(repair, policy.held(reason), kind=LedgerKind.REPAIR_HELD)
        else:
            with deps.store.transaction() as conn:
                repairs.update_repair(conn, repair.id, deps.clock.now(), step_status=StepStatus.RUNNING)
            outcome = self._execute(repair, planned)
            result = _result(marker, outcome, schedulers.named(repair.scheduler))
        lemon = None
        if marker == TAKE_OUT:
            limits = self._limits()
            lemon = policy.lemon_reason(max(repair.repairs - 1, 0), limits)
        following = policy.after_step(
            marker,
            result,
            now=deps.clock.now(),
            repair_steps=len(self._repair_steps(repair)),
            retries=repair.retries,
            limits=self._limits(),
            deadline=repair.deadline,
            lemon=lemon,
            released_by=repair.released_by,
        )
        record = _step_record(marker, planned, outcome, result)
        extra: dict[str, Any] = {}
        if result.status == StepStatus.RETRY:
            extra["retries"] = repair.retries + 1
        else:
            extra.update(retries=0, steps=[*(repair.steps or []), record])
        if marker == VALIDATE and outcome is not None:
            extra["validation"] = {**record, "verdict": (outcome.data or {}).get("verdict")}
        if following.taken_out:
            extra.update(
                taken_out_by_us=True,
                taken_out_at=deps.clock.now(),
                deadline=deps.clock.now() + timedelta(seconds=deps.settings.repair.return_timeout_seconds),
            )
        if result.status != StepStatus.RETRY:
            self._transition(repair, following, kind=LedgerKind.REPAIR_STEP, data={"step": record}, **extra)
        else:
            # A wait (a reboot, a running validation) is ledgered when it starts and every RETRY_LEDGER_EVERY
            # looks after: a 30-minute wait polled every 15 s leaves 6 rows, not 120.
            quiet = repair.retries % RETRY_LEDGER_EVERY != 0 and following.state != RepairState.HELD
            self._transition(
                repair, following, kind=LedgerKind.REPAIR_RETRY, data={"step": record}, quiet=quiet, **extra
            )

    # --- steps --------------------------------------------------------------------------------------------------

    def _repair_steps(self, repair: Repair) -> tuple[Step, ...]:
        playbook = self.deps.playbooks.get(repair.playbook) if repair.playbook else None
        node_repair = playbook.node_repair if playbook is not None else None
        return node_repair.repair if node_repair is not None else ()

    def _plan(self, repair: Repair) -> dict[str, PlannedStep]:
        """Every step of the repair, rendered, validated and checked against the grants, by step marker."""
        incident = None
        if repair.incident_id is not None:
            with self.deps.store.read() as conn:
                incident = records.get_incident(conn, repair.incident_id)
        return plan_repair(self.deps, repair, incident)

    def _execute(self, repair: Repair, planned: PlannedStep) -> Outcome:
        deps = self.deps
        about = {"node": repair.node, "repair_id": repair.id}
        outcome, _ = run_action(
            deps,
            planned.action,
            planned.params,
            action_context(deps, repair.incident_id, about=about),
            Claim(REPAIRS, repair.id, repair.claimed_by or ""),  # claimed: the worker's name
        )
        return outcome

    def _limits(self) -> policy.Limits:
        s = self.deps.settings
        return policy.Limits(
            retry_limit=s.worker.step_retry_limit,
            lemon_repairs=s.repair.lemon_repairs,
            lemon_window=timedelta(seconds=s.repair.lemon_window_seconds),
        )

    def _transition(
        self,
        repair: Repair,
        following: policy.Next,
        *,
        kind: LedgerKind,
        data: Mapping[str, Any] | None = None,
        quiet: bool = False,
        **extra: Any,
    ) -> None:
        """Write ``following`` (state, step, schedule, held reason) and its ledger row in one transaction; ``quiet``:
        one more look at the same wait, written without a ledger row."""
        deps = self.deps
        now = deps.clock.now()
        values: dict[str, Any] = {"state": following.state, "step": following.step, "tick_errors": 0, **extra}
        if following.step is not None:
            values.update(step_status=StepStatus.PENDING, next_run_at=following.run_at or now)
        if following.held_reason is not None or following.state != RepairState.HELD:
            values["held_reason"] = following.held_reason
        with deps.store.transaction() as conn:
            if quiet:
                repairs.update_repair(conn, repair.id, now, **values)
            else:
                repairs.write_transition(
                    conn, repair, now, kind=kind, message=following.note, data=data, **values
                )
        if following.state in REPAIR_SETTLED and repair.state != following.state:
            deps.metrics.node_repairs.labels(following.state).inc()
        if following.state == RepairState.HELD and repair.state != RepairState.HELD:
            taken_out = bool(repair.taken_out_by_us or following.taken_out)
            self._tell_people(repair, following.held_reason or following.note, taken_out)

    def _tell_people(self, repair: Repair, reason: str, taken_out: bool) -> None:
        """A node held for a person: say so on every channel after the transition has committed; a page only
        when we took it out (a take-out refused or failed left it in service: evidence, not a page)."""
        deps = self.deps
        notice = paging.node_held(
            node=repair.node,
            scheduler=repair.scheduler,
            reason=reason,
            repair_id=repair.id,
            incident_id=repair.incident_id,
            external_url=deps.settings.external_url,
            taken_out=taken_out,
        )
        tell(deps, repair.incident_id, notice, about={"node": repair.node, "repair_id": repair.id})


def _result(marker: str, outcome: Outcome, scheduler: schedulers.Scheduler) -> policy.Result:
    """The policy's view of an action's outcome. A take-out counts as ours when the action changed the node or
    found our own mark on it; a return that changed nothing found no mark of ours."""
    data = outcome.data or {}
    reason = getattr(outcome, "reason", "") or outcome.output
    changed = True
    if marker in (TAKE_OUT, RETURN) and data.get("changed") is False:
        changed = marker == TAKE_OUT and scheduler.took_out_ours(data)
        reason = data.get("reason") or outcome.output
    after = outcome.after if isinstance(outcome, Retry) else 0.0
    return policy.Result(StepStatus(outcome.status), reason=tail(reason, 500), after=after, changed=changed)


def _step_record(
    marker: str, planned: PlannedStep, outcome: Outcome | None, result: policy.Result
) -> dict[str, Any]:
    """What the repair keeps of one run of a step (bounded: output tail)."""
    return {
        "step": marker,
        "name": planned.name,
        "action": planned.action.name,
        "status": result.status,
        "command": (outcome.command if outcome is not None else "") or planned.command,
        "exit_code": outcome.exit_code if outcome is not None else None,
        "output": tail(outcome.output) if outcome is not None else "",
        "reason": result.reason,
    }
