"""Planned swaps and stragglers ask a job to checkpoint and wait for it (app/actions/checkpoint_request.py): the wait
with a fake clock, and the shipped playbooks on bad input: a job that never answers is left running and a person
told; a job whose ranks export no timing names no straggler and nothing acts."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from app import build_engine
from app.actions import default_registry
from app.actions.base import ActionContext
from app.actions.checkpoint_request import WaitForCheckpoint
from app.clients import Clients
from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.domain.errors import ParamError
from app.domain.outcome import Failed, Ok, Retry
from app.domain.permissions import Grant, Permissions
from app.domain.playbooks import PlaybookSet, parse_playbooks
from app.engine import Engine
from tests.fakes import FakeClock, FakePrometheus, FakeSample, FakeSlurm
from tests.payloads import alert, payload

REPO = Path(__file__).resolve().parents[2]
QUERY = 'max(training_last_checkpoint_timestamp_seconds{slurm_job_id="4242"})'


class CheckpointAt(FakePrometheus):
    """A job whose newest checkpoint time is ``before`` until the clock reaches ``written``, then ``written``."""

    def __init__(self, clock: FakeClock, before: float | None, written: float | None):
        super().__init__()
        self.clock, self.before, self.written = clock, before, written

    def query(self, expr: str, at: datetime | None = None) -> list[FakeSample]:
        answer = super().query(expr, at)
        if expr != QUERY:
            return answer
        now = self.clock.now().timestamp()
        newest = self.written if self.written is not None and now >= self.written else self.before
        return [] if newest is None else [FakeSample({"slurm_job_id": "4242"}, newest)]


def waiting(prometheus: FakePrometheus, clock: FakeClock) -> tuple[ActionContext, list[tuple[str, str]]]:
    settings = Settings()
    polls: list[tuple[str, str]] = []
    ctx = ActionContext(
        settings=settings,
        clients=Clients(settings, prometheus=prometheus),
        clock=clock,
        record=lambda kind, message, data: polls.append((kind, message)),
    )
    return ctx, polls


def test_the_wait_ends_at_the_first_checkpoint_newer_than_the_request() -> None:
    clock = FakeClock()
    asked = clock.now().timestamp()
    prometheus = CheckpointAt(clock, before=asked - 600, written=asked + 40)
    ctx, polls = waiting(prometheus, clock)
    action = WaitForCheckpoint()
    outcome = action.run(action.validate({"query": QUERY, "timeout": 900, "interval": 15}), ctx)
    assert isinstance(outcome, Ok), outcome
    assert outcome.data["checkpoint_time"] == asked + 40
    assert clock.now().timestamp() - asked < 40 + 15  # no poll past the one that saw it
    assert len(polls) == len(prometheus.queries) and all(kind == "checkpoint_poll" for kind, _ in polls)


def test_a_job_that_never_checkpoints_is_left_running_after_the_timeout() -> None:
    """The job's newest checkpoint is the one before the request (or it exports none): Failed once the timeout has
    passed, never sooner, with polls bounded by timeout / interval, and the reason says the job runs on."""
    for before in (1.0, None):  # an old checkpoint; a job exporting no checkpoint marker at all
        clock = FakeClock()
        asked = clock.now().timestamp()
        prometheus = CheckpointAt(clock, before=before and asked - 600, written=None)
        ctx, polls = waiting(prometheus, clock)
        action = WaitForCheckpoint()
        outcome = action.run(action.validate({"query": QUERY, "timeout": 60, "interval": 15}), ctx)
        assert len(polls) == len(prometheus.queries)  # each poll ledgered
        assert isinstance(outcome, Failed), outcome
        assert "no checkpoint within 60s" in outcome.reason and "left running" in outcome.reason
        assert clock.now().timestamp() - asked == 60
        assert len(prometheus.queries) == 60 // 15 + 1


def test_an_unreachable_prometheus_is_retried_not_failed() -> None:
    clock = FakeClock()
    prometheus = FakePrometheus()
    prometheus.down = True
    ctx, _ = waiting(prometheus, clock)
    action = WaitForCheckpoint()
    outcome = action.run(action.validate({"query": QUERY}), ctx)
    assert isinstance(outcome, Retry) and outcome.after == 15


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"timeout": 10}, "timeout"),
        ({"timeout": 7200}, "timeout"),
        ({"timeout": 60, "interval": 90}, "interval"),
    ],
)
def test_the_wait_is_bounded(params: dict[str, int], field: str) -> None:
    with pytest.raises(ParamError, match=field):
        WaitForCheckpoint().validate({"query": QUERY, **params})


# --- the shipped playbooks: a job that does not answer ---------------------------------------------------------------


def shipped_engine(tmp_path: Path, clock: FakeClock, prometheus: FakePrometheus, slurm: FakeSlurm) -> tuple[
    Engine, list[str]
]:  # fmt: skip
    """The engine with the shipped planned-swap and fail-slow playbooks, the checkpoint request and the requeue
    granted, and the notifications people receive."""
    registry = default_registry()
    text = "\n---\n".join(
        (REPO / "playbooks" / name).read_text() for name in ("planned-swap.yaml", "fail-slow.yaml")
    )
    settings = Settings(data_dir=str(tmp_path))
    settings.episodes.correlation_seconds = 0
    settings.notify.webhook_url = "http://chat.example/hook"
    told: list[str] = []

    class Chat:
        def post_json(self, url: str, body: dict[str, Any], headers: Any = None) -> int:
            told.append(body["text"])
            return 200

    engine = build_engine(
        settings,
        clock=clock,
        registry=registry,
        playbooks=PlaybookSet(parse_playbooks(text, "shipped.yaml", registry)),
        permissions=Permissions(
            Grant(action=name) for name in ("slurm.request_checkpoint", "slurm.requeue_job")
        ),
        clients=Clients(settings, prometheus=prometheus, http=Chat(), slurm=slurm),
    )
    return engine, told


WARNING = {"alertname": "GpuEccCorrectableRising", "early_warning": "ecc_correctable", "Hostname": "node2",
           "gpu": "0", "slurm_job_id": "4242"}  # fmt: skip
STRAGGLER = {
    "alertname": "TrainingStraggler",
    "Hostname": "node2",
    "train_job": "llama",
    "slurm_job_id": "4242",
}


@pytest.mark.parametrize(
    ("labels", "playbook"), [(WARNING, "planned-swap-slurm"), (STRAGGLER, "straggler-slurm")]
)
def test_a_job_that_does_not_answer_the_request_is_left_running_and_a_person_told(
    tmp_path: Path, labels: dict[str, str], playbook: str
) -> None:
    """The job announces the signal and is asked; no checkpoint comes: no requeue ever runs (each attempt's wait
    ends the attempt), the budget runs out, the incident goes to a person with the reason, and the job is never
    stopped or moved."""
    clock = FakeClock()
    prometheus = CheckpointAt(clock, before=clock.now().timestamp() - 3600, written=None)
    slurm = FakeSlurm(
        {"4242": ("RUNNING", "node1,node2,node3")}, comments={"4242": "nightshift.checkpoint_signal=B:USR1"}
    )
    engine, told = shipped_engine(tmp_path, clock, prometheus, slurm)
    (incident_id,) = engine.ingest(parse_notification(json.dumps(payload(alert(labels))))).opened
    for _ in range(10):  # the straggler's second attempt comes after its backoff
        engine.run_until_idle(limit=200)
        if engine.incident(incident_id)["incident"]["outcome"]:  # type: ignore[index]
            break
        clock.advance(3600)
    detail = engine.incident(incident_id)
    assert detail is not None
    incident = detail["incident"]
    assert (incident["playbook"], incident["outcome"]) == (playbook, "needs_human"), incident["reason"]
    ran = [(s["name"], s["status"]) for s in detail["steps"] if s["phase"] == "steps"]
    assert ("ask-for-a-checkpoint", "ok") in ran and ("wait-for-the-checkpoint", "failed") in ran
    assert not any(name.startswith("requeue") and status == "ok" for name, status in ran), ran
    attempts = [row for row in detail["ledger"] if row["kind"] == "attempt_started"]
    unanswered = [row for row in detail["ledger"] if row["kind"] == "attempt_failed"]
    assert (
        len(unanswered) == len(attempts) >= 1
    )  # every attempt ended at the wait, with the reason in the ledger
    assert all(
        "no checkpoint within 900s" in row["message"] and "left running" in row["message"]
        for row in unanswered
    )
    assert slurm.signals == [("4242", "B:USR1")] * len(attempts)  # asked once an attempt, nothing else sent
    assert any("needs_human" in text and "wait-for-the-checkpoint" in text for text in told), (
        told
    )  # a person told
    polls = [row for row in detail["ledger"] if row["kind"] == "checkpoint_poll"]
    assert len(polls) == len(attempts) * (900 // 15 + 1)  # every poll ledgered, bounded by the timeout


def test_a_throughput_drop_of_a_job_whose_ranks_export_no_timing_names_no_straggler_and_acts_on_nothing(
    tmp_path: Path,
) -> None:
    """Bad input of the straggler search: the job's ranks export no training_rank_step_seconds. TrainingStraggler
    cannot fire (no series); TrainingThroughputDrop collects the per-rank timing, finds none, and nothing acts: the
    ledger says what was looked for and that it returned nothing."""
    clock = FakeClock()
    slurm = FakeSlurm({"4242": ("RUNNING", "node1,node2,node3")})
    engine, _ = shipped_engine(tmp_path, clock, FakePrometheus(), slurm)
    labels = {
        "alertname": "TrainingThroughputDrop",
        "Hostname": "node2",
        "train_job": "llama",
        "slurm_job_id": "4242",
    }
    (incident_id,) = engine.ingest(parse_notification(json.dumps(payload(alert(labels))))).opened
    engine.run_until_idle(limit=200)
    detail = engine.incident(incident_id)
    assert detail is not None and detail["incident"]["outcome"], detail["incident"]
    timing = [s for s in detail["steps"] if s["name"] == "rank-step-times"]
    assert [s["status"] for s in timing] == ["failed"]
    assert "training_rank_step_seconds_sum" in timing[0]["command"]
    ledger = [row["message"] for row in detail["ledger"] if row["kind"] == "step"]
    assert any("rank-step-times" in m and "query returned no samples" in m for m in ledger), ledger
    assert not [s for s in detail["steps"] if s["phase"] == "steps"]  # nothing acts
    assert slurm.signals == [] and detail["incident"]["culprits"] in ([], None)
