"""Fleet incidents in the engine: jobs failing from one shared cause are held, told once, released together."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from app.store import records
from tests.fakes import START, FakeSlurm
from tests.payloads import alert
from tests.unit.test_episodes import make_world, nccl

JOBS = {str(j): ("FAILED", f"node{j}a,node{j}b") for j in (101, 102, 103, 104)}


# Every job's log: reads of the shared dataset failing (the real diagnosis: storage_io, no culprit node).
EIO = "\n".join(f"OSError: [Errno 5] Input/output error: /datasets/shard-{i:04d}.tar" for i in range(2))


def world(tmp_path, jobs=JOBS):
    w = make_world(tmp_path, slurm=FakeSlurm(jobs), log=EIO)
    w.engine.deps.settings.fleet.release_jitter_seconds = 60
    w.engine.deps.settings.notify.webhook_url = None
    return w


def firing(job: str, status: str = "firing") -> dict[str, Any]:
    ends = START + timedelta(minutes=20) if status == "resolved" else None
    return alert(nccl(f"node{job}a", 0, job=job), status=status, ends_at=ends)


def test_jobs_failing_from_one_storage_outage_are_held_then_released_together(tmp_path):
    w = world(tmp_path)
    w.send(*(firing(j) for j in JOBS))
    w.clock.advance(46)  # the correlation window
    w.run()
    w.clock.advance(6)  # the first job to decide waits for the others' diagnoses
    w.run()
    incidents = w.incidents()
    assert len(incidents) == 4
    assert all(
        i["state"] == "waiting" and i["reason"].startswith("held by fleet incident") for i in incidents
    )
    assert w.requeue.script.calls == []  # nobody requeued into the outage
    with w.engine.deps.store.read() as conn:
        record = records.get_control(conn, "fleet:storage_io")
        opened = [
            r for i in incidents for r in records.ledger_for(conn, i["id"]) if r["kind"] == "fleet_incident"
        ]
    assert sorted(record["incidents"]) == sorted(i["id"] for i in incidents)
    assert len(opened) == 1  # one fleet record for the cause
    # The cause clears: the alerts resolve. The held jobs are not closed, they are recovered, within the jitter.
    w.send(*(firing(j, "resolved") for j in JOBS))
    w.run()
    assert all(i["open_key"] is not None for i in w.incidents())
    w.clock.advance(61)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(JOBS)


def test_two_jobs_are_not_a_fleet_incident(tmp_path):
    two = dict(list(JOBS.items())[:2])
    w = world(tmp_path, jobs=two)
    w.send(*(firing(j) for j in two))
    w.clock.advance(46)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(two)


def test_a_person_releases_the_held_jobs(tmp_path):
    w = world(tmp_path)
    w.send(*(firing(j) for j in JOBS))
    w.clock.advance(46)  # the correlation window
    w.run()
    w.clock.advance(6)  # the first job to decide waits for the others' diagnoses
    w.run()
    assert w.requeue.script.calls == []
    w.engine.lifecycle.fleet.release("storage_io", by="alice")
    w.clock.advance(61)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(JOBS)


def test_the_storm_guard_counts_job_restarts_across_the_fleet(tmp_path):
    three = dict(list(JOBS.items())[:3])
    w = make_world(tmp_path, slurm=FakeSlurm(three))  # the jobs' own failures (NCCL), not a shared cause
    w.engine.deps.settings.fleet.storm_max_restarts = 2
    w.engine.deps.settings.fleet.storm_window_seconds = 600
    w.send(*(firing(j) for j in three))
    w.clock.advance(46)
    w.run()
    assert len(w.requeue.script.calls) == 2
    waiting = [i for i in w.incidents() if i["reason"].startswith("fleet storm guard")]
    assert len(waiting) == 1
    w.clock.advance(601)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(three)
