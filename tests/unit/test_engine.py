"""The incident lifecycle with a fake clock, fake actions at our own seam, and a real SQLite store."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from app.clients import Clients
from app.domain.outcome import Ambiguous, CredentialError, Failed, Ok, Retry
from app.domain.playbooks import PlaybookSet, parse_playbooks
from app.store import records
from app.store.claims import INCIDENTS
from tests.fakes import FakeSample, FakeSlurm
from tests.payloads import alert, xid
from tests.worlds import GRANTS, NODE_PLAYBOOK, PLAYBOOK, RECHECK, VERIFY, make_world


def test_default_is_advisory_every_change_would_run_and_nothing_is_called(tmp_path):
    w = make_world(tmp_path)
    result = w.send(alert(xid()))
    assert len(result.opened) == 1
    w.run()
    inc = w.incident(result.opened[0])
    assert (inc["state"], inc["outcome"]) == ("advisory", "advisory")
    assert w.steps(inc["id"]) == [
        ("fake.drain", "would_run"),
        ("fake.requeue", "would_run"),
        ("fake.notice", "ok"),
    ]
    assert w.calls("fake.drain") == [] and w.calls("fake.requeue") == []
    assert inc["diagnosis"]["category"] == "gpu_hardware"  # from the collected log line
    assert w.steps(inc["id"], "collect") == [("fake.logs", "ok")]
    assert any("advisory" in text and "fake.drain" in text for _, text in w.notifications)
    kinds = [row["kind"] for row in w.ledger(inc["id"])]
    assert kinds.count("guard") == 2 and "step_would_run" in kinds and "incident_closed" in kinds


def test_whitelisted_steps_run_then_verification_recovers(tmp_path):
    w = make_world(tmp_path, GRANTS)
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    assert w.incident(incident_id)["state"] == "verifying"
    assert w.calls("fake.drain") == [{"node": "node1", "reason": "Xid 79"}]
    assert w.calls("fake.requeue") == [{"job": "1234"}]
    w.clock.advance(30)
    w.run()  # the job is not stepping yet
    assert w.incident(incident_id)["state"] == "verifying"
    w.prometheus.answers[VERIFY] = [FakeSample({"slurm_job_id": "1234"}, 12.0)]
    w.clock.advance(30)
    w.run()
    inc = w.incident(incident_id)
    assert (inc["state"], inc["attempt"], inc["open_key"]) == ("recovered", 1, None)
    assert [row["message"] for row in w.ledger(incident_id, "verify_sample")] == ["0 series", "1 series"]
    guards_seen = [row["data"]["guard"] for row in w.ledger(incident_id, "guard")]
    assert guards_seen == [
        "kill_switch",
        "permission",
        "blast_radius",
        "serialisation",
        "budget",
        "job_budget",
        "cooldown",
        "stale_signal",
        "recheck",
    ]


def test_duplicates_and_repeats_attach_to_the_open_incident(tmp_path):
    w = make_world(tmp_path, GRANTS)
    first = w.send(alert(xid()))
    again = w.send(alert(xid()))  # Alertmanager retry / HA peer
    other_gpu = w.send(alert(xid(gpu="5")))  # another alert, same (playbook, target)
    assert len(first.opened) == 1 and again.opened == [] and other_gpu.opened == []
    assert other_gpu.attached == first.opened
    assert len(w.engine.incidents()) == 1


def test_resolved_before_acting_closes_and_late_firing_is_ignored(tmp_path):
    w = make_world(tmp_path, GRANTS)
    firing = alert(xid())
    incident_id = w.send(firing).opened[0]
    resolved = {**firing, "status": "resolved", "endsAt": "2026-12-02T03:01:00Z"}
    assert w.send(resolved).closed == [incident_id]
    assert w.incident(incident_id)["outcome"] == "resolved"
    late = w.send(firing)  # out of order: the firing copy arrives after the resolution
    assert late.opened == [] and late.attached == []
    w.run()
    assert w.calls("fake.drain") == []


def test_resolved_while_acting_lets_verification_finish_and_runs_undo_steps(tmp_path):
    w = make_world(tmp_path, GRANTS)
    firing = alert(xid())
    incident_id = w.send(firing).opened[0]
    w.run()
    w.prometheus.answers[VERIFY] = [FakeSample({}, 3.0)]
    w.clock.advance(30)
    w.run()
    assert w.incident(incident_id)["outcome"] == "recovered"
    w.send({**firing, "status": "resolved", "endsAt": "2026-12-02T03:05:00Z"})
    w.run()
    assert w.steps(incident_id, "on_resolved") == [("fake.resume", "ok")]
    assert w.calls("fake.resume") == [{"node": "node1"}]


def test_budget_backoff_then_needs_human(tmp_path):
    w = make_world(tmp_path, GRANTS)
    incident_id = w.send(alert(xid())).opened[0]
    for attempt in (1, 2):
        w.run()
        assert len(w.calls("fake.drain")) == attempt
        w.clock.advance(minutes=5, seconds=1)  # verification times out after 5m
        w.run()
        inc = w.incident(incident_id)
        assert inc["state"] == "waiting" and inc["reason"] == f"backoff 10m after attempt {attempt}"
        w.clock.advance(minutes=9)
        w.run()
        assert len(w.calls("fake.drain")) == attempt  # 10m backoff after the failed attempt still holds
        w.clock.advance(minutes=1)
    w.run()
    assert len(w.calls("fake.drain")) == 3
    w.clock.advance(minutes=5, seconds=1)
    w.run()  # the third verification fails: the budget is spent, no fourth attempt
    inc = w.incident(incident_id)
    assert (inc["outcome"], len(w.calls("fake.drain"))) == ("needs_human", 3)
    assert "3 attempt(s) in the last 1d (budget 3)" in inc["reason"]


def test_cooldown_then_stale_signal(tmp_path):
    w = make_world(tmp_path, GRANTS)
    first = w.send(alert(xid())).opened[0]
    w.run()
    w.prometheus.answers[VERIFY] = [FakeSample({}, 3.0)]
    w.clock.advance(30)
    w.run()
    assert w.incident(first)["outcome"] == "recovered"
    # A new instance of the fault 10 minutes later: held by the 30m cooldown.
    w.clock.advance(minutes=10)
    second = w.send(alert(xid(), starts_at=w.clock.now())).opened[0]
    w.run()
    assert w.incident(second)["state"] == "waiting" and "cooldown" in w.incident(second)["reason"]
    assert len(w.calls("fake.drain")) == 1
    # An alert that started before our successful remediation is stale.
    stale = w.send(alert(xid(gpu="6"), starts_at=w.clock.now() - timedelta(hours=1)))
    assert stale.attached == [second]


def test_serialisation_one_incident_per_node_at_a_time(tmp_path):
    """Alerts without a job identity keep one incident per (playbook, target), serialised per node."""
    extra = NODE_PLAYBOOK.replace("gpu-xid-79", "gpu-xid-79-second").replace('xid=~"79|48"', 'gpu="3"')
    w = make_world(tmp_path, GRANTS, playbooks=NODE_PLAYBOOK + "---\n" + extra)
    opened = w.send(alert(xid())).opened
    assert len(opened) == 2
    w.run()
    states = sorted(w.incident(i)["state"] for i in opened)
    assert states == ["verifying", "waiting"]
    waiting = next(i for i in opened if w.incident(i)["state"] == "waiting")
    assert "waiting for incident #" in w.incident(waiting)["reason"]


def test_blast_radius_holds_the_fourth_node_and_notifies_once(tmp_path):
    w = make_world(tmp_path, GRANTS, blast_radius_max_nodes=3)
    opened = []
    for n in range(1, 6):
        w.prometheus.answers[RECHECK.replace("node1", f"node{n}")] = [FakeSample({}, 1)]
        opened += w.send(alert(xid(node=f"node{n}", job=str(100 + n)))).opened
    w.run()
    states = [w.incident(i)["state"] for i in opened]
    assert states.count("verifying") == 3 and states.count("waiting") == 2
    assert len({c["node"] for c in w.calls("fake.drain")}) == 3
    storm = [text for _, text in w.notifications if "blast radius" in text.lower() or "disrupted" in text]
    assert len(storm) == 1


def test_kill_switch_pauses_and_resume_continues(tmp_path):
    w = make_world(tmp_path, GRANTS)
    w.engine.set_paused(True, "maintenance window", by="test")
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    assert w.incident(incident_id)["state"] == "waiting"
    assert "maintenance window" in w.incident(incident_id)["reason"]
    assert w.calls("fake.drain") == []
    w.engine.set_paused(False, "done", by="test")
    w.clock.advance(30)
    w.run()
    assert w.incident(incident_id)["state"] == "verifying"


def test_recheck_no_longer_firing_closes_without_acting_and_prometheus_down_waits(tmp_path):
    w = make_world(tmp_path, GRANTS)
    w.prometheus.down = True
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    assert w.incident(incident_id)["state"] == "waiting"
    assert "not acting blind" in w.incident(incident_id)["reason"]
    w.prometheus.down = False
    w.prometheus.answers[RECHECK] = []
    w.clock.advance(30)
    w.run()
    assert w.incident(incident_id)["outcome"] == "resolved"
    assert w.calls("fake.drain") == []


def test_retry_outcome_waits_and_runs_again(tmp_path):
    w = make_world(tmp_path, GRANTS)
    w.actions["fake.requeue"].script.outcomes[:] = [Retry(reason="PDB says later", after=60), Ok(output="ok")]
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    assert len(w.calls("fake.requeue")) == 1 and w.incident(incident_id)["state"] == "acting"
    w.clock.advance(59)
    w.run()
    assert len(w.calls("fake.requeue")) == 1
    w.clock.advance(1)
    w.run()
    assert len(w.calls("fake.requeue")) == 2 and len(w.calls("fake.drain")) == 1
    assert w.incident(incident_id)["state"] == "verifying"


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (Ambiguous(reason="ssh timed out after sending"), "needs_human"),
        (CredentialError(reason="permission denied (publickey)"), "credential_error"),
    ],
)
def test_ambiguous_and_credential_errors_stop_without_retrying(tmp_path, outcome, state):
    w = make_world(tmp_path, GRANTS)
    w.actions["fake.drain"].script.outcomes[:] = [outcome]
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    w.clock.advance(hours=1)
    w.run()
    assert w.incident(incident_id)["state"] == state
    assert len(w.calls("fake.drain")) == 1 and w.calls("fake.requeue") == []
    if state == "credential_error":
        assert w.engine.status()["credentials"]["fake"]["state"] == "credential_error"


def test_failed_step_counts_as_an_attempt(tmp_path):
    w = make_world(tmp_path, GRANTS)
    w.actions["fake.drain"].script.outcomes[:] = [Failed(reason="node busy"), Ok()]
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    inc = w.incident(incident_id)
    assert inc["state"] == "waiting" and "backoff 10m after attempt 1" in inc["reason"]
    assert [row["message"] for row in w.ledger(incident_id, "attempt_failed")] == [
        "step fake.drain failed: node busy"
    ]
    w.clock.advance(minutes=10)
    w.run()
    assert w.incident(incident_id)["state"] == "verifying" and w.incident(incident_id)["attempt"] == 2


def test_hostile_label_never_reaches_an_action(tmp_path):
    w = make_world(tmp_path, GRANTS)
    opened = w.send(alert(xid(job="1234; rm -rf /"))).opened
    w.run()
    assert opened == []  # the target job fails its pattern: ledgered, no incident, no call
    with w.engine.deps.store.transaction() as conn:
        kinds = [row.kind for row in records.iter_ledger(conn)]
    assert "target_invalid" in kinds
    assert w.calls("fake.requeue") == [] and w.calls("fake.logs") == []


def test_step_in_flight_at_a_crash_is_ambiguous_and_not_rerun(tmp_path):
    w = make_world(tmp_path, GRANTS)
    incident_id = w.send(alert(xid())).opened[0]
    deps = w.engine.deps

    class Crash(BaseException):
        pass

    def crash(params, ctx):
        raise Crash

    w.actions["fake.requeue"].run = crash  # the worker dies inside the step
    with pytest.raises(Crash):
        w.engine.work_once("worker-a")
    w.actions["fake.requeue"].run = lambda params, ctx: pytest.fail("re-ran an ambiguous step")
    w.clock.advance(seconds=deps.settings.worker.lease_seconds + 1)  # worker-a's claim expires
    w.engine.work_once("worker-b")
    inc = w.incident(incident_id)
    assert inc["state"] == "needs_human"
    assert ("fake.requeue", "ambiguous") in w.steps(incident_id)
    assert "in flight when its worker stopped" in inc["reason"]


def test_claims_are_exclusive_until_the_lease_expires(tmp_path):
    w = make_world(tmp_path, GRANTS)
    w.send(alert(xid()))
    lease = timedelta(seconds=w.engine.deps.settings.worker.lease_seconds)
    with w.engine.deps.store.transaction() as conn:
        first = INCIDENTS.claim_next(conn, "a", w.clock.now(), lease)
        second = INCIDENTS.claim_next(conn, "b", w.clock.now(), lease)
    assert first is not None and second is None
    w.clock.advance(lease.total_seconds() + 1)
    with w.engine.deps.store.transaction() as conn:
        assert INCIDENTS.claim_next(conn, "b", w.clock.now(), lease) == first


def test_unmatched_alert_is_ledgered_once_without_an_incident(tmp_path):
    w = make_world(tmp_path, GRANTS)
    other = alert({"alertname": "DiskFull", "Hostname": "node1"})
    assert w.send(other).unmatched == 1
    assert w.send(other).unmatched == 0
    assert w.engine.incidents() == []


def test_grafana_region_opens_with_the_incident_and_closes_with_its_outcome(tmp_path):
    from app.clients.grafana import GrafanaClient
    from tests.contracts import grafana_contract

    w = make_world(tmp_path)
    settings = w.engine.deps.settings
    settings.grafana.url = "http://grafana.test:3000"
    w.engine.deps.clients = Clients(
        settings,
        prometheus=w.prometheus,
        grafana=GrafanaClient(settings.grafana.url, token="glsa_test"),
        http=w.engine.deps.clients.http,
        slurm=w.engine.deps.clients.slurm,
    )
    with grafana_contract(settings.grafana.url, "glsa_test") as grafana:
        incident_id = w.send(alert(xid())).opened[0]
        w.clock.advance(5)
        w.run()
    inc = w.incident(incident_id)
    assert inc["outcome"] == "advisory" and inc["annotation_id"] == 1
    region = grafana.annotations[1]
    opened_ms = int(inc["opened_at"].timestamp() * 1000)
    assert region["time"] == opened_ms and region["timeEnd"] == opened_ms + 5000
    assert region["tags"] == [
        "nightshift",
        "playbook:gpu-xid-79",
        "job:1234",
        "outcome:advisory",
    ]
    assert "Outcome: advisory" in region["text"]


def test_grafana_down_never_fails_the_remediation(tmp_path):
    from app.clients.grafana import GrafanaClient

    w = make_world(tmp_path, GRANTS)
    settings = w.engine.deps.settings
    settings.grafana.url = "http://127.0.0.1:1"
    w.engine.deps.clients = Clients(
        settings,
        prometheus=w.prometheus,
        http=w.engine.deps.clients.http,
        grafana=GrafanaClient(settings.grafana.url, token="t", timeout=0.5),
        slurm=w.engine.deps.clients.slurm,
    )
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    assert w.incident(incident_id)["state"] == "verifying"
    assert w.ledger(incident_id, "annotation_error")


def test_promql_step_parameters_render_label_values_escaped(tmp_path):
    from app.actions.prometheus import ACTIONS as PROMETHEUS_ACTIONS

    query_playbook = PLAYBOOK.replace(
        """  - action: fake.notice
    with: {text: "{{ diagnosis.summary }}"}
    when: ['diagnosis=~"gpu_.*"']""",
        """  - action: prometheus.query
    with: {query: 'up{instance="{{ labels.instance }}"}'}""",
    )
    w = make_world(tmp_path, playbooks="")
    registry = w.engine.deps.registry
    for action in PROMETHEUS_ACTIONS:
        registry.register(action)
    w.engine.deps.playbooks = PlaybookSet(parse_playbooks(query_playbook, "q.yaml", registry))
    w.send(alert({**xid(), "instance": 'x"} or vector(1) or {a="'}))
    w.run()
    assert w.prometheus.queries[-1] == 'up{instance="x\\"} or vector(1) or {a=\\""}'


def test_step_marked_approval_required_waits_for_an_operator(tmp_path):
    gated = PLAYBOOK.replace(
        """  - action: fake.requeue
    with: {job: "{{ target.job }}"}""",
        """  - action: fake.requeue
    with: {job: "{{ target.job }}"}
    approval: required""",
    )
    w = make_world(tmp_path, GRANTS, playbooks=gated)
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    assert w.steps(incident_id)[:2] == [("fake.drain", "ok"), ("fake.requeue", "awaiting_approval")]
    w.clock.advance(minutes=10)
    w.run()
    assert w.calls("fake.requeue") == [] and w.incident(incident_id)["state"] == "acting"
    assert any("approval needed" in text or "waits for approval" in text for _, text in w.notifications)
    step_id = next(s["id"] for s in w.engine.incident(incident_id)["steps"] if s["action"] == "fake.requeue")
    with pytest.raises(LookupError):
        w.engine.approve_step(incident_id, 9999, by="alice")
    w.engine.approve_step(incident_id, step_id, by="alice")
    with pytest.raises(ValueError, match="not awaiting approval"):
        w.engine.approve_step(incident_id, step_id, by="alice")
    w.run()
    assert w.calls("fake.requeue") == [{"job": "1234"}]
    assert w.incident(incident_id)["state"] == "verifying"
    assert [row["message"] for row in w.ledger(incident_id, "approved")] == [
        "step fake.requeue approved by alice"
    ]


def test_operator_marks_an_open_incident_handled(tmp_path):
    w = make_world(tmp_path, GRANTS)
    w.engine.set_paused(True, "hands off", by="bob")
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    assert w.incident(incident_id)["state"] == "waiting"
    w.engine.mark_handled(incident_id, by="bob", note="rebooted by hand")
    w.engine.set_paused(False, "", by="bob")
    w.clock.advance(minutes=1)
    w.run()
    inc = w.incident(incident_id)
    assert (inc["outcome"], inc["reason"]) == ("handled", "handled by bob: rebooted by hand")
    assert w.calls("fake.drain") == []
    with pytest.raises(ValueError, match="already closed"):
        w.engine.mark_handled(incident_id, by="bob", note="")


def test_a_step_longer_than_the_lease_keeps_its_claim(tmp_path, monkeypatch):
    """The heartbeat beats on the injected clock: the step moves the fake clock past its lease, and the claim is
    renewed from the new now before anyone else may take it (the renewal waited for as the other thread's event,
    never slept on)."""
    import threading

    w = make_world(tmp_path, GRANTS)
    w.engine.deps.settings.worker.lease_seconds = 3
    seen = {}
    renewed = threading.Event()
    renew = INCIDENTS.renew

    def renewing(conn, row_id, worker, until):
        kept = renew(conn, row_id, worker, until)
        if until >= w.clock.now() + timedelta(seconds=3):
            renewed.set()
        return kept

    monkeypatch.setattr(INCIDENTS, "renew", renewing)

    def slow(params, ctx):
        w.clock.advance(10)  # the step outlives the lease it was claimed with...
        assert renewed.wait(timeout=10)  # ...and the heartbeat, woken by the clock, renews it at once
        with w.engine.deps.store.transaction() as conn:
            seen["stolen"] = INCIDENTS.claim_next(conn, "intruder", w.clock.now(), timedelta(seconds=3))
        return Ok()

    w.actions["fake.drain"].run = slow
    w.send(alert(xid()))
    w.run()
    assert seen == {"stolen": None}


def test_an_incidents_take_out_is_held_to_the_share_of_the_nodes_partition(tmp_path):
    """Blast radius on nodes for incidents' own steps too: at most half of a two-node partition out at once."""
    from app.clients.slurm import NodeInfo

    class Partitioned(FakeSlurm):
        def node_info(self, node: str) -> NodeInfo:
            return NodeInfo(node, "idle", (), "", ("gpu",))

        def partition_nodes(self, partition: str) -> list[str]:
            return ["node1", "node2"]

    w = make_world(tmp_path, GRANTS, playbooks=NODE_PLAYBOOK, blast_radius_max_nodes=10)
    settings = w.engine.deps.settings
    settings.guards.blast_radius_max_share = 0.5
    w.engine.deps.clients = Clients(settings, prometheus=w.prometheus, http=w.engine.deps.clients.http,
                                    slurm=Partitioned())  # fmt: skip
    w.prometheus.answers[RECHECK.replace("node1", "node2")] = [FakeSample({}, 1)]
    no_job = [{k: v for k, v in xid(node=n).items() if k != "slurm_job_id"} for n in ("node1", "node2")]
    first, second = (w.send(alert(labels)).opened[0] for labels in no_job)
    w.run()
    assert w.incident(first)["state"] == "verifying"
    held = w.incident(second)
    assert held["state"] == "waiting" and "of the 2 nodes of partition gpu taken out" in held["reason"]
    assert [c["node"] for c in w.calls("fake.drain")] == ["node1"]


def test_an_alert_no_playbook_matches_is_told_to_people_once(tmp_path):
    w = make_world(tmp_path)
    stray = alert({"alertname": "DcgmExporterDown", "instance": "node9:9400"})
    assert w.send(stray).unmatched == 1
    w.send(stray)  # an Alertmanager repeat of the same instance: recorded, not told again
    texts = [text for _, text in w.notifications]
    assert len(texts) == 1 and "DcgmExporterDown" in texts[0]
    storm = [alert({"alertname": f"Unknown{n}", "instance": "x"}) for n in range(12)]
    w.send(*storm)
    assert len(w.notifications) == 1 + 5  # at most five notices per ingestion; the ledger has every one


def test_only_tick_failures_in_a_row_hand_the_incident_to_a_person(tmp_path, monkeypatch):
    """worker.max_tick_errors counts failed ticks in a row: a tick that goes through in between starts the count
    again; at the bound the incident is needs_human with the count it reached."""
    w = make_world(tmp_path, GRANTS)
    assert w.prometheus is not None
    query = w.prometheus.query
    broken = True

    def recheck(expr: str, at: Any = None) -> list[FakeSample]:
        if broken:
            raise RuntimeError("a bug behind the re-check")
        return query(expr, at)

    monkeypatch.setattr(w.prometheus, "query", recheck)
    limit = w.deps.settings.worker.max_tick_errors
    incident_id = w.send(alert(xid())).opened[0]

    def tick() -> dict[str, Any]:
        w.run()
        w.clock.advance(w.deps.settings.guards.defer_seconds + 1)
        return w.incident(incident_id)

    for _ in range(limit - 1):
        assert tick()["outcome"] is None
    broken = False
    w.prometheus.down = True  # a tick that goes through: it waits (not acting blind)
    assert "not acting blind" in tick()["reason"]
    broken = True
    for _ in range(limit - 1):
        assert tick()["outcome"] is None
    closed = tick()
    assert (closed["outcome"], closed["tick_errors"]) == ("needs_human", limit)
    assert f"processing failed {limit} times in a row" in closed["reason"]
    assert w.calls("fake.drain") == []
