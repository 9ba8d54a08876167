"""Failure episodes with a fake clock: one failure of a multi-node job makes every rank alert, and must become one
recovery of the job that excludes the culprit node, whatever order and replica the alerts reach."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain import episodes
from app.domain.culprits import Culprit
from app.domain.outcome import Failed, Ok
from app.domain.permissions import Permissions
from app.domain.playbooks import PlaybookSet, parse_playbooks
from app.store import Store, records, repairs
from app.store.claims import INCIDENTS
from tests.fakes import START, FakeClock, FakeSample, FakeSlurm
from tests.payloads import alert, xid
from tests.worlds import EPISODE_VERIFY, PLAYBOOKS, World, episode_world, nccl


def test_every_rank_and_the_xid_make_one_job_incident_and_one_requeue_off_the_culprit(tmp_path):
    w = episode_world(tmp_path)
    result = w.send(alert(nccl("node1", 0)), alert(nccl("node2", 1)), alert(xid(node="node2", job="4242")))
    assert len(result.opened) == 1 and len(result.attached) == 2
    w.run()
    inc = w.only()
    assert (inc["kind"], inc["playbook"], inc["node"], inc["state"]) == ("job", "xid", "node2", "verifying")
    assert [c["node"] for c in inc["culprits"] if c["confirmed"]] == ["node2"]
    assert w.requeue.script.calls == [{"job": "4242", "exclude_nodes": "node2"}]
    repair = w.repair("node2")
    assert repair is not None and repair["incident_id"] == inc["id"] and repair["playbook"] == "xid"
    assert w.repair("node1") is None
    w.prometheus.answers[EPISODE_VERIFY] = [FakeSample({"slurm_job_id": "4242"}, 3)]
    w.clock.advance(30)
    w.run()
    assert w.only()["outcome"] == "recovered"
    assert len(w.requeue.script.calls) == 1


def test_without_a_culprit_the_window_is_waited_out_then_one_requeue_excludes_nothing(tmp_path):
    w = episode_world(tmp_path, correlation_seconds=45)
    w.send(alert(nccl("node1", 0)))
    w.run()
    inc = w.only()
    assert inc["state"] == "open" and inc["reason"].startswith("correlating")
    w.clock.advance(30)
    assert w.send(alert(nccl("node2", 1))).attached == [inc["id"]]
    w.run()
    assert w.requeue.script.calls == []
    w.clock.advance(16)
    w.run()
    assert w.requeue.script.calls == [{"job": "4242"}]
    assert w.only()["state"] == "verifying"


def test_a_node_alert_is_decisive_inside_the_window(tmp_path):
    w = episode_world(tmp_path, correlation_seconds=45)
    w.send(alert(nccl("node1", 0)))
    w.run()
    w.clock.advance(5)
    w.send(alert(xid(node="node2", job="4242")))
    w.run()
    assert w.requeue.script.calls == [{"job": "4242", "exclude_nodes": "node2"}]
    assert w.only()["playbook"] == "xid"  # the higher priority plans the recovery


def test_a_culprit_outside_the_jobs_allocation_is_evidence_never_excluded_or_repaired(tmp_path):
    w = episode_world(tmp_path)
    w.send(alert(xid(node="node9", job="4242")))
    w.run()
    inc = w.only()
    assert w.requeue.script.calls == [{"job": "4242"}]
    assert inc["culprits"][0] == {**inc["culprits"][0], "node": "node9", "confirmed": False}
    assert inc["node"] is None and w.repair("node9") is None
    ledger = w.engine.incident(inc["id"])["ledger"]
    assert any("outside the allocation (evidence only): node9" in row["message"] for row in ledger)


def test_too_many_culprits_exclude_none_and_go_to_a_person(tmp_path):
    slurm = FakeSlurm({"4242": ("RUNNING", "node1,node2,node3,node4")})
    w = episode_world(tmp_path, slurm=slurm, max_culprits=2)
    w.send(*(alert(xid(node=f"node{n}", job="4242", gpu=str(n))) for n in (1, 2, 3)))
    w.run()
    inc = w.only()  # held for a person on the fleet incident of culprits no domain explains (docs/fleet.md)
    assert (inc["state"], w.requeue.script.calls) == ("waiting", [])
    assert inc["reason"].startswith("held by fleet incident unexplained: 3 suspect nodes")
    assert "excluding none" in inc["reason"]
    assert all(w.repair(f"node{n}") is None for n in (1, 2, 3))


def test_a_node_alert_without_a_job_opens_a_node_incident_handed_to_repair(tmp_path):
    w = episode_world(tmp_path)
    idle = {k: v for k, v in xid(node="node3").items() if k != "slurm_job_id"}
    w.send(alert(idle))
    w.run()
    inc = w.only()
    assert (inc["kind"], inc["node"], inc["open_key"]) == ("node", "node3", "node:slurm/node3")
    repair = w.repair("node3")
    assert repair is not None and repair["incident_id"] == inc["id"] and repair["state"] == "advisory"
    w.clock.advance(30)
    w.run()
    assert w.only()["outcome"] == "advisory"  # the repair's verdict closes it
    assert w.requeue.script.calls == []


def test_alerts_without_job_or_node_scope_stay_per_target(tmp_path):
    w = episode_world(tmp_path)
    w.send(alert({k: v for k, v in nccl("node1", 0).items() if k != "slurm_job_id"}))
    assert w.only()["kind"] == "target"


def test_a_requeued_job_waiting_for_resources_is_not_a_failed_attempt(tmp_path):
    w = episode_world(tmp_path)
    w.send(alert(xid(node="node2", job="4242")))
    w.run()
    w.slurm.jobs["4242"] = ("PENDING", "")
    for _ in range(30):  # 15 minutes in the queue, three times the verification timeout
        w.clock.advance(30)
        w.run()
    inc = w.only()
    assert inc["state"] == "waiting_for_resources" and inc["attempt"] == 1
    w.slurm.jobs["4242"] = ("RUNNING", "node3,node4")
    w.clock.advance(30)
    w.run()
    assert w.only()["state"] == "verifying"
    w.prometheus.answers[EPISODE_VERIFY] = [FakeSample({}, 1)]
    w.clock.advance(30)
    w.run()
    assert w.only()["outcome"] == "recovered" and len(w.requeue.script.calls) == 1


def test_verification_sees_only_samples_after_the_action(tmp_path):
    w = episode_world(tmp_path)
    w.send(alert(xid(node="node2", job="4242")))
    w.run()
    w.clock.advance(30)
    w.run()
    verifications = [q for q in w.prometheus.queries if "training_step_total" in q]
    assert verifications == ['increase(training_step_total{slurm_job_id="4242"}[30s]) > 0']


# An NCCL error the job survived: progress follows it (the real diagnosis: benign, no fault to act on).
SURVIVED = "\n".join(
    [
        "[rank0]: NCCL WARN NET/IB : Got completion from peer with error 12, opcode 0, len 0, vendor err 129",
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
        *(f"step={i}, skipped=0, loss=2.{i}" for i in range(10)),
    ]
)


def test_a_benign_diagnosis_closes_without_acting(tmp_path):
    w = episode_world(tmp_path, log=SURVIVED, correlation_seconds=0)
    w.send(alert(nccl("node1", 0)))
    w.run()
    inc = w.only()
    assert (inc["diagnosis"]["category"], inc["outcome"], w.requeue.script.calls) == ("benign", "benign", [])


# --- any order, any replica ------------------------------------------------------------------------------------

EPISODE = [
    nccl("node1", 0),
    nccl("node1", 1),
    nccl("node2", 2),
    nccl("node2", 3),
    xid(node="node2", job="4242"),
]
XID = len(EPISODE) - 1  # the index of the culprit's Xid in EPISODE


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    order=st.permutations(range(len(EPISODE))),
    replicas=st.lists(st.integers(0, 2), min_size=len(EPISODE), max_size=len(EPISODE)),
    work=st.lists(st.integers(0, 2), min_size=len(EPISODE), max_size=len(EPISODE)),
    repeats=st.lists(st.booleans(), min_size=len(EPISODE), max_size=len(EPISODE)),
)
def test_no_interleaving_of_the_episode_yields_two_job_recoveries(
    tmp_path_factory, order, replicas, work, repeats
):
    """Three replicas on one store; each alert reaches one of them (HA peers repeat some), workers run between
    deliveries: one job incident, one requeue, off the culprit once it is known."""
    path = tmp_path_factory.mktemp("ha")
    url = f"sqlite:///{path}/shared.db"
    clock = FakeClock()
    slurm = FakeSlurm({"4242": ("RUNNING", "node1,node2")})
    worlds = [episode_world(path, url=url, clock=clock, slurm=slurm) for _ in range(3)]

    def requeues() -> list[dict]:
        return [call for w in worlds for call in w.requeue.script.calls]

    xid_known_at_requeue = (
        True  # unless the requeue is issued before the Xid (the culprit's evidence) arrives
    )
    for i, index in enumerate(order):
        worlds[replicas[i]].send(alert(EPISODE[index]))
        if repeats[i]:
            worlds[(replicas[i] + 1) % 3].send(alert(EPISODE[index]))
        before = len(requeues())
        worlds[work[i]].run()
        if before == 0 and requeues():
            xid_known_at_requeue = XID in [order[j] for j in range(i + 1)]
        clock.advance(2)
    clock.advance(60)
    for w in worlds:
        w.run()
    calls = requeues()
    assert len(worlds[0].incidents()) == 1
    assert len(calls) == 1
    # Off the culprit once it is known; without the Xid no node is blamed (NCCL errors name every rank's node).
    assert calls[0].get("exclude_nodes") == ("node2" if xid_known_at_requeue else None), (order, calls)


# --- crash at any transition boundary ----------------------------------------------------------------------------


class Killed(BaseException):
    """The process dies: nothing after this point runs, the open transaction is never committed."""


def crashing_store(store: Store, at: int) -> list[int]:
    """Make the ``at``-th write transaction of ``store`` die before it commits. Returns the running count."""
    count = [0]
    real = store.transaction

    from contextlib import contextmanager

    @contextmanager
    def transaction() -> Iterable[Any]:
        with real() as conn:
            yield conn
            count[0] += 1
            if count[0] == at:
                raise Killed

    store.transaction = transaction  # type: ignore[method-assign]
    return count


def test_a_kill_between_any_two_writes_leaves_an_incident_the_next_worker_finishes(tmp_path):
    def episode(w: World) -> None:
        w.send(alert(nccl("node1", 0)), alert(xid(node="node2", job="4242")))
        w.prometheus.answers[EPISODE_VERIFY] = [FakeSample({}, 1)]
        w.run()
        w.clock.advance(30)
        w.run()

    clean = episode_world(tmp_path / "clean")
    count = crashing_store(clean.engine.deps.store, at=0)
    episode(clean)
    assert clean.only()["outcome"] == "recovered"
    total = count[0]
    assert total > 10
    for at in range(1, total + 1):
        base = tmp_path / f"crash{at}"
        w = episode_world(base)
        crashing_store(w.engine.deps.store, at)
        with pytest.raises(Killed):
            episode(w)
        # A new process on the same store, after the dead worker's lease has run out.
        clock = w.clock
        clock.advance(seconds=w.engine.deps.settings.worker.lease_seconds + 1)
        after = episode_world(base, clock=clock, slurm=w.slurm)
        after.prometheus.answers[EPISODE_VERIFY] = [FakeSample({}, 1)]
        after.send(alert(nccl("node1", 0)), alert(xid(node="node2", job="4242")))  # Alertmanager re-sends
        for _ in range(4):
            after.run()
            clock.advance(30)
        incidents = after.incidents()
        assert len(incidents) == 1, at
        inc = incidents[0]
        assert inc["outcome"] in ("recovered", "needs_human"), (at, inc["state"], inc["reason"])
        requeues = len(w.requeue.script.calls) + len(after.requeue.script.calls)
        assert requeues <= 1, at  # a requeue that may have run is never run again blind
        with after.engine.deps.store.read() as conn:
            attempts = records.attempts_for_target(conn, None, "slurm/4242", clock.now() - timedelta(days=1))
            errors = [row for row in records.ledger_for(conn, inc["id"]) if row.kind == "engine_error"]
        assert all(a.outcome for a in attempts), at  # no attempt left "in progress"
        assert errors == [], (at, errors[:1])


def test_the_correlation_rules_are_pure():
    a, b = (Culprit(node, "GpuXidError", "xid=79", confirmed=True) for node in ("a", "b"))
    assert episodes.exclusion([a], 2, 2, 0.5).nodes == ("a",)
    assert episodes.exclusion([a], 1, 2, 0.5).nodes == ("a",)  # a one-node job moves
    assert episodes.exclusion([a, b], 2, 2, 0.5).refused  # the whole job: rarely the nodes
    assert episodes.exclusion([a], None, 2, 0.5).nodes == ("a",)
    assert episodes.exclusion([a, replace(b, confirmed=False)], 2, 2, 0.5).nodes == ("a",)  # evidence only
    assert episodes.add_culprit([a], "a", "x", "y") is None
    assert episodes.add_culprit([a], "b", "x", "y") == (a, Culprit("b", "x", "y"))
    assert episodes.confirm([a, b], ["b"]) == (replace(a, confirmed=False), b)


def test_an_unreadable_allocation_is_asked_three_times_then_the_job_recovers_excluding_none(tmp_path):
    class Unreachable(FakeSlurm):
        def job_info(self, job_id: str) -> Any:
            from app.domain.errors import Unavailable

            self.lookups += 1
            raise Unavailable("ssh: connection refused")

    w = episode_world(tmp_path, slurm=Unreachable())
    w.send(alert(xid(node="node2", job="4242")))
    for _ in range(3):
        w.run()
        w.clock.advance(30)
    w.run()
    ledger = w.engine.incident(w.only()["id"])["ledger"]
    assert [r["kind"] for r in ledger].count("job_status_unknown") == 3
    assert w.requeue.script.calls == [{"job": "4242"}]  # job first; the unconfirmed node is not excluded
    assert w.repair("node2") is None  # nor taken out


def test_a_node_alert_on_a_node_already_in_repair_opens_nothing_new(tmp_path):
    w = episode_world(tmp_path)
    with w.engine.deps.store.transaction() as conn:
        repair_id = repairs.request_repair(
            conn,
            node="node3",
            scheduler="slurm",
            playbook="xid",
            incident_id=None,
            reason="held",
            now=w.clock.now(),
        )
        repair = repairs.get_repair(conn, repair_id)
        repairs.write_transition(
            conn, repair, w.clock.now(), kind="repair_held", message="held", state="held"
        )
    idle = {k: v for k, v in xid(node="node3").items() if k != "slurm_job_id"}
    assert w.send(alert(idle)).opened == []
    assert w.incidents() == []


def test_a_job_the_scheduler_says_finished_is_completed_never_requeued(tmp_path):
    w = episode_world(
        tmp_path, slurm=FakeSlurm({"4242": ("COMPLETED", "node1,node2")}), correlation_seconds=0
    )
    w.send(
        alert(
            {
                "alertname": "TrainingJobError",
                "error_class": "nccl",
                "Hostname": "node1",
                "slurm_job_id": "4242",
            }
        )
    )
    w.run()
    inc = w.only()
    assert (inc["outcome"], w.requeue.script.calls) == ("completed", [])
    assert "job 4242 is COMPLETED" in inc["reason"]


def test_a_job_that_died_is_recovered_like_a_crash(tmp_path):
    w = episode_world(
        tmp_path, slurm=FakeSlurm({"4242": ("NODE_FAIL", "node1,node2")}), correlation_seconds=0
    )
    w.send(alert(nccl("node1", 0)))
    w.run()
    assert w.requeue.script.calls == [{"job": "4242"}]


GONE = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: gone, description: "requeue only a job that died"}
match: ['alertname="TrainingMetricsAbsent"']
target: {scheduler: slurm, job: "{{ labels.slurm_job_id }}"}
steps:
  - action: fake.requeue
    with: {job: "{{ target.job }}"}
    when: ['job_phase="died"']
"""


@pytest.mark.parametrize(
    ("state", "outcome", "requeues"),
    [
        ("COMPLETED", "completed", 0),
        ("TIMEOUT", "completed", 0),
        ("FAILED", "unverified", 1),
        ("RUNNING", "advisory", 0),
    ],
)
def test_steps_can_ask_what_the_scheduler_said_of_the_job(tmp_path, state, outcome, requeues):
    w = episode_world(tmp_path, slurm=FakeSlurm({"4242": (state, "node1")}), correlation_seconds=0)
    w.engine.deps.playbooks = PlaybookSet(parse_playbooks(GONE, "gone.yaml", w.engine.deps.registry))
    w.send(alert({"alertname": "TrainingMetricsAbsent", "slurm_job_id": "4242", "train_job": "llama"}))
    w.run()
    assert (w.only()["outcome"], len(w.requeue.script.calls)) == (outcome, requeues)


def test_an_advisory_job_incident_records_its_culprits_repair_plan_too(tmp_path):
    w = episode_world(tmp_path)
    w.engine.deps.permissions = Permissions()  # nothing granted: advisory
    w.send(alert(xid(node="node2", job="4242")))
    w.run()
    assert (w.only()["outcome"], w.requeue.script.calls) == ("advisory", [])
    repair = w.repair("node2")
    assert repair is not None and repair["state"] == "advisory"  # the drain, validation and return would run


def test_the_failed_tick_limit_must_be_positive():
    from app.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match=r"worker\.max_tick_errors: must be positive"):
        load_settings(env={"NIGHTSHIFT_WORKER__MAX_TICK_ERRORS": "0"})


def test_a_straggler_is_excluded_without_a_repair_until_its_third_exclusion_in_the_window(tmp_path):
    jobs = {job: ("RUNNING", "node1,node2,node3") for job in ("51", "52", "53", "54")}
    w = episode_world(tmp_path, slurm=FakeSlurm(jobs))
    straggler = {"alertname": "TrainingStraggler", "Hostname": "node2"}
    for job in ("51", "52"):
        w.send(alert({**straggler, "slurm_job_id": job}))
        w.run()
        assert w.repair("node2") is None  # excluded from the job, left in service
    assert w.requeue.script.calls == [
        {"job": "51", "exclude_nodes": "node2"},
        {"job": "52", "exclude_nodes": "node2"},
    ]
    ledger = [row["message"] for i in w.incidents() for row in w.engine.incident(i["id"])["ledger"]]
    assert any("node2 excluded from job 52 without a repair (2 of 3" in m for m in ledger), ledger
    w.clock.advance(3600)
    w.send(alert({**straggler, "slurm_job_id": "53"}))
    w.run()
    repair = w.repair("node2")
    assert repair is not None and repair["playbook"] == "straggler"  # the third time: the repair lifecycle
    assert w.requeue.script.calls[-1] == {"job": "53", "exclude_nodes": "node2"}


def test_exclusions_older_than_the_window_do_not_count(tmp_path):
    jobs = {job: ("RUNNING", "node1,node2,node3") for job in ("51", "52", "53")}
    w = episode_world(tmp_path, slurm=FakeSlurm(jobs))
    straggler = {"alertname": "TrainingStraggler", "Hostname": "node2"}
    for job in ("51", "52"):
        w.send(alert({**straggler, "slurm_job_id": job}))
        w.run()
    w.clock.advance(25 * 3600)
    w.send(alert({**straggler, "slurm_job_id": "53"}))
    w.run()
    assert w.repair("node2") is None
    assert w.requeue.script.calls[-1] == {"job": "53", "exclude_nodes": "node2"}


# -- a running job's own launcher (torchrun --max-restarts) brings it back -------------------------------------------
RELAUNCHED = PLAYBOOKS.replace("priority: 50\n", "priority: 50\nself_recovery: 3m\n", 1)
STEPS = 'max(training_step_total{slurm_job_id="4242"})'


def steps_over_time(w: World, *, restart_after: float | None) -> None:
    """The job's highest step: 500 up to the fault (the clock's start), no series while torchrun restarts its
    workers, then (``restart_after`` seconds after the fault) one step a second from its checkpoint at step 450."""
    fault = w.clock.now()

    def highest(at: Any) -> list[FakeSample]:
        elapsed = ((at or w.clock.now()) - fault).total_seconds()
        if elapsed <= 0:
            return [FakeSample({}, 500)]
        if restart_after is None or elapsed < restart_after:
            return []
        return [FakeSample({}, 450 + elapsed - restart_after)]

    w.prometheus.over_time[STEPS] = highest


def test_a_job_its_launcher_restarts_is_left_alone_and_closes_self_recovered(tmp_path):
    w = episode_world(tmp_path, playbooks=RELAUNCHED, correlation_seconds=0)
    steps_over_time(w, restart_after=40)
    w.send(alert(nccl("node1", 0)))
    w.run()
    inc = w.only()
    assert inc["state"] == "waiting" and "its own launcher has until" in inc["reason"]
    w.clock.advance(180)  # the grace is over: trained 450 -> 590, the last minute of it after the fault
    w.run()
    inc = w.only()
    assert (inc["outcome"], w.requeue.script.calls) == ("self_recovered", [])
    assert "trained again after the fault" in inc["reason"]


def test_a_job_its_launcher_does_not_bring_back_is_requeued_once_the_grace_ends(tmp_path):
    w = episode_world(tmp_path, playbooks=RELAUNCHED, correlation_seconds=0)
    steps_over_time(w, restart_after=None)
    w.send(alert(nccl("node1", 0)))
    w.run()
    assert w.requeue.script.calls == []
    w.clock.advance(180)
    w.run()
    assert w.requeue.script.calls == [{"job": "4242"}]
    with w.engine.deps.store.read() as conn:
        notes = [r.message for r in records.ledger_for(conn, w.only()["id"]) if r.kind == "self_recovery"]
    assert notes == ["job 4242 still runs but it did not train again within 180 s of the fault"]


def test_a_job_that_died_is_requeued_at_once_whatever_its_launcher(tmp_path):
    w = episode_world(
        tmp_path,
        playbooks=RELAUNCHED,
        correlation_seconds=0,
        slurm=FakeSlurm({"4242": ("FAILED", "node1,node2")}),
    )
    steps_over_time(w, restart_after=None)
    w.send(alert(nccl("node1", 0)))
    w.run()
    assert w.requeue.script.calls == [{"job": "4242"}]
    assert STEPS not in w.prometheus.queries  # nothing to wait for: no launcher restarts a job that ended


def test_the_node_filter_finds_a_job_incident_by_any_of_its_culprits(tmp_path, url: str | None = None):
    """Issue 23 item 7: ``?node=`` read the incident's node column, which holds its first confirmed culprit
    only: a job incident whose second culprit was the node was missed. (PostgreSQL:
    tests/integration/test_postgres_store.py runs this with ``url``.)"""
    w = episode_world(tmp_path, url=url)
    w.send(alert(xid(node="node1", job="4242")), alert(xid(node="node2", job="4242")))
    w.run()
    inc = w.only()
    assert inc["node"] == "node1" and [c["node"] for c in inc["culprits"]] == ["node1", "node2"]
    assert [i["id"] for i in w.engine.incidents(node="node2")] == [inc["id"]]
    assert [i["id"] for i in w.engine.incidents(node="node1", state=inc["state"])] == [inc["id"]]
    assert w.engine.incidents(node="node3") == []


def test_a_straggler_whose_requeue_never_ran_was_not_excluded_and_does_not_count(tmp_path):
    """Three strikes count exclusions that happened: an incident whose requeue failed (or never ran: its job did
    not answer the checkpoint request) excluded nothing, so the third straggler incident is the first exclusion."""
    jobs = {job: ("RUNNING", "node1,node2,node3") for job in ("51", "52", "53")}
    w = episode_world(tmp_path, slurm=FakeSlurm(jobs))
    w.requeue.script.outcomes = [Failed(reason="refused"), Failed(reason="refused"), Ok(output="done")]
    straggler = {"alertname": "TrainingStraggler", "Hostname": "node2"}
    for job in ("51", "52", "53"):
        w.send(alert({**straggler, "slurm_job_id": job}))
        w.run()
    assert [c["job"] for c in w.requeue.script.calls] == ["51", "52", "53"]
    assert w.repair("node2") is None  # the third incident excluded it for the first time
    ledger = [row["message"] for i in w.incidents() for row in w.engine.incident(i["id"])["ledger"]]
    assert any("node2 excluded from job 53 without a repair (1 of 3" in m for m in ledger), ledger


# -- what reaches an incident while a worker holds it ---------------------------------------------------------------
def held_by_a_worker(w: World) -> int:
    """Claim the one due incident as a worker deciding it would (it decides on the row as it reads it now)."""
    with w.engine.deps.store.transaction() as conn:
        claimed = INCIDENTS.claim_next(conn, "deciding", w.clock.now(), timedelta(minutes=2))
    assert claimed is not None
    return claimed


def release(w: World, incident_id: int, after: float) -> None:
    """The worker lets go, meaning to look again ``after`` seconds later (its decision on the row it had read)."""
    now = w.clock.now()
    with w.engine.deps.store.transaction() as conn:
        INCIDENTS.release_to(conn, incident_id, "deciding", now + timedelta(seconds=after), now)


def test_a_culprit_that_joins_while_a_worker_decides_is_acted_on_at_once(tmp_path):
    """The worker decided to wait out the correlation window on the row without the Xid; the Xid joined meanwhile:
    its release must not put the next look back at the window's end (a lost update seen in make demo: 45 s)."""
    w = episode_world(tmp_path, correlation_seconds=45)
    w.send(alert(nccl("node1", 0)))
    incident_id = held_by_a_worker(w)
    w.send(alert(xid(node="node2", job="4242")))
    release(w, incident_id, after=45)
    w.run()
    assert w.requeue.script.calls == [{"job": "4242", "exclude_nodes": "node2"}]


def test_alerts_that_resolve_while_a_worker_decides_close_the_incident_before_it_acts(tmp_path):
    w = episode_world(tmp_path, correlation_seconds=0)
    w.send(alert(nccl("node1", 0)))
    incident_id = held_by_a_worker(w)
    w.send(alert(nccl("node1", 0), status="resolved", ends_at=w.clock.now()))
    release(w, incident_id, after=0)
    w.run()
    assert (w.only()["outcome"], w.requeue.script.calls) == ("resolved", [])
    assert "resolved while a worker held it" in w.only()["reason"]


def test_a_poke_while_nobody_holds_the_incident_changes_nothing_at_its_next_claim(tmp_path):
    """An unheld incident's release after its next claim follows that tick's decision, not an old poke."""
    w = episode_world(tmp_path, correlation_seconds=45)
    w.send(alert(nccl("node1", 0)))
    incident_id = w.only()["id"]
    with w.engine.deps.store.transaction() as conn:
        INCIDENTS.poke(conn, incident_id, w.clock.now())
    w.run()  # claims it (the poke is spent), decides to wait out the window
    inc = w.only()
    assert inc["state"] == "open" and inc["next_run_at"] == w.clock.now() + timedelta(seconds=45)


def test_the_fleet_reads_open_job_incidents_as_their_whole_rows_say(tmp_path, url: str | None = None):
    """The fleet compares each new job incident with every open one from a projection of their columns
    (records.open_job_failures: the diagnosis's category and the alert's error class read in SQL); it must say
    what the whole rows say: diagnosed or not, with culprits or without. (PostgreSQL:
    tests/integration/test_postgres_store.py runs this with ``url``.)"""
    from app.engine import fleet_hold, transitions

    w = episode_world(tmp_path, url=url)
    # Culprits, undiagnosed; the alert's error class, then a diagnosis's category; the alert's error class only.
    w.send(alert(xid(node="node1", job="4242")), alert(xid(node="node2", job="4242")))
    w.send(alert(nccl("node3", 0, job="77")))
    w.send(alert(nccl("node4", 0, job="78")))
    with w.store.transaction() as conn:
        diagnosed = next(i for i in records.list_incidents(conn, open_only=True) if i.job == "77")
        transitions.diagnosed(
            conn, START, diagnosed, {"category": "storage_io", "confidence": 0.9, "summary": "EIO"}, None
        )
    with w.store.read() as conn:
        whole = [r for r in records.list_incidents(conn, open_only=True) if r.kind == "job"]
        got = records.open_job_failures(conn, limit=100)
    assert got == [fleet_hold._failure(r) for r in whole]
    assert sorted((f.job, f.category, f.diagnosed, bool(f.culprits)) for f in got) == [
        ("4242", None, False, True),
        ("77", "storage_io", True, False),
        ("78", "nccl", False, False),
    ]


@pytest.mark.parametrize(("later", "requeued"), [("FAILED", True), ("RUNNING", False)])
def test_a_job_whose_restart_waits_on_a_guard_is_not_abandoned_when_its_alerts_resolve(
    tmp_path, later, requeued
):
    """A job that fails again soon after its recovery waits out its budget's backoff; its alerts resolve meanwhile,
    as a dead job's do within minutes. It is not closed 'blocked' (left dead for good, unpaged: bench/storm.py
    storage-flapping): once the guard allows, a dead job is restarted, a running one closed as resolved."""
    w = episode_world(tmp_path, slurm=FakeSlurm({"4242": ("FAILED", "node1,node2")}))
    w.prometheus.answers[EPISODE_VERIFY] = [FakeSample({}, 1)]
    w.send(alert(nccl("node1", 0)))
    for _ in range(4):
        w.clock.advance(46)
        w.run()
    (first,) = w.incidents()
    assert first["outcome"] == "recovered" and len(w.requeue.script.calls) == 1
    again = w.clock.now()
    w.send(alert(nccl("node1", 0), starts_at=again))
    w.clock.advance(46)
    w.run()
    (waiting,) = [i for i in w.incidents() if i["id"] != first["id"]]
    assert waiting["reason"].startswith("backoff") and waiting["outcome"] is None
    w.clock.advance(300)  # the dead job's error rate falls back: its alert resolves
    w.send(alert(nccl("node1", 0), status="resolved", starts_at=again, ends_at=w.clock.now()))
    w.run()
    assert w.incident(waiting["id"])["outcome"] is None  # still waiting for the backoff, not 'blocked'
    w.slurm.jobs["4242"] = (later, "node1,node2")
    for _ in range(40):  # the backoff and the cooldown (30 min after the recovery), then the verification
        w.clock.advance(60)
        w.run()
    assert len(w.requeue.script.calls) == (2 if requeued else 1)
    assert w.incident(waiting["id"])["outcome"] == ("recovered" if requeued else "resolved")


def test_a_job_that_fails_again_while_its_recovery_is_verified_is_retried_though_its_first_alerts_resolved(
    tmp_path,
):
    """The first alerts resolve while the requeued job is verified; the job fails again (a new alert attaches): at
    the verification's timeout the attempt failed and is retried, not closed 'failed' as if its alerts were all
    resolved (bench/storm.py storage-flapping: 19 jobs paged and left dead)."""
    w = episode_world(tmp_path, slurm=FakeSlurm({"4242": ("FAILED", "node1,node2")}))
    w.send(alert(nccl("node1", 0)))
    w.clock.advance(46)
    w.run()
    assert len(w.requeue.script.calls) == 1
    (incident,) = w.incidents()
    w.clock.advance(120)
    w.send(alert(nccl("node1", 0), status="resolved", ends_at=w.clock.now()))
    w.run()
    w.clock.advance(60)
    w.send(alert(nccl("node1", 0), starts_at=w.clock.now()))  # it failed again
    for _ in range(40):  # the verification's timeout (5 min), the budget's backoff (10 min)
        w.clock.advance(60)
        w.run()
    assert w.incident(incident["id"])["outcome"] != "failed"
    assert len(w.requeue.script.calls) >= 2  # retried
