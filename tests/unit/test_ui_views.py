"""View models of the operator UI over stores seeded through the real engine (fake clock, fake actions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from app.domain.outcome import Ambiguous, CredentialError, Failed, Ok
from app.web import views
from tests.fakes import START, FakeSample
from tests.payloads import alert, xid
from tests.worlds import GRANTS, NODE_PLAYBOOK, PLAYBOOK, RECHECK, VERIFY, make_world


def recovering_world(tmp_path, playbooks: str = PLAYBOOK):
    """Every re-check and verification query answers one series: granted incidents recover after one poll."""
    w = make_world(tmp_path, GRANTS, playbooks=playbooks, blast_radius_max_nodes=10)
    w.prometheus.default = [FakeSample({"up": "1"}, 1.0)]
    return w


def no_job(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "slurm_job_id"}


def jobs(w) -> dict[str, views.JobView]:
    status = w.engine.status()
    seen = w.engine.job_incidents()
    return {j.job: j for j in views.job_views(seen["latest"], seen["open"], status["credentials"])}


def test_job_states_follow_open_incidents_and_the_newest_outcome(tmp_path):
    w = recovering_world(tmp_path)
    w.send(alert(xid(node="node1", job="1001")))
    w.run()
    w.clock.advance(30)
    w.run()  # recovered
    w.actions["fake.drain"].script.outcomes[:] = [Ambiguous(reason="ssh timed out"), Ok()]
    stuck = alert(xid(node="node2", job="1002"))
    w.send(stuck)
    w.run()  # needs_human
    w.actions["fake.requeue"].script.outcomes[:] = [CredentialError(reason="publickey"), Ok()]
    w.send(alert(xid(node="node3", job="1003")))
    w.run()  # credential_error
    w.engine.set_paused(True, "maintenance", by="bob")
    w.send(alert(xid(node="node4", job="1004")))
    w.run()  # waiting on the kill switch

    # A job incident's node is its culprit's; the reporting node is not one (the test playbook is not node-scoped).
    states = {job: (view.state, view.node) for job, view in jobs(w).items()}
    assert states == {
        "1001": ("enabled", None),
        "1002": ("needs_human", None),
        "1003": ("credential_error", None),
        "1004": ("recovering", None),
    }
    assert list(jobs(w)) == ["1004", "1003", "1002", "1001"]  # most recently active first
    assert "automation paused: maintenance" in jobs(w)["1004"].why
    assert "outcome unknown" in jobs(w)["1002"].why

    # DESIGN: needs_human "until the alert resolves".
    w.send({**stuck, "status": "resolved", "endsAt": "2026-12-02T03:05:00Z"})
    view = jobs(w)["1002"]
    assert (view.state, view.why) == ("enabled", "last incident needs_human; its alerts have resolved since")


def test_open_incident_is_credential_error_while_its_scheduler_rejects_our_credentials():
    open_incident = {"id": 7, "state": "waiting", "reason": "", "target": {"scheduler": "slurm"}}
    latest = {**open_incident, "outcome": None}
    rejected = {"slurm": {"state": "credential_error", "reason": "Permission denied (publickey)"}}
    state, why, decisive = views.job_state(latest, [open_incident], rejected)
    assert (state, decisive["id"]) == ("credential_error", 7)
    assert why == "slurm credentials rejected: Permission denied (publickey)"
    state, why, _ = views.job_state(latest, [open_incident], {"slurm": {"state": "unknown"}})
    assert (state, why) == ("recovering", "incident #7 waiting")
    assert views.job_state({"id": 8, "state": "advisory", "outcome": "advisory", "reason": ""}, [], {})[
        :2
    ] == (
        "needs_human",
        "advisory",
    )


def test_guard_view_reports_the_pause_and_the_blast_radius_used(tmp_path):
    w = recovering_world(tmp_path)
    for node in ("node1", "node2"):
        w.send(alert(xid(node=node, job=node.removeprefix("node") + "00")))
    w.run()
    w.engine.set_paused(True, "swapping PSUs", by="bob")
    guard = views.guard_view(w.engine.status(), w.engine.blast_radius())
    assert (guard.paused, guard.paused_by, guard.reason) == (True, "bob", "swapping PSUs")
    assert guard.changed_at == START.isoformat()
    assert (guard.blast_used, guard.blast_limit, guard.blast_nodes) == (2, 10, ("node1", "node2"))
    assert guard.blast_window == "60 min"
    assert guard.whitelisted == GRANTS
    w.clock.advance(hours=2)  # out of the window
    assert views.guard_view(w.engine.status(), w.engine.blast_radius()).blast_used == 0
    credentials = views.credential_views(w.engine.status()["credentials"])
    assert [c.backend for c in credentials] == ["kubernetes", "slurm"]
    assert credentials[1].state == "unset"  # slurm.host is not set: said from the start, not "unknown"
    assert credentials[0].state in ("unset", "configured")  # this machine's ~/.kube/config decides


def test_incident_view_has_alerts_diagnosis_verdicts_steps_samples_and_timeline(tmp_path):
    w = make_world(tmp_path, GRANTS)
    incident_id = w.send(alert(xid())).opened[0]
    w.run()
    w.clock.advance(30)
    w.run()  # one empty verification sample
    w.prometheus.answers[VERIFY] = [FakeSample({"slurm_job_id": "1234"}, 12.0)]
    w.clock.advance(30)
    w.run()
    detail = w.engine.incident(incident_id)
    view = views.incident_view(detail, grafana_url=None)

    assert view.incident["state"] == "recovered" and not view.is_open
    (shown,) = view.alerts
    assert shown.prometheus_url == "http://prometheus:9090/graph?g0.expr=x"
    assert ("xid", "79") in shown.labels and shown.starts_at == START
    assert view.diagnosis is not None and view.diagnosis.category == "gpu_hardware"
    assert any("fallen off the bus" in line for line in view.diagnosis.evidence)
    assert [v.guard for v in view.verdicts][-1] == "recheck"
    assert {v.decision for v in view.verdicts} == {"pass"}
    assert [(s.phase, s.action, s.status) for s in view.steps] == [
        ("collect", "fake.logs", "ok"),
        ("steps", "fake.drain", "ok"),
        ("steps", "fake.requeue", "ok"),
        ("steps", "fake.notice", "ok"),
    ]
    drain = view.steps[1]
    assert drain.command == "fake.drain node=node1 reason=Xid 79" and drain.output == "done"
    assert [len(s.series) for s in view.samples] == [0, 1]
    assert view.samples[1].series == (('{slurm_job_id="1234"}', 12.0),)
    assert [e.kind for e in view.timeline] == [row["kind"] for row in detail["ledger"]]
    assert RECHECK in {row["data"].get("expr") for row in detail["ledger"] if row["kind"] == "recheck"}


def test_awaiting_approval_and_unknown_statuses():
    row = {
        "id": 3,
        "attempt": 1,
        "phase": "steps",
        "name": "fake.requeue",
        "action": "fake.requeue",
        "params": {},
        "status": "awaiting_approval",
        "approval": True,
    }
    step = views.step_view(row)
    assert step.awaiting_approval and step.css == "awaiting_approval"
    assert views.step_view({**row, "status": "teleported"}).css == "other"


def test_only_http_links_are_rendered_as_links():
    assert (
        views.safe_url("https://prom.example:9090/graph?g0.expr=up")
        == "https://prom.example:9090/graph?g0.expr=up"
    )
    for hostile in (
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        "data:text/html,x",
        "//evil.example/x",
        "/x",
        "",
    ):
        assert views.safe_url(hostile) is None, hostile
    assert views.safe_url(None) is None


def test_grafana_link_spans_the_incident_padded_and_needs_a_dashboard():
    opened = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    closed = opened + timedelta(minutes=5)
    ms = 1000 * int(opened.timestamp())
    link = views.grafana_link("http://grafana:3000/", "remediation", opened, closed, now=closed)
    assert link == f"http://grafana:3000/d/remediation?from={ms - 900_000}&to={ms + 1_200_000}"
    still_open = views.grafana_link(
        "http://grafana:3000", "remediation", opened, None, now=closed + timedelta(hours=1)
    )
    assert still_open is not None and still_open.endswith(f"to={ms + 4_800_000}")
    assert views.grafana_link("http://grafana:3000", None, opened, closed, now=closed) is None
    assert views.grafana_link(None, "remediation", opened, closed, now=closed) is None
    assert views.grafana_link("javascript:alert(1)", "x", opened, closed, now=closed) is None


def test_lemon_nodes_rank_by_remediations_then_incidents_within_the_window(tmp_path):
    w = recovering_world(tmp_path, NODE_PLAYBOOK)
    w.actions["fake.drain"].script.outcomes[:] = [Failed(reason="node busy"), Ok()]
    # Alerts without a job: per-target incidents on their node (job incidents count on their culprit nodes).
    w.send(alert(no_job(xid(node="node7"))))
    w.run()  # attempt 1 fails
    w.clock.advance(minutes=10)
    w.run()  # attempt 2 after the backoff
    w.clock.advance(30)
    w.run()  # recovered
    w.send(alert(no_job(xid(node="node1"))))
    w.run()  # attempt 1, verifying
    w.engine.set_paused(True, "hands off", by="bob")
    w.send(alert(no_job(xid(node="node3"))))
    w.run()  # held by the kill switch: an incident, no remediation

    data = w.engine.node_remediations(days=7)
    ranked = views.lemon_nodes(data["attempts"], data["incidents"])
    assert [(n.node, n.remediations, n.incidents) for n in ranked] == [
        ("node7", 2, 1),
        ("node1", 1, 1),
        ("node3", 0, 1),
    ]
    assert ranked[0].by_outcome == (("failed", 1), ("recovered", 1))
    assert ranked[1].by_outcome == (("in_progress", 1),)
    w.clock.advance(days=2)
    data = w.engine.node_remediations(days=1)
    assert views.lemon_nodes(data["attempts"], data["incidents"]) == []


def test_times_are_utc_iso_and_pages_know_the_next_before():
    assert views.utc(datetime(2026, 12, 2, 4, 0, tzinfo=UTC)) == "2026-12-02T04:00:00Z"
    plus_two = datetime(2026, 12, 2, 8, 0, 30, 999, tzinfo=timezone(timedelta(hours=2)))
    assert views.utc(plus_two) == "2026-12-02T06:00:30Z"
    assert views.utc("2026-12-02T03:00:00+00:00") == "2026-12-02T03:00:00Z"
    assert views.utc(None) == "-" and views.utc("not a time") == "not a time"
    rows = [{"id": 9}, {"id": 7}, {"id": 4}]
    assert views.page(rows, 2) == ([{"id": 9}, {"id": 7}], 7)
    assert views.page(rows, 3) == (rows, None)
    assert views.page([], 3) == ([], None)


def test_a_job_is_pending_inside_its_window_and_completed_when_the_scheduler_says_it_finished(tmp_path):
    from app.clients import Clients
    from tests.fakes import FakeSlurm

    w = make_world(tmp_path, GRANTS, correlation_seconds=45)
    finished = FakeSlurm({"1008": ("COMPLETED", "node8")})
    w.engine.deps.clients = Clients(w.engine.deps.settings, prometheus=w.prometheus, slurm=finished)
    w.send(alert(xid(node="node8", job="1008")))
    w.run()
    assert jobs(w)["1008"].state == "pending"  # inside the correlation window, the scheduler not asked yet
    w.clock.advance(46)
    w.run()
    view = jobs(w)["1008"]
    assert view.state == "completed" and "job 1008 is COMPLETED" in view.why
    assert w.calls("fake.drain") == [] and w.calls("fake.requeue") == []
