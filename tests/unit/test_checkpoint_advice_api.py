"""GET /api/v1/checkpoint-advice: the facts gathered from the store (job failures Nightshift acted on) and from
Prometheus (fleet node-hours, the job's nodes and checkpoints), the advice, and the refusals of bad input."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app import create_app
from app.clients import Clients
from app.config import Settings
from app.engine import checkpoint_facts
from app.metrics import Metrics
from app.store.schema import incidents
from app.web import views
from tests.fakes import FakeClock, FakePrometheus, FakeSample

SELECTOR = 'slurm_job_id="4242"'


def answer(prometheus: FakePrometheus, template: str, value: float) -> None:
    expr = template.replace("%s", SELECTOR)
    prometheus.answers[expr] = [FakeSample({}, value)]


@pytest.fixture
def world(tmp_path: Path) -> Any:
    settings = Settings(data_dir=str(tmp_path / "var"))
    (tmp_path / "viewer").write_text("view-token")
    settings.access.viewer_token_file = str(tmp_path / "viewer")
    settings.webhook.auth_disabled = True
    prometheus = FakePrometheus()
    clock = FakeClock()
    app = create_app(
        settings, clock=clock, clients=Clients(settings, prometheus=prometheus), metrics=Metrics()
    )
    return app, prometheus, clock


def failures(app: Any, clock: FakeClock, count: int, *, days_ago: int = 1, attempt: int = 1) -> None:
    store = app.extensions["nightshift"].engine.deps.store
    when = clock.now() - timedelta(days=days_ago)
    with store.transaction() as conn:
        for n in range(count):
            conn.execute(
                incidents.insert().values(
                    playbook="xid", target_key=f"k{days_ago}-{attempt}-{n}", target={}, kind="job",
                    state="recovered", labels={}, annotations={}, alert_starts_at=when, attempt=attempt,
                    opened_at=when, updated_at=when,
                )
            )  # fmt: skip


def get(app: Any, query: str) -> Any:
    return app.test_client().get(
        f"/api/v1/checkpoint-advice?{query}", headers={"Authorization": "Bearer view-token"}
    )


def test_advice_from_measured_failures_and_the_jobs_markers(world: Any) -> None:
    app, prometheus, clock = world
    failures(app, clock, 6)
    failures(app, clock, 4, attempt=0)  # opened, never acted on: not a failure Nightshift measured
    failures(app, clock, 9, days_ago=40)  # outside the 30-day window
    answer(prometheus, checkpoint_facts.NODE_HOURS, 64 * 24 * 30)  # 64 nodes for 30 days
    answer(prometheus, checkpoint_facts.JOB_NODES, 16)
    answer(prometheus, checkpoint_facts.CHECKPOINT_SECONDS, 120)
    answer(prometheus, checkpoint_facts.CHECKPOINTS_A_DAY, 4)  # every 6 h
    response = get(app, "scheduler=slurm&job=4242&gpus_per_node=8")
    assert response.status_code == 200, response.json
    advice = response.json["advice"]
    # 6 failures in 46,080 node-hours: a 16-node job fails every 480 h.
    assert advice["job_mtbf_seconds"] == pytest.approx(64 * 24 * 30 * 3600 / (6 * 16), rel=1e-3)
    assert advice["current_lost_gpu_hours_per_day"] > advice["advised_lost_gpu_hours_per_day"] > 0
    assert 3600 < advice["interval_seconds"] < 6 * 3600
    assert "6 failures" in advice["basis"]


def test_no_advice_without_enough_failures_or_markers(world: Any) -> None:
    app, prometheus, clock = world
    failures(app, clock, 2)
    answer(prometheus, checkpoint_facts.NODE_HOURS, 1000)
    answer(prometheus, checkpoint_facts.JOB_NODES, 4)
    answer(prometheus, checkpoint_facts.CHECKPOINT_SECONDS, 60)
    thin = get(app, "job=4242").json
    assert thin["advice"] is None and "at least 3" in thin["reason"]
    failures(app, clock, 3)
    prometheus.answers.pop(checkpoint_facts.CHECKPOINT_SECONDS.replace("%s", SELECTOR))
    unmarked = get(app, "job=4242").json
    assert unmarked["advice"] is None and "checkpoint time" in unmarked["reason"]
    prometheus.down = True
    assert "Prometheus" in get(app, "job=4242").json["reason"]


@pytest.mark.parametrize(
    "query",
    [
        "scheduler=lsf&job=1",
        "job=4242%22%7D",  # a quote and a brace: never reaches PromQL
        "job=",
        "scheduler=kubernetes&job=llama",  # no namespace
        "scheduler=kubernetes&job=llama&namespace=Bad_NS",
        "job=4242&gpus_per_node=0",
        "job=4242&gpus_per_node=65",
    ],
)
def test_bad_input_is_a_400_with_a_message(world: Any, query: str) -> None:
    app, prometheus, _ = world
    response = get(app, query)
    assert response.status_code == 400 and response.json["status"] == "error" and response.json["message"]
    assert prometheus.queries == []


def test_kubernetes_jobs_are_selected_by_namespace_and_name(world: Any) -> None:
    app, prometheus, clock = world
    failures(app, clock, 3)
    response = get(app, "scheduler=kubernetes&job=llama-7b&namespace=ml")
    assert response.status_code == 200
    assert 'count(training_step_total{namespace="ml",train_job="llama-7b"})' in prometheus.queries


def job_incident(app: Any, clock: FakeClock, job: str, scheduler: str = "slurm", namespace: str = "") -> None:
    store = app.extensions["nightshift"].engine.deps.store
    now = clock.now()
    target = {"scheduler": scheduler, "job": job, **({"namespace": namespace} if namespace else {})}
    with store.transaction() as conn:
        conn.execute(
            incidents.insert().values(
                playbook="nccl-failure", target_key=f"job/{job}", target=target, kind="job", job=job,
                state="recovered", outcome="recovered", labels={}, annotations={}, alert_starts_at=now, attempt=1,
                opened_at=now, updated_at=now, closed_at=now,
            )
        )  # fmt: skip


def page(app: Any, path: str) -> Any:
    return app.test_client().get(path, headers={"Authorization": "Bearer view-token"})


def test_the_job_page_shows_the_advised_and_the_current_interval(world: Any) -> None:
    app, prometheus, clock = world
    failures(app, clock, 6)
    job_incident(app, clock, "4242")
    answer(prometheus, checkpoint_facts.NODE_HOURS, 64 * 24 * 30)
    answer(prometheus, checkpoint_facts.JOB_NODES, 16)
    answer(prometheus, checkpoint_facts.CHECKPOINT_SECONDS, 120)
    answer(prometheus, checkpoint_facts.CHECKPOINTS_A_DAY, 4)  # every 6 h
    advice = get(app, "scheduler=slurm&job=4242").json["advice"]  # the API's figures, the page's source
    response = page(app, "/jobs/4242")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert 'id="advice-current"><td>Now</td><td>6h</td>' in html
    advised = views.spoken_duration(advice["interval_seconds"])
    assert f'id="advice-advised"><td>Advised</td><td>{advised}</td>' in html
    assert f"{advice['current_lost_gpu_hours_per_day']:.2f} GPU-hours a day" in html
    assert f"{advice['advised_lost_gpu_hours_per_day']:.2f} GPU-hours a day" in html
    assert advice["basis"] in html and 'data-job="4242"' in html  # the basis, and the job's incidents
    assert 'href="/jobs/4242"' in page(app, "/").get_data(as_text=True)  # the overview links to it


def test_the_job_page_says_why_there_is_no_advice_and_refuses_unknown_jobs(world: Any) -> None:
    app, prometheus, clock = world
    job_incident(app, clock, "4242")
    assert "Prometheus has no" in page(app, "/jobs/4242").get_data(as_text=True)  # no progress markers
    answer(prometheus, checkpoint_facts.NODE_HOURS, 1000)
    answer(prometheus, checkpoint_facts.JOB_NODES, 4)
    answer(prometheus, checkpoint_facts.CHECKPOINT_SECONDS, 60)
    assert "at least 3" in page(app, "/jobs/4242").get_data(as_text=True)  # one failure measured
    job_incident(
        app, clock, "llama-7b", scheduler="kubernetes"
    )  # a Kubernetes job with no namespace on record
    assert "namespace" in page(app, "/jobs/llama-7b").get_data(as_text=True)
    assert page(app, "/jobs/999").status_code == 404
    assert page(app, "/jobs/4242?gpus_per_node=65").status_code == 400
    assert all("999" not in q for q in prometheus.queries)


def test_spoken_durations() -> None:
    assert [views.spoken_duration(s) for s in (42, 60, 5400, 90061)] == ["42s", "1m", "1h 30m", "1d 1h 1m"]
