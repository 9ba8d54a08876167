"""Fleet incidents in the engine: jobs failing from one shared cause are held (never restarted into it), told once,
diagnosed from a sample of their logs, released together when the cause is checked clear or a person says so; a
leaf's jobs are recovered off the leaf; nodes failing behind one leaf wait for it; too many culprits that no
domain explains wait for a person."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from app.clients import Clients
from app.domain import fleet
from app.engine import Engine
from app.engine.fleet_hold import read_record
from app.store import records
from tests.fakes import START, FakeHttpPoster, FakeSample, FakeSlurm
from tests.payloads import alert, xid
from tests.worlds import COLLECT_LOG, PLAYBOOKS, episode_world, nccl

JOBS = {str(j): ("FAILED", f"node{j}a,node{j}b") for j in (101, 102, 103, 104)}
STORAGE_PLAYBOOK = (
    """
---
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: storage, description: "a job's reads fail"}
match: ['alertname="TrainingJobError"', 'error_class="storage_io"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
priority: 40
"""
    + COLLECT_LOG
    + """steps:
  - action: fake.requeue
    with: {job: "{{ target.job }}", exclude_nodes: "{{ incident.culprits }}"}
verify: {promql: 'increase(training_step_total{slurm_job_id="{{ target.job }}"}[2m]) > 0', timeout: 5m,
         interval: 30s}
"""
)
CLEAR_QUERY = 'probe_success{job="storage"} == 0'


# Every job's log: reads of the shared dataset failing (the real diagnosis: storage_io, no culprit node).
EIO = "\n".join(f"OSError: [Errno 5] Input/output error: /datasets/shard-{i:04d}.tar" for i in range(2))


def world(tmp_path, jobs=JOBS, playbooks=PLAYBOOKS, **fleet: Any):
    w = episode_world(tmp_path, slurm=FakeSlurm(jobs), log=EIO, playbooks=playbooks)
    settings = w.engine.deps.settings
    settings.fleet.release_jitter_seconds = 60
    settings.notify.webhook_url = None
    for key, value in fleet.items():
        setattr(settings.fleet, key, value)
    w.engine = Engine(w.engine.deps)  # the fleet settings (a topology) are read when the engine is built
    return w


def listen(w) -> None:
    """The people's notices reach ``w.hook`` (the chat webhook), through the real notification path."""
    deps = w.engine.deps
    deps.settings.notify.webhook_url = "http://people.example/hook"
    w.hook = FakeHttpPoster()
    deps.clients = Clients(deps.settings, prometheus=w.prometheus, slurm=w.slurm, http=w.hook)
    w.engine = Engine(deps)


def logs_read(w) -> int:
    """The job logs the diagnoses read (the collect step's runs)."""
    return len(w.engine.deps.registry.get("fake.logs").script.calls)


def firing(job: str, status: str = "firing", at: timedelta = timedelta(0)) -> dict[str, Any]:
    ends = START + timedelta(minutes=20) if status == "resolved" else None
    return alert(nccl(f"node{job}a", 0, job=job), status=status, starts_at=START + at, ends_at=ends)


def storage(job: str, rank: int = 0) -> dict[str, Any]:
    return alert({**nccl(f"node{job}a", rank, job=job), "error_class": "storage_io"})


def record(w, key: str = "storage_io"):
    with w.engine.deps.store.read() as conn:
        return read_record(conn, key)


def ledger(w, kind: str) -> list[dict[str, Any]]:
    with w.engine.deps.store.read() as conn:
        return [r.as_dict() for r in records.iter_ledger(conn) if r.kind == kind]


def held(w) -> None:
    """Every job of the fleet incident is held and nobody was requeued into the outage."""
    assert all(
        i["state"] == "waiting" and i["reason"].startswith("held by fleet incident") for i in w.incidents()
    )
    assert w.requeue.script.calls == []


def fail_together(w, jobs=JOBS) -> None:
    w.send(*(firing(j) for j in jobs))
    w.clock.advance(46)  # the correlation window
    w.run()
    w.clock.advance(6)  # the first job to decide waits for the others' diagnoses
    w.run()


def test_held_jobs_stay_held_when_their_alerts_resolve_and_go_when_the_clear_query_says_so(tmp_path):
    w = world(tmp_path, clear_queries={"storage_io": CLEAR_QUERY})
    w.prometheus.answers[CLEAR_QUERY] = [FakeSample({"job": "storage"}, 0)]  # the file system is down
    fail_together(w)
    held(w)
    opened = ledger(w, "fleet_incident")
    assert len(opened) == 1 and sorted(record(w).incidents) == sorted(i["id"] for i in w.incidents())
    # The jobs are dead, so their error rates fall and their alerts resolve: that says nothing of the storage.
    w.send(*(firing(j, "resolved") for j in JOBS))
    for _ in range(20):
        w.clock.advance(60)
        w.run()
    held(w)
    assert "1 series: the cause persists" in record(w).why
    # The storage is back: the query returns nothing; the jobs restart together, within the jitter.
    w.prometheus.answers[CLEAR_QUERY] = []
    w.clock.advance(31)
    w.run()
    assert record(w).cleared_by == "query"
    w.clock.advance(61)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(JOBS)


def test_jobs_failing_after_the_fleet_incident_cleared_are_held_by_a_new_one_not_released_into_the_cause(
    tmp_path,
):
    """A flapping file system (bench/storm.py storage-flapping): the jobs restarted when it cleared fail again as it
    comes back, within the fleet window of the clear. Their faults began after the clear: a new fleet incident holds
    them, told once; they are not late members of the cleared one, released into the outage."""
    w = world(tmp_path, clear_queries={"storage_io": CLEAR_QUERY})
    listen(w)
    w.prometheus.answers[CLEAR_QUERY] = [FakeSample({"job": "storage"}, 0)]  # the file system is down
    fail_together(w)
    first = {i["id"] for i in w.incidents()}
    w.prometheus.answers[CLEAR_QUERY] = []  # back
    for j in JOBS:
        w.prometheus.answers[f'increase(training_step_total{{slurm_job_id="{j}"}}[2m]) > 0'] = [
            FakeSample({}, 1)
        ]
    for _ in range(6):
        w.clock.advance(30)
        w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(JOBS)
    assert {w.incident(i)["outcome"] for i in first} == {"recovered"}
    # Down again: every job fails again (its errors a new alert instance), a minute after the clear.
    w.prometheus.answers.clear()
    w.prometheus.answers[CLEAR_QUERY] = [FakeSample({"job": "storage"}, 0)]
    w.send(*(firing(j, at=timedelta(seconds=w.clock.now().timestamp() - START.timestamp())) for j in JOBS))
    for _ in range(70):  # 35 minutes: past the first restarts' cooldown (30 min)
        w.clock.advance(30)
        w.run()
    assert len(w.requeue.script.calls) == len(JOBS)  # none restarted into the outage
    again = {i["id"] for i in w.incidents()} - first
    assert len(again) == len(JOBS) and sorted(record(w).incidents) == sorted(again)
    assert record(w).cleared_at is None and len(ledger(w, "fleet_incident")) == 2
    # The first is kept beside the second, and the second's notice says the cause is back.
    listed = w.engine.fleet.fleet_incidents(limit=10)
    assert [(f["number"], f["current"], f["cleared_by"]) for f in listed] == [
        (2, True, ""),
        (1, False, "query"),
    ]
    assert sorted(m["id"] for m in listed[1]["members"]) == sorted(first)
    told = [b for b in w.hook.bodies if b["nightshift"].get("fleet") == "storage_io"]
    assert len(told) == 2 and "The cause is back: its fleet incident #1 cleared" in told[1]["text"]


def test_without_a_clear_query_one_probe_job_restarts_alone_and_its_recovery_releases_the_others(tmp_path):
    w = world(tmp_path, probe_after_seconds=300, probe_max_seconds=3600)
    fail_together(w)
    held(w)
    w.clock.advance(300)
    w.run()
    (probe,) = w.requeue.script.calls  # one job restarted alone
    # It fails again: the cause persists; the others stay held, the next probe waits twice as long.
    w.clock.advance(120)
    w.send(firing(probe["job"], at=timedelta(minutes=8)))
    w.clock.advance(31)
    w.run()
    state = record(w)
    assert state.probes_failed == 1 and state.probe is None and state.cleared_at is None
    assert len(ledger(w, "fleet_probe_failed")) == 1
    w.clock.advance(550)
    w.run()
    assert len(w.requeue.script.calls) == 1  # 600 s after the failure, not before
    w.clock.advance(60)
    w.run()
    second = w.requeue.script.calls[-1]
    assert len(w.requeue.script.calls) == 2
    # The second probe trains again: its recovery is verified, the cause has cleared, every other job restarts.
    verify = f'increase(training_step_total{{slurm_job_id="{second["job"]}"}}[2m]) > 0'
    w.prometheus.answers[verify] = [FakeSample({"slurm_job_id": second["job"]}, 5)]
    for _ in range(4):
        w.clock.advance(31)
        w.run()
    assert record(w).cleared_by == "probe"
    w.clock.advance(61)
    w.run()
    restarts = [c["job"] for c in w.requeue.script.calls]
    assert sorted(restarts) == sorted([*JOBS, probe["job"]])  # every job once more; the failed probe twice
    assert second["job"] != probe["job"]  # each job is a probe at most once


def test_a_person_releases_the_held_jobs_and_is_ledgered(tmp_path):
    w = world(tmp_path)
    fail_together(w)
    held(w)
    w.engine.fleet.release("storage_io", by="alice", note="the file server is back")
    w.clock.advance(61)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(JOBS)
    (cleared,) = ledger(w, "fleet_cleared")
    assert "released by alice: the file server is back" in cleared["message"]
    assert record(w).cleared_by == "operator alice"


def test_the_storm_guard_never_holds_the_jobs_of_a_released_fleet_incident(tmp_path):
    w = world(tmp_path, probe_after_seconds=300, storm_max_restarts=2)
    fail_together(w)
    w.clock.advance(300)
    w.run()
    assert len(w.requeue.script.calls) == 1  # the probe
    w.engine.fleet.release("storage_io", by="alice")  # while the probe restarts
    w.clock.advance(61)
    w.run()
    assert len(w.requeue.script.calls) == 4  # the three held jobs, past the guard's two: their cause is over
    w.clock.advance(301)  # no job trains again: every verification times out, then the budget's backoff
    w.run()
    w.clock.advance(601)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted([*JOBS, *JOBS])  # each retried, unheld
    assert not [i for i in w.incidents() if (i["reason"] or "").startswith("fleet storm guard")]


def test_only_a_sample_of_the_jobs_logs_is_read_and_the_others_adopt_the_fleet_diagnosis(tmp_path):
    jobs = {str(j): ("FAILED", f"node{j}a,node{j}b") for j in range(201, 211)}
    w = world(tmp_path, jobs=jobs, playbooks=PLAYBOOKS + STORAGE_PLAYBOOK, diagnosis_sample=3)
    w.send(*(storage(j) for j in jobs))
    w.clock.advance(46)
    w.run()
    w.clock.advance(6)
    w.run()
    held(w)
    assert logs_read(w) == 3  # three logs read, not ten
    state = record(w)
    assert len(state.sampled) == 3 and len(state.incidents) == 10
    adopted = [i for i in w.incidents() if (i["diagnosis"] or {}).get("fleet") == "storage_io"]
    assert {i["id"] for i in adopted} == set(state.incidents) - set(state.sampled)
    assert all(i["diagnosis"]["category"] == "storage_io" for i in w.incidents())
    assert "diagnosed from the logs of 3 member jobs" in adopted[0]["diagnosis"]["summary"]


def test_two_jobs_are_not_a_fleet_incident(tmp_path):
    two = dict(list(JOBS.items())[:2])
    w = world(tmp_path, jobs=two)
    w.send(*(firing(j) for j in two))
    w.clock.advance(46)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(two)


def test_the_storm_guard_counts_job_restarts_across_the_fleet(tmp_path):
    three = dict(list(JOBS.items())[:3])
    w = episode_world(tmp_path, slurm=FakeSlurm(three))  # the jobs' own failures (NCCL), not a shared cause
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


# The shipped gpu-xid playbook's re-check: the Xid alert still firing just before acting.
XID_RECHECK = 'ALERTS{alertname="GpuXidError",alertstate="firing",Hostname="{{ labels.Hostname }}"}'
PLAYBOOKS_XID_RECHECK = PLAYBOOKS.replace(
    'metadata: {name: xid, description: "node-scoped"}\n',
    f"metadata: {{name: xid, description: \"node-scoped\"}}\nrecheck: '{XID_RECHECK}'\n",
)


def test_a_job_the_storm_guard_holds_is_restarted_when_the_window_allows_though_its_alerts_resolved(tmp_path):
    three = {j: ("FAILED", f"node{j}a,node{j}b") for j in ("101", "102", "103")}
    w = episode_world(tmp_path, slurm=FakeSlurm(three), playbooks=PLAYBOOKS_XID_RECHECK)
    w.engine.deps.settings.fleet.storm_max_restarts = 2
    w.engine.deps.settings.fleet.storm_window_seconds = 600
    for j in three:
        recheck = XID_RECHECK.replace("{{ labels.Hostname }}", f"node{j}a")
        w.prometheus.answers[recheck] = [FakeSample({"Hostname": f"node{j}a"}, 1.0)]
    w.send(*(alert(xid(node=f"node{j}a", job=j)) for j in three))
    w.clock.advance(46)
    w.run()
    assert len(w.requeue.script.calls) == 2
    (waiting,) = [i for i in w.incidents() if i["reason"].startswith("fleet storm guard")]
    # A dead job's alerts resolve on their own within minutes (the Xid's count window, the job's error rate): they
    # say nothing about whether the job runs again.
    w.clock.advance(300)
    w.prometheus.answers.clear()
    node = f"node{waiting['job']}a"
    w.send(
        alert(xid(node=node, job=waiting["job"]), status="resolved", ends_at=START + timedelta(seconds=340))
    )
    w.run()
    assert w.incident(waiting["id"])["outcome"] is None  # still waiting for its turn, not closed
    w.clock.advance(301)
    w.run()
    assert sorted(c["job"] for c in w.requeue.script.calls) == sorted(three)
    assert w.incident(waiting["id"])["culprits"][0]["node"] == node


# --- topology: a leaf's jobs off the leaf, nodes behind it waiting, culprits no domain explains --------------------

LEAVES = (
    "SwitchName=leaf0 Nodes=n[0-7]\nSwitchName=leaf1 Nodes=n[8-15]\nSwitchName=spine Switches=leaf[0-1]\n"
)


def topology_world(tmp_path, jobs, **fleet: Any):
    path = tmp_path / "topology.conf"
    path.write_text(LEAVES)
    w = episode_world(tmp_path, slurm=FakeSlurm(jobs), max_culprits=2)
    settings = w.engine.deps.settings
    settings.fleet.topology_file = str(path)
    for key, value in fleet.items():
        setattr(settings.fleet, key, value)
    listen(w)
    return w


def test_culprits_all_behind_one_leaf_exclude_the_leaf_and_are_told_once(tmp_path):
    jobs = {"500": ("FAILED", "n1,n2,n9,n10,n11"), "501": ("FAILED", "n3,n12")}
    w = topology_world(tmp_path, jobs)
    w.send(*(alert(xid(node=n, job="500")) for n in ("n9", "n10", "n11")), alert(xid(node="n12", job="501")))
    w.run()
    leaf1 = ",".join(f"n{i}" for i in sorted(range(8, 16), key=lambda i: f"n{i}"))
    calls = {c["job"]: c["exclude_nodes"] for c in w.requeue.script.calls}
    assert calls["500"] == leaf1  # three culprits (over the limit of two), all behind leaf1: the leaf
    assert calls["501"] == leaf1  # the other job behind it in the window too
    (opened,) = ledger(w, "fleet_incident")
    assert opened["message"].startswith("fleet:switch:leaf1")
    assert [b["nightshift"]["fleet"] for b in w.hook.bodies if "fleet" in b["nightshift"]] == ["switch:leaf1"]
    assert w.repair("n13") is None  # the leaf's nodes are excluded, not repaired one by one


def test_nodes_failing_together_behind_one_leaf_wait_for_it_and_are_never_repaired_one_by_one(tmp_path):
    w = topology_world(tmp_path, {})
    w.send(*(alert(xid(node=f"n{i}", job="")) for i in (8, 9, 10, 11)))
    w.run()
    nodes = [i for i in w.incidents() if i["kind"] == "node"]
    assert len(nodes) == 4
    assert all(i["reason"].startswith("held by fleet incident switch:leaf1") for i in nodes)
    assert all(w.repair(f"n{i}") is None for i in (8, 9, 10, 11))
    assert sorted(record(w, "switch:leaf1").incidents) == sorted(i["id"] for i in nodes)
    # A person says the leaf is fine: each node goes through its own repair.
    w.engine.fleet.release("switch:leaf1", by="carol")
    w.clock.advance(121)  # the release jitter
    w.run()
    assert all(w.repair(f"n{i}") is not None for i in (8, 9, 10, 11))


def test_when_the_leaf_is_back_a_node_whose_alert_resolves_a_moment_later_is_not_repaired(tmp_path):
    w = topology_world(tmp_path, {})
    down = [alert(xid(node=f"n{i}", job="")) for i in (8, 9, 10, 11)]
    w.send(*down)
    w.run()
    ended = START + timedelta(minutes=20)
    w.clock.advance(20 * 60)
    w.send(*(alert(a["labels"], status="resolved", ends_at=ended) for a in down[:3]))  # the leaf is back
    w.clock.advance(31)
    w.run()
    assert w.repair("n11") is None  # its resolution is on its way: not the node's own fault
    w.send(alert(down[3]["labels"], status="resolved", ends_at=ended))
    w.run()
    assert all(i["outcome"] == "resolved" for i in w.incidents()) and w.repair("n11") is None


def test_a_node_still_failing_once_the_rest_of_its_leaf_is_back_is_its_own_fault(tmp_path):
    w = topology_world(tmp_path, {})
    down = [alert(xid(node=f"n{i}", job="")) for i in (8, 9, 10, 11)]
    w.send(*down)
    w.run()
    w.clock.advance(20 * 60)
    w.send(*(alert(a["labels"], status="resolved", ends_at=START + timedelta(minutes=20)) for a in down[:3]))
    w.clock.advance(31)
    w.run()
    w.clock.advance(46)  # the correlation window after the others closed
    w.run()
    assert w.repair("n11") is not None and all(w.repair(f"n{i}") is None for i in (8, 9, 10))


def test_too_many_culprits_that_no_domain_explains_are_one_fleet_incident_and_one_page(tmp_path):
    jobs = {"600": ("FAILED", "n1,n9,n2,n10"), "601": ("FAILED", "n3,n11,n4,n12")}
    w = topology_world(tmp_path, jobs, max_domain_nodes=8)  # the spine (16 nodes) is too large to exclude
    w.send(*(alert(xid(node=n, job="600")) for n in ("n1", "n9", "n2")))
    w.send(*(alert(xid(node=n, job="601")) for n in ("n3", "n11", "n4")))
    w.run()
    assert w.requeue.script.calls == []
    jobs_held = [i for i in w.incidents() if i["kind"] == "job"]
    assert len(jobs_held) == 2 and all(i["open_key"] is not None for i in jobs_held)
    assert all(i["reason"].startswith("held by fleet incident unexplained") for i in jobs_held)
    pages = [b for b in w.hook.bodies if b["nightshift"].get("outcome") == "needs_human"]
    assert len(pages) == 1 and pages[0]["nightshift"]["fleet"] == "unexplained"
    # A person took the bad nodes out and releases the jobs: they restart excluding none of the suspects.
    w.engine.fleet.release("unexplained", by="dave", note="drained n1-n4 by hand")
    w.clock.advance(121)  # the release jitter
    w.run()
    assert sorted((c["job"], c.get("exclude_nodes") or "") for c in w.requeue.script.calls) == [
        ("600", ""),
        ("601", ""),
    ]


def test_a_worker_that_opens_a_fleet_incident_another_opened_meanwhile_joins_it_and_tells_nobody(tmp_path):
    """Two workers see a shared cause at once; each found no record when it looked. The second to write finds the
    first's (read under lock) and joins it: one record, told once."""
    w = world(tmp_path, clear_queries={"storage_io": CLEAR_QUERY})
    listen(w)
    w.prometheus.answers[CLEAR_QUERY] = [FakeSample({"job": "storage"}, 0)]
    fail_together(w)
    told = len(w.hook.bodies)
    late = max(i["id"] for i in w.incidents())
    with w.engine.deps.store.read() as conn:
        inc = records.get_incident(conn, late)
    mine = fleet.FleetRecord("storage_io", "storage", "mine", w.clock.now())
    joined = w.engine.fleet._open(inc, mine)
    assert (joined.number, joined.summary) == (1, record(w).summary) and joined.summary != "mine"
    assert len(ledger(w, "fleet_incident")) == 1 and len(w.hook.bodies) == told
