"""``nightshift explain`` and the worker on the same payloads, the shipped playbooks and the same scheduler view
decide the same: the same plan (action, status, command), the same collect steps, the same outcome. Both call
:func:`app.domain.incident_policy.decide`; explain gathers its facts read-only (issue 20: explain printed "advisory, 0
whitelisted" for ``job-gone-slurm`` while the worker requeued the job, and omitted the collect steps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app import build_engine
from app.clients import Clients
from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.domain.permissions import Grant, Permissions
from app.engine import Engine
from tests.fakes import FakeClock, FakePrometheus, FakeSample, FakeSlurm
from tests.payloads import alert, payload, xid

ROOT = Path(__file__).resolve().parents[2]
GONE = {"alertname": "TrainingMetricsAbsent", "slurm_job_id": "4242", "severity": "warning"}
RECHECK = 'ALERTS{alertname="GpuXidError",alertstate="firing",Hostname="node2",xid="79"}'


def engine(tmp_path: Path, job_state: str, grants: tuple[str, ...]) -> Engine:
    settings = Settings(data_dir=str(tmp_path), playbook_paths=[str(ROOT / "playbooks")])
    settings.episodes.correlation_seconds = 0
    prometheus = FakePrometheus()
    prometheus.answers[RECHECK] = [FakeSample({"Hostname": "node2"}, 1)]
    return build_engine(
        settings,
        clock=FakeClock(),
        permissions=Permissions(Grant(action=name) for name in grants),
        clients=Clients(
            settings, prometheus=prometheus, slurm=FakeSlurm({"4242": (job_state, "node1,node2")})
        ),
        workloads=None,
    )


UNRUN = {"would_run", "skipped", "invalid"}


def planned(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Steps as planned: (action, status, command); a step that ran (whatever its outcome) was planned to run."""
    return [(r["action"], r["status"] if r["status"] in UNRUN else "pending", r["command"]) for r in rows]


def both(
    tmp_path: Path, body: dict[str, Any], job_state: str, grants: tuple[str, ...] = ()
) -> tuple[Any, Any]:
    """The worker's incident after one tick (its step rows), and explain's episode, on the same payload."""
    e = engine(tmp_path, job_state, grants)
    (episode,) = e.explain(parse_notification(json.dumps(body)))["episodes"]
    (incident_id,) = e.ingest(parse_notification(json.dumps(body))).opened
    e.lifecycle.work_once("w")
    detail = e.incident(incident_id)
    assert detail is not None
    return detail, episode


def steps_of(detail: dict[str, Any], phase: str) -> list[dict[str, Any]]:
    return [s for s in detail["steps"] if s["phase"] == phase]


@pytest.mark.parametrize(
    ("job_state", "grants", "outcome", "status"),
    [
        # The job died: the requeue's `when: job_phase="died"` holds; granted, the worker acts and explain says so.
        ("FAILED", ("slurm.requeue_job",), "acting", "pending"),
        ("FAILED", (), "advisory", "would_run"),
        # Still running without metrics: the requeue is skipped, nothing is whitelisted to do: advisory.
        ("RUNNING", ("slurm.requeue_job",), "advisory", "skipped"),
    ],
)
def test_job_gone_follows_the_job_phase_in_explain_as_in_the_worker(
    tmp_path: Path, job_state: str, grants: tuple[str, ...], outcome: str, status: str
) -> None:
    detail, episode = both(tmp_path, payload(alert(GONE)), job_state, grants)
    inc = detail["incident"]
    assert inc["playbook"] == episode["playbook"] == "job-gone-slurm"
    assert episode["job_plan"]["outcome"] == outcome
    # The worker started attempt 1 (its step then failed on the fake scheduler), or closed advisory.
    assert (inc["attempt"], inc["outcome"]) == ((1, None) if outcome == "acting" else (0, "advisory"))
    worker = planned(steps_of(detail, "steps"))
    assert worker == planned(episode["job_plan"]["steps"])
    assert [s for _, s, _ in worker] == [status]
    # The collect steps explain lists are those the worker ran.
    assert planned(steps_of(detail, "collect")) == planned(episode["collect"])
    assert [a for a, _, _ in planned(episode["collect"])] == ["slurm.job_log"]


def test_a_job_that_completed_is_left_alone_by_both(tmp_path: Path) -> None:
    detail, episode = both(tmp_path, payload(alert(GONE)), "COMPLETED", ("slurm.requeue_job",))
    assert detail["incident"]["outcome"] == "completed"
    assert episode["job_plan"]["outcome"].startswith("completed (job 4242 is COMPLETED")
    assert steps_of(detail, "steps") == [] and episode["job_plan"]["steps"] == []


def test_an_xid_episode_plans_the_same_requeue_off_the_culprit(tmp_path: Path) -> None:
    body = payload(alert(xid(node="node2", job="4242")))
    detail, episode = both(tmp_path, body, "FAILED", ("slurm.requeue_job",))
    assert detail["incident"]["attempt"] == 1 and episode["job_plan"]["outcome"] == "acting"
    worker = planned(steps_of(detail, "steps"))
    assert worker == planned(episode["job_plan"]["steps"])
    assert "ExcNodeList=node2" in worker[0][2]
    assert episode["job_plan"]["excluded"] == ["node2"] and detail["incident"]["node"] == "node2"
    verdicts = [r["data"]["guard"] for r in detail["ledger"] if r["kind"] == "guard"]
    assert verdicts == [v["guard"] for v in episode["job_plan"]["guards"]] + ["recheck"]
