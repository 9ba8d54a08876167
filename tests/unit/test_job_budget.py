"""guards.job_budget: at most N recoveries of one training job in a window, whatever the fault class."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.config import Settings
from app.domain.guards import recoveries_verdict as job_budget
from app.domain.states import GuardDecision

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DAY = timedelta(hours=24)


def ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


def test_the_nth_recovery_within_the_window_goes_to_a_person() -> None:
    four = [ago(hours=h) for h in (1, 3, 7, 20)]
    allowed = job_budget("slurm/4242", four, NOW, 5, DAY)
    assert (allowed.decision, allowed.reason) == (GuardDecision.PASS, "job slurm/4242: recovery 5 of 5 in 1d")
    refused = job_budget("slurm/4242", [*four, ago(minutes=5)], NOW, 5, DAY)
    assert (refused.guard, refused.decision, refused.outcome) == (
        "job_budget",
        GuardDecision.STOP,
        "needs_human",
    )
    assert refused.reason.startswith("job slurm/4242: 5 recoveries in the last 1d, whatever the fault")


def test_recoveries_older_than_the_window_or_in_the_future_do_not_count() -> None:
    old = [ago(hours=25), ago(days=3), ago(hours=24)]  # exactly one window ago is outside it
    assert (
        job_budget("k8s/ml/run", [*old, NOW + timedelta(minutes=1)], NOW, 1, DAY).decision
        == GuardDecision.PASS
    )
    assert (
        job_budget("k8s/ml/run", [*old, ago(hours=23, minutes=59)], NOW, 1, DAY).decision
        == GuardDecision.STOP
    )


def test_not_a_job_passes_and_a_limit_below_one_always_asks_a_person() -> None:
    assert job_budget(None, [NOW] * 50, NOW, 1, DAY).decision == GuardDecision.PASS
    assert job_budget("slurm/1", [], NOW, 0, DAY).decision == GuardDecision.STOP


def test_settings_defaults() -> None:
    guards = Settings().guards
    assert (guards.job_recoveries_max, guards.job_recoveries_window_seconds) == (5, 86400)
