"""The scenarios of the real-torch e2e tests (tests/e2e/test_torch_*.py): a two-node DDP job on the stack, a fault,
its job incidents once closed, the resume; and the assertions they share. Not a test module.

Each scenario asserts invariants of its own job only (its incidents, its requeues, its resume), never counts of
alerts or timings. ``E2E_ARTIFACTS_DIR`` keeps each scenario's job log and incidents (the real output) and the
figures of the issue (``figures.json``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.domain.paging import PAGE_OUTCOMES
from sim import torch_job
from sim.stack import Stack
from sim.torch_trainer import newest_checkpoint
from tests.fixtures.procs import wait_until

NODES = ["node1", "node2"]
CULPRIT = "node2"
START_TIMEOUT = 240  # a torch job's start under load: four processes importing torch on two shared cores
# The loss of a resumed run at its first logged step is within this factor of the checkpoint's (a run that
# restarted from scratch logs a loss tens of times higher: the model's untrained loss is ~16, trained ~0.1).
LOSS_TOLERANCE = 2.0
# Where each scenario's job log and job incidents are written when set (the real output, for the diagnosis).
ARTIFACTS = os.environ.get("E2E_ARTIFACTS_DIR")


# How an incident closes when it decided nothing: its alerts resolved first, or nothing was at fault.
UNDECIDED = ("resolved", "benign", "completed", "ignored", "self_recovered")  # closed without acting


@dataclass
class Scenario:
    """What one fault did to one job: its id, the checkpoint step at the fault, its job incidents once closed."""

    stack: Stack
    name: str
    job: str
    checkpoint: int
    fault_at: float
    incidents: list[dict[str, Any]] = field(default_factory=list)  # details: incident, alerts, steps, ledger
    running_again_s: float | None = None
    log: str = ""

    @property
    def incident(self) -> dict[str, Any]:
        """The one job incident that decided something (acted, or handed the job to a person). Others may have
        opened and closed on their own meanwhile (an alert resolved before any action), never a second decision."""
        decided = [d["incident"] for d in self.incidents if d["incident"]["outcome"] not in UNDECIDED]
        assert len(decided) == 1, [(d["incident"]["id"], d["incident"]["outcome"]) for d in self.incidents]
        return decided[0]

    def requeues(self) -> list[dict[str, Any]]:
        return [
            s
            for d in self.incidents
            for s in d["steps"]
            if s["action"] == "slurm.requeue_job" and s["status"] == "ok"
        ]


def job_incidents(stack: Stack, job: str) -> list[dict[str, Any]]:
    return [i for i in stack.nightshift.incidents(job=job) if i.get("kind") == "job"]


def decided_and_closed(stack: Stack, job: str) -> bool:
    """Whether a job incident of ``job`` closed with a decision (not one of :data:`UNDECIDED`) and none is open."""
    incidents = job_incidents(stack, job)
    closed = [i for i in incidents if i["outcome"] and i["outcome"] not in UNDECIDED]
    return bool(closed) and all(i["outcome"] for i in incidents)


def start(stack: Stack, name: str, nodes: list[str] = NODES, **options: Any) -> tuple[str, int]:
    """Submit a torch job on ``nodes``, wait until it trains and has checkpointed; (job id, checkpoint step)."""
    job = stack.submit_torch(name, nodes, **options)
    stack.wait_training(job, nodes, timeout=START_TIMEOUT)
    stack.wait_window(job, nodes[0])
    root = stack.checkpoint_dir(name)
    newest = wait_until(lambda: newest_checkpoint(root), 60, f"a checkpoint of {name}")
    return job, newest[0]  # type: ignore[index]


def run(
    stack: Stack,
    name: str,
    fault: Callable[[Scenario], None],
    recovers: bool,
    avoid: tuple[str, ...] = (),
    before_cancel: Callable[[Scenario], None] | None = None,
    **options: Any,
) -> Scenario:
    """Start job ``name``, wait for a checkpoint, ``fault(scenario)``, then wait for its job incident to close and
    (``recovers``) the job to run again off ``avoid`` from a checkpoint. ``before_cancel(scenario)``, once its
    incidents and log are read, measures what needs the job still there (its series, a node's repair). Cancels the
    job at the end."""
    job, checkpoint = start(stack, name, **options)
    scenario = Scenario(stack, name, job, checkpoint, time.time())
    try:
        fault(scenario)
        # The incident that decides: others may open and close on their own first (an alert resolved meanwhile).
        wait_until(
            lambda: decided_and_closed(stack, job), 300, f"a job incident of {job} deciding and closing"
        )
        if recovers:
            stack.wait_running(job, avoid=list(avoid), timeout=180)
            scenario.running_again_s = time.time() - scenario.fault_at
            wait_until(lambda: torch_job.resumes(stack.job_log(job)), START_TIMEOUT, f"{job} resumed")
            # A loss line of the resumed run (every 10 steps) for the loss check.
            resumed_at = torch_job.resumes(stack.job_log(job))[-1].step
            wait_until(
                lambda: any(s > resumed_at for s, _ in torch_job.losses(after_resume(stack.job_log(job)))),
                60,
                f"{job} training after its resume",
            )
        scenario.incidents = [stack.nightshift.incident(i["id"]) for i in job_incidents(stack, job)]
        scenario.log = stack.job_log(job)
        if before_cancel:
            before_cancel(scenario)
    finally:
        stack.slurm.command("scancel", job, check=False)
        keep(stack, name, job)
    for node in NODES:  # a culprit taken out and held is released, as a person would once it is fixed
        stack.return_node(node)
    if ARTIFACTS:
        figures([scenario])  # each scenario's, also when its module's test_figures does not run
    return scenario


def keep(stack: Stack, name: str, job: str) -> None:
    """Write the job's log and incidents under :data:`ARTIFACTS` (when set)."""
    if not ARTIFACTS:
        return
    directory = Path(ARTIFACTS)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.log").write_text(stack.job_log(job))
    details = [stack.nightshift.incident(i["id"]) for i in stack.nightshift.incidents(job=job)]
    (directory / f"{name}.incidents.json").write_text(json.dumps(details, indent=2, default=str))


def after_resume(log: str) -> str:
    """The part of a job's log after its last resume line."""
    return log.rsplit("resuming from step", 1)[-1]


def assert_resumed_from_checkpoint(scenario: Scenario) -> None:
    """The run after the restart loaded the newest checkpoint (or a newer one) and its loss continues."""
    resume = torch_job.resumes(scenario.log)[-1]
    assert resume.step >= scenario.checkpoint > 0
    # The loss logged with the newest save of that step before the resume: a save on request lands on any step,
    # not only on the steps whose loss is logged (under load, seen: the requested save at a step between them).
    before = scenario.log.rsplit("resuming from step", 1)[0]
    saved = {step: loss for step, loss in torch_job.saves(before) if step == resume.step}
    assert saved and abs(saved[resume.step] - resume.loss) < 1e-3  # the checkpoint's loss is the one saved
    after = [
        loss
        for step, loss in torch_job.losses(scenario.log.split("resuming from step")[-1])
        if step > resume.step
    ]
    assert after and after[0] < LOSS_TOLERANCE * resume.loss + 0.05, (resume, after[:3])


def diagnosis(scenario: Scenario) -> dict[str, Any]:
    return scenario.incident.get("diagnosis") or {}


def assert_recovered_off(scenario: Scenario, culprit: str) -> None:
    incident = scenario.incident
    assert (incident["outcome"], incident["job"]) == ("recovered", scenario.job), (
        incident.get("reason"),
        diagnosis(scenario),
    )
    assert diagnosis(scenario).get("category") != "application_error", diagnosis(scenario)
    assert [c["node"] for c in incident["culprits"]] == [culprit]
    (requeue,) = scenario.requeues()
    assert culprit in requeue["command"]  # ExcNodeList names the culprit
    assert scenario.stack.slurm.job_restarts(scenario.job) == 1


def received(stack: Stack) -> float:
    """Firing alerts Nightshift's webhook has received (``nightshift_alerts_received_total``)."""
    lines = stack.nightshift.metrics().splitlines()
    return sum(
        float(line.split()[-1])
        for line in lines
        if line.startswith('nightshift_alerts_received_total{status="firing"')
    )


def figures(scenarios: Sequence[Scenario]) -> dict[str, dict[str, Any]]:
    """The figures of the issue per scenario: job incidents, diagnosis, outcome, actions that ran, fault → job
    running again, the checkpoint step at the fault and the step resumed from (written to ARTIFACTS too)."""
    result = {}
    for scenario in scenarios:
        resumed = torch_job.resumes(scenario.log)
        result[scenario.name] = {
            "job_incidents": len(scenario.incidents),
            "decided": sum(1 for d in scenario.incidents if d["incident"]["outcome"] not in UNDECIDED),
            "diagnosis": [
                (
                    (d["incident"].get("diagnosis") or {}).get("category"),
                    (d["incident"].get("diagnosis") or {}).get("culprit"),
                )
                for d in scenario.incidents
            ],
            "outcome": [d["incident"]["outcome"] for d in scenario.incidents],
            "actions": sorted(
                s["action"]
                for d in scenario.incidents
                for s in d["steps"]
                if s["phase"] == "steps" and s["status"] == "ok"
            ),
            "fault_to_running_s": round(scenario.running_again_s, 1) if scenario.running_again_s else None,
            "checkpoint_at_fault": scenario.checkpoint,
            "resumed_from": resumed[-1].step if resumed else None,
        }
    if ARTIFACTS:
        directory = Path(ARTIFACTS)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "figures.json"
        known = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**known, **result}, indent=2, default=str))
    return result


def ended_on_purpose(stack: Stack, name: str, stop: Callable[[str], object], **options: Any) -> Scenario:
    """Start job ``name``, wait for a checkpoint, ``stop(job)`` (the owner's scancel; nothing for a time limit or a
    job that ends at its last step), then wait until the job's metrics have vanished for long enough to alert
    (TrainingMetricsAbsent), Nightshift has received the alert and every incident of the job (there may be none)
    has closed."""
    job, checkpoint = start(stack, name, **options)
    scenario = Scenario(stack, name, job, checkpoint, time.time())
    before = received(stack)
    stop(job)
    absent = f'ALERTS{{alertname="TrainingMetricsAbsent",alertstate="firing",slurm_job_id="{job}"}}'
    try:
        wait_until(lambda: stack.prometheus.query(absent), 240, f"TrainingMetricsAbsent for {job}")
        # Nightshift has had it once its count of firing alerts received grew past the count before the stop.
        wait_until(lambda: received(stack) > before, 60, "Nightshift receiving the alert")
        wait_until(
            lambda: all(i["outcome"] for i in stack.nightshift.incidents(job=job)), 120, "incidents closed"
        )
        scenario.incidents = [stack.nightshift.incident(i["id"]) for i in stack.nightshift.incidents(job=job)]
        scenario.log = stack.job_log(job)
    finally:
        stack.slurm.command("scancel", job, check=False)
        keep(stack, name, job)
    if ARTIFACTS:
        figures([scenario])
    return scenario


def pages(scenario: Scenario) -> list[dict[str, Any]]:
    """Nightshift's notices (the stack's webhook sink) that page a person about the scenario's job
    (:func:`app.domain.paging.page_for`): an incident of the job closed with an outcome for a person, or an alert
    of the job that no playbook matched."""
    ids = {d["incident"]["id"] for d in scenario.incidents}
    notices = [body.get("nightshift") or {} for body in scenario.stack.notices.bodies()]
    return [
        notice
        for notice in notices
        if (notice.get("incident") in ids and notice.get("outcome") in PAGE_OUTCOMES)
        or (notice.get("unmatched") and (notice.get("labels") or {}).get("slurm_job_id") == scenario.job)
    ]


def assert_nothing_done(scenario: Scenario) -> None:
    """No action ran for the job and Slurm never requeued it."""
    acted = [
        s for d in scenario.incidents for s in d["steps"] if s["phase"] == "steps" and s["status"] == "ok"
    ]
    assert acted == [], acted
    assert scenario.stack.slurm.job_restarts(scenario.job) == 0
