"""What comes next for an open incident: pure decisions over the facts the engine gathered.

The engine (:mod:`app.engine.lifecycle`) and ``nightshift explain`` (:mod:`app.engine.explain`) call the same
:func:`decide`. A fact it needs and does not have yet is asked for (:class:`Gather`): the engine gathers it (the
worker from the store and the backends, explain read-only with an empty history) and calls :func:`decide` again with
it, so what is asked, in which order, and what follows from the answers is decided here only::

    open --(correlation window, no culprit)--> open (wait)
      |
      v
    diagnosing --(benign)--> benign
      |
      +-- job: scheduler's view --(completed)--> completed
      |        (unread: ask again, at most ALLOCATION_TRIES)   (too many culprits) --> needs_human
      |        held by a fleet incident (a shared cause; too many culprits no domain explains) --> waiting
      |        the diagnosis blames the job's own code (application_error) --> needs_human (no restart)
      |        running, and the playbook gives its launcher time (self_recovery):
      |            trained again after the fault --> self_recovered;  not yet --> waiting (until the grace ends)
      |        culprits confirmed against the allocation
      v
    plan --(a step invalid)--> needs_human
      |
      v
    guard chain --wait--> waiting (held by a guard) -- re-decided at `until`
      |         --stop--> advisory (plan recorded; culprits' repairs asked) | needs_human | ignored ...
      |  pass        node incident, advisory --> handed to repair (the repair records its own advisory plan)
      v
    live re-check --(no series)--> resolved     (failed: waiting, never acting blind)
      |
      +-- job / target incident --> acting (attempt N+1, its plan) --> verifying --> recovered | attempt failed
      +-- node incident ---------> repairing (its node handed to the repair lifecycle) --> the repair's verdict

A node incident goes through the same chain as a job incident (serialisation, budget, cooldown, stale signal, live
re-check: its history is its node's repairs); only the blast radius is left to the repair, which counts the node
against its partition when it takes it out. Nothing here reads the store, the clock or a backend. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from app.domain import episodes, guards
from app.domain.culprits import Culprit
from app.domain.job_phase import JobPhase
from app.domain.job_phase import JobStatus as JobStatus  # re-exported: callers name policy.JobStatus
from app.domain.planning import INVALID, PlannedStep
from app.domain.playbooks import SELF_RECOVERY_MIN
from app.domain.states import GuardDecision, IncidentKind, IncidentOutcome, RepairState, State

ALLOCATION_TRIES = 3  # looks at a job's allocation before its recovery goes ahead without exclusions
BENIGN_CATEGORIES = frozenset({"benign", "no_fault"})  # diagnosis verdicts that mean "do not act"
# The verdict that the job's own code or configuration failed: a restart alone will not help, a person decides.
CODE_AT_FAULT = "application_error"
# A job trains again when its step counter grew over this window, all of it after the fault (a playbook's
# ``self_recovery`` is at least twice as long).
PROGRESS_WINDOW = SELF_RECOVERY_MIN / 2

# A repaired node incident closes with the repair's verdict.
REPAIR_OUTCOME = {
    RepairState.RETURNED: IncidentOutcome.RECOVERED,
    RepairState.RELEASED: IncidentOutcome.HANDLED,
    RepairState.HELD: IncidentOutcome.NEEDS_HUMAN,
    RepairState.ADVISORY: IncidentOutcome.ADVISORY,
    RepairState.NOT_OURS: IncidentOutcome.NEEDS_HUMAN,
}
REPAIR_SETTLED = frozenset(REPAIR_OUTCOME)


class Need(StrEnum):
    """A fact :func:`decide` asks the engine for."""

    DIAGNOSIS = "diagnosis"  # run the collect steps and the diagnosis
    JOB_STATUS = "job_status"  # the scheduler's view of the job (phase, state, allocation)
    PLAN = "plan"  # the playbook's steps (a node incident: its repair's steps), planned
    GUARDS = "guards"  # the guard chain's inputs over that plan: history, pause, pool
    RECHECK = "recheck"  # the playbook's live re-check, run now
    FLEET = "fleet"  # whether a shared cause holds the job's recovery (a storage outage, the restart storm)
    BLAME = "blame"  # whether the confirmed culprits' leaf/rack/block is to blame (exclusion ``exclude``)
    REPAIR = "repair"  # the state of the repair a node incident handed its node to
    PROGRESS = "progress"  # the job's step counter now and PROGRESS_WINDOW ago (did it train again?)


class IncidentRow(Protocol):
    """The columns of an incident's row the policy reads (:class:`app.store.rows.Incident` has them)."""

    @property
    def kind(self) -> IncidentKind: ...
    @property
    def state(self) -> State | IncidentOutcome: ...
    @property
    def job(self) -> str | None: ...
    @property
    def node(self) -> str | None: ...
    @property
    def act_after(self) -> datetime | None: ...
    @property
    def culprits(self) -> Sequence[Culprit]: ...
    @property
    def diagnosis(self) -> Mapping[str, Any] | None: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def alert_starts_at(self) -> datetime: ...
    @property
    def alert_resolved(self) -> bool: ...


@dataclass(frozen=True)
class Subject:
    """The incident as the policy sees it (built from its row by :meth:`of`)."""

    kind: IncidentKind
    state: State
    job: str | None = None
    node: str | None = None
    act_after: datetime | None = None
    culprits: tuple[Culprit, ...] = ()
    diagnosis: Mapping[str, Any] | None = None
    has_recheck: bool = False
    alertname: str = "alert"
    fault_at: datetime | None = None  # when the incident's first alert started
    alerts_resolved: bool = False  # every alert resolved (a job's restart that waited past them)
    # How long a running job's own launcher (torchrun --max-restarts, a pod's restart policy) is given to bring it
    # back before Nightshift acts (the playbook's ``self_recovery``; None: act at once).
    self_recovery: timedelta | None = None

    @classmethod
    def of(cls, row: IncidentRow, has_recheck: bool, self_recovery: timedelta | None = None) -> Subject:
        return cls(
            kind=row.kind,
            state=State(row.state),
            job=row.job,
            node=row.node,
            act_after=row.act_after,
            culprits=tuple(row.culprits),
            diagnosis=row.diagnosis,
            has_recheck=has_recheck,
            alertname=row.labels.get("alertname", "alert"),
            fault_at=row.alert_starts_at,
            alerts_resolved=row.alert_resolved,
            self_recovery=self_recovery,
        )


@dataclass(frozen=True)
class JobUnread:
    """The scheduler could not say what the job is doing."""

    error: str
    tries: int  # failed reads so far, this one included
    configured: bool = True  # False: no access to the scheduler is configured, asking again cannot help


@dataclass(frozen=True)
class JobAssumed:
    """No scheduler was asked (``nightshift explain`` without one): the culprits are shown as excluded as they
    would be once the scheduler confirms them in the allocation, of a job whose size is unknown."""

    reason: str = ""


@dataclass(frozen=True)
class FleetHold:
    """Whether a shared cause (:mod:`app.engine.fleet_hold`) holds the job's recovery, and until when."""

    until: datetime | None = None


@dataclass(frozen=True)
class Blame:
    """The nodes to exclude instead of the culprits when a leaf, rack or block is at fault (empty: the culprits).
    ``until``: too many culprits that no domain explains; the job waits on a fleet incident for a person.
    ``waived``: a person released that fleet incident: recover excluding none of them."""

    nodes: tuple[str, ...] = ()
    message: str = ""
    until: datetime | None = None
    waived: bool = False


@dataclass(frozen=True)
class Recheck:
    """The live re-check as it ran: its query, the series it returned, or why it failed."""

    expr: str
    samples: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Progress:
    """The job's step counter (the highest of its ranks') now and :data:`PROGRESS_WINDOW` before; None: no
    series (the job exports none, or its processes are between a crash and a restart). ``error``: why it could
    not be read."""

    now: float | None = None
    before: float | None = None
    error: str | None = None

    @property
    def trained(self) -> bool:
        return self.now is not None and self.before is not None and self.now > self.before


@dataclass(frozen=True)
class RepairView:
    """The repair a node incident waits on (``state`` None: the repair is gone)."""

    id: int | None
    state: RepairState | None
    reason: str = ""


@dataclass(frozen=True)
class Limits:
    """The bounds of a decision (from settings)."""

    max_culprits: int = 4
    max_culprit_share: float = 0.5
    defer: timedelta = timedelta(seconds=30)
    allocation_tries: int = ALLOCATION_TRIES


@dataclass(frozen=True)
class Facts:
    """What the engine knows for this decision; None: not gathered (yet)."""

    now: datetime
    limits: Limits = field(default_factory=Limits)
    diagnosed: bool = False
    job: JobStatus | JobUnread | JobAssumed | None = None
    planned: tuple[PlannedStep, ...] | None = None
    guards: guards.GuardFacts | None = None
    recheck: Recheck | None = None
    repair: RepairView | None = None
    fleet: FleetHold | None = None
    blame: Blame | None = None
    progress: Progress | None = None


@dataclass(frozen=True)
class Learned:
    """What the facts taught on the way to a decision, written with it (one transaction)."""

    job_unread: str | None = None  # the ``job_status_unknown`` ledger message
    culprits: tuple[Culprit, ...] | None = None  # the culprits checked against the allocation
    culprit_node: str | None = None  # the first confirmed one: the incident's node
    culprit_message: str = ""
    exclude: tuple[str, ...] = ()  # the nodes the plan keeps the job off
    blame: str = ""  # why the exclusion is a domain's nodes (the ``blame`` ledger row)
    invalid: tuple[PlannedStep, ...] = ()
    verdicts: tuple[guards.Verdict, ...] = ()
    recheck: Recheck | None = None
    progress: str = ""  # what the job's progress said of its own recovery (the ``self_recovery`` ledger row)


@dataclass(frozen=True)
class Gather:
    """Ask the engine for a fact, then decide again. ``exclude``/``job_phase``: what a plan is made with."""

    need: Need
    exclude: tuple[str, ...] = ()
    job_phase: str = ""
    learned: Learned = field(default_factory=Learned)


@dataclass(frozen=True)
class Wait:
    """Look again at ``until``. ``guard``: the verdict holding it (else a correlation window or a retry)."""

    until: datetime
    reason: str
    guard: guards.Verdict | None = None
    correlating: bool = False  # inside the correlation window: the incident stays open
    elsewhere: bool = False  # held by the fleet hold, which wrote its own state: nothing to write here
    learned: Learned = field(default_factory=Learned)


@dataclass(frozen=True)
class Close:
    """Close with ``outcome``. ``advisory``: record the plan (run its granted read-only steps) and ask for the
    repairs of ``exclude`` first."""

    outcome: IncidentOutcome
    reason: str
    advisory: bool = False
    exclude: tuple[str, ...] = ()
    planned: tuple[PlannedStep, ...] = ()  # advisory: the plan recorded
    learned: Learned = field(default_factory=Learned)


@dataclass(frozen=True)
class StartAttempt:
    """Attempt N+1 with its plan, excluding ``exclude`` (their repairs asked in the same transaction)."""

    planned: tuple[PlannedStep, ...]
    exclude: tuple[str, ...] = ()
    learned: Learned = field(default_factory=Learned)

    @property
    def note(self) -> str:
        return f"excluding {', '.join(self.exclude)}" if self.exclude else ""


@dataclass(frozen=True)
class HandToRepair:
    """A node incident: its node goes to the repair lifecycle; the incident waits for the repair's verdict."""

    node: str
    reason: str
    learned: Learned = field(default_factory=Learned)


@dataclass(frozen=True)
class Act:
    """The attempt's steps are under way: run the next one."""


@dataclass(frozen=True)
class Verify:
    """The steps are done: poll the verification."""


Decision = Gather | Wait | Close | StartAttempt | HandToRepair | Act | Verify


def decide(subject: Subject, facts: Facts) -> Decision:
    """The next move of an open incident (a closed one is the engine's bookkeeping: undo steps, effects)."""
    state = subject.state
    if state == State.ACTING:
        return Act()
    if state in (State.VERIFYING, State.WAITING_FOR_RESOURCES):
        return Verify()
    if state == State.REPAIRING:
        return _repair_settled(subject, facts)
    if state not in (State.OPEN, State.DIAGNOSING, State.WAITING):
        return Close(IncidentOutcome.NEEDS_HUMAN, f"unexpected state {state!r}")
    if state == State.OPEN and episodes.must_wait(facts.now, subject.act_after, subject.culprits):
        reason = f"correlating: waiting for the rest of job {subject.job}'s alerts until {subject.act_after:%H:%M:%S}"
        assert subject.act_after is not None
        return Wait(subject.act_after, reason, correlating=True)
    if state in (State.OPEN, State.DIAGNOSING) and not facts.diagnosed:
        return Gather(Need.DIAGNOSIS)
    if benign(subject.diagnosis):
        assert subject.diagnosis is not None
        return Close(IncidentOutcome.BENIGN, f"no fault to act on: {subject.diagnosis.get('summary', '')}")
    if subject.kind == IncidentKind.TARGET and code_at_fault(subject):
        return _to_a_person(subject)
    if subject.kind == IncidentKind.JOB:
        return _job(subject, facts)
    return _guarded(subject, facts, Learned(), exclude=(), job_phase="")


def _job(subject: Subject, facts: Facts) -> Decision:
    """A job incident: the scheduler's view first (completed jobs are left alone, culprits are confirmed)."""
    job = facts.job
    if job is None:
        return Gather(Need.JOB_STATUS)
    learned = Learned()
    status: JobStatus | None = None
    if isinstance(job, JobUnread):
        last = job.tries >= facts.limits.allocation_tries or not job.configured
        then = "recovering the job without excluding any node" if last else "will ask again"
        learned = Learned(
            job_unread=f"cannot read job {subject.job} from the scheduler ({job.error}): {then}"
        )
        if not last:
            return Wait(facts.now + facts.limits.defer, learned.job_unread or "", learned=learned)
    elif isinstance(job, JobStatus):
        status = job
    if status is not None and status.phase == JobPhase.COMPLETED:
        reason = f"job {subject.job} is {status.state}: it ended on purpose or normally, nothing to recover"
        return Close(IncidentOutcome.COMPLETED, reason)
    if subject.alerts_resolved and status is not None and status.phase == JobPhase.RUNNING:
        reason = (
            f"its alerts resolved while its restart waited, and job {subject.job} runs: nothing to recover"
        )
        return Close(IncidentOutcome.RESOLVED, reason)
    if code_at_fault(subject):
        return _to_a_person(subject, learned)
    if facts.fleet is None:
        return Gather(Need.FLEET, learned=learned)
    if facts.fleet.until is not None:
        return Wait(facts.fleet.until, "held by a shared cause", elsewhere=True, learned=learned)
    if status is not None and status.phase == JobPhase.RUNNING and subject.self_recovery:
        own = _own_recovery(subject, facts, learned)
        if not isinstance(own, Learned):
            return own
        learned = own
    if subject.culprits and (status is not None or isinstance(job, JobAssumed)):
        allocation = status.nodes if status is not None else tuple(c.node for c in subject.culprits)
        confirmed = episodes.confirm(subject.culprits, allocation)
        inside = tuple(c.node for c in confirmed if c.confirmed)
        outside = [c.node for c in confirmed if not c.confirmed]
        state = status.state if status is not None else "not asked"
        message = (
            f"job {subject.job} runs on {', '.join(allocation) or 'no node'} ({state or 'unknown'}); "
            f"culprits: {', '.join(inside) or 'none confirmed'}"
            + (f"; outside the allocation (evidence only): {', '.join(outside)}" if outside else "")
        )
        learned = replace(
            learned,
            culprits=confirmed,
            culprit_node=inside[0] if inside else None,
            culprit_message=message,
        )
        if facts.blame is None:
            return Gather(Need.BLAME, exclude=inside, learned=learned)
        if facts.blame.until is not None:
            return Wait(facts.blame.until, "held by a fleet incident", elsewhere=True, learned=learned)
        if facts.blame.nodes:  # a domain at fault: its nodes, whatever the culprits' own limits
            learned = replace(learned, exclude=facts.blame.nodes, blame=facts.blame.message)
        elif facts.blame.waived:  # a person looked at the culprits and released the jobs
            learned = replace(learned, exclude=(), blame=facts.blame.message)
        else:
            limits = facts.limits
            size = len(status.nodes) if status is not None else None
            exclusion = episodes.exclusion(confirmed, size, limits.max_culprits, limits.max_culprit_share)
            if exclusion.refused:
                return Close(IncidentOutcome.NEEDS_HUMAN, exclusion.refused, learned=learned)
            learned = replace(learned, exclude=exclusion.nodes)
    phase = status.phase if status is not None else JobPhase.UNKNOWN
    return _guarded(subject, facts, learned, exclude=learned.exclude, job_phase=phase)


def _to_a_person(subject: Subject, learned: Learned | None = None) -> Close:
    summary = (subject.diagnosis or {}).get("summary", "")
    reason = (
        f"the diagnosis blames the job's own code or configuration ({summary}): a restart alone will not help; "
        "left as it is for a person"
    )
    return Close(IncidentOutcome.NEEDS_HUMAN, reason, learned=learned or Learned())


def _own_recovery(subject: Subject, facts: Facts, learned: Learned) -> Decision | Learned:
    """A running job whose playbook gives its own launcher time to restart it (``self_recovery``): closed when
    it trains again after the fault, held until the grace ends while it does not, then recovered by us. A job
    whose culprit a node's own alert named (a GPU fault) is recovered at once: restarting on that node is futile."""
    grace = subject.self_recovery
    assert grace is not None
    if any(c.playbook for c in subject.culprits):
        return learned
    fault = min(subject.fault_at or facts.now, facts.now)
    deadline = fault + grace
    progress = facts.progress
    if progress is None:
        return Gather(Need.PROGRESS, learned=learned)
    since = facts.now - PROGRESS_WINDOW
    if progress.trained and since >= fault:
        reason = (
            f"job {subject.job} trained again after the fault at {fault:%H:%M:%S} (step {progress.before:g} -> "
            f"{progress.now:g} in the last {PROGRESS_WINDOW.seconds} s): its own launcher recovered it"
        )
        return Close(IncidentOutcome.SELF_RECOVERED, reason, learned=learned)
    if facts.now < deadline:
        seen = (
            f"progress unreadable: {progress.error}"
            if progress.error
            else "no training step seen after the fault yet"
        )
        reason = (
            f"job {subject.job} still runs ({seen}): its own launcher has until {deadline:%H:%M:%S} to bring it "
            f"back (self_recovery {_seconds(grace)})"
        )
        return Wait(deadline, reason, learned=learned)
    why = f"its progress could not be read ({progress.error})" if progress.error else "it did not train again"
    return replace(
        learned, progress=f"job {subject.job} still runs but {why} within {_seconds(grace)} of the fault"
    )


def _seconds(delta: timedelta) -> str:
    return f"{int(delta.total_seconds())} s"


def _guarded(
    subject: Subject, facts: Facts, learned: Learned, *, exclude: tuple[str, ...], job_phase: str
) -> Decision:
    """The plan, the guard chain over it, the live re-check; then act (or hand the node to its repair)."""
    planned = facts.planned
    if planned is None:
        return Gather(Need.PLAN, exclude=exclude, job_phase=job_phase, learned=learned)
    invalid = tuple(p for p in planned if p.status == INVALID)
    if invalid:
        learned = replace(learned, invalid=invalid)
        return Close(
            IncidentOutcome.NEEDS_HUMAN, f"step {invalid[0].name}: {invalid[0].reason}", learned=learned
        )
    if facts.guards is None:
        return Gather(Need.GUARDS, exclude=exclude, job_phase=job_phase, learned=learned)
    verdicts = tuple(guards.evaluate(facts.guards))
    last = verdicts[-1]
    if last.decision == GuardDecision.PASS and subject.has_recheck:
        if facts.recheck is None:
            return Gather(Need.RECHECK, exclude=exclude, job_phase=job_phase, learned=learned)
        check = facts.recheck
        last = guards.recheck(
            check.expr,
            len(check.samples) if check.error is None else None,
            check.error,
            facts.now,
            facts.limits.defer,
        )
        learned = replace(learned, recheck=check)
        verdicts = (*verdicts, last)
    learned = replace(learned, verdicts=verdicts)
    node = subject.kind == IncidentKind.NODE
    if last.decision == GuardDecision.WAIT:
        return Wait(last.until or facts.now + facts.limits.defer, last.reason, guard=last, learned=learned)
    if last.decision == GuardDecision.STOP:
        outcome = IncidentOutcome(last.outcome or IncidentOutcome.NEEDS_HUMAN)
        if outcome == IncidentOutcome.ADVISORY and node:
            # The repair records its plan as advisory and the incident closes with that verdict.
            return HandToRepair(subject.node or "", repair_reason(subject), learned=learned)
        if outcome == IncidentOutcome.ADVISORY:
            return Close(
                outcome, last.reason, advisory=True, exclude=exclude, planned=planned, learned=learned
            )
        return Close(outcome, last.reason, learned=learned)
    if node:
        return HandToRepair(subject.node or "", repair_reason(subject), learned=learned)
    return StartAttempt(planned, exclude=exclude, learned=learned)


def _repair_settled(subject: Subject, facts: Facts) -> Decision:
    repair = facts.repair
    if repair is None:
        return Gather(Need.REPAIR)
    if repair.state is None:
        return Close(IncidentOutcome.NEEDS_HUMAN, f"the repair of node {subject.node} is gone")
    if repair.state not in REPAIR_SETTLED:
        return Wait(
            facts.now + facts.limits.defer, f"node {subject.node}: repair #{repair.id} {repair.state}"
        )
    return Close(
        REPAIR_OUTCOME[repair.state],
        f"node {subject.node}: repair #{repair.id} {repair.state}: {repair.reason}",
    )


def benign(diagnosis: Mapping[str, Any] | None) -> bool:
    return bool(diagnosis) and (diagnosis or {}).get("category") in BENIGN_CATEGORIES


def code_at_fault(subject: Subject) -> bool:
    """Whether the diagnosis blames the job's own code or configuration, and no node's own alert (a GPU fault,
    a straggler) named a culprit that would explain the failure instead."""
    category = (subject.diagnosis or {}).get("category")
    return category == CODE_AT_FAULT and not any(c.playbook for c in subject.culprits)


def repair_reason(subject: Subject) -> str:
    """Why a node incident's node is repaired: its alert and the diagnosis."""
    return f"{subject.alertname}: {(subject.diagnosis or {}).get('summary', '')}"


def learned_of(decision: Decision) -> Learned:
    """What a decision learned on its way (nothing for :class:`Act` and :class:`Verify`)."""
    return getattr(decision, "learned", Learned())
