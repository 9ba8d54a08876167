"""Checkpoint-interval advice: Young's and Daly's intervals, the lost time at the current and the advised
interval, and the refusals (too few failures, bad figures)."""

from __future__ import annotations

import math

import pytest

from app.domain.checkpoint_advice import (
    Advice,
    FailureRate,
    JobCheckpoints,
    NoAdvice,
    advise,
    best_interval,
    daly_interval,
    lost_fraction,
    young_interval,
)

HOUR = 3600.0


def test_the_advised_interval_is_the_minimum_and_young_and_daly_are_near_it() -> None:
    checkpoint, mtbf = 120.0, 10 * HOUR
    best = best_interval(checkpoint, mtbf)
    for other in (best * 0.5, best * 0.9, best * 1.1, best * 2):
        assert lost_fraction(best, checkpoint, mtbf) < lost_fraction(other, checkpoint, mtbf)
    assert young_interval(checkpoint, mtbf) == pytest.approx(math.sqrt(2 * 120 * 36000))
    assert daly_interval(checkpoint, mtbf) == pytest.approx(best, rel=0.01)
    assert young_interval(checkpoint, mtbf) == pytest.approx(best, rel=0.05)


def test_daly_caps_at_the_mtbf_and_the_loss_is_a_fraction() -> None:
    assert daly_interval(3 * HOUR, HOUR) == HOUR
    assert 0 < lost_fraction(HOUR, 60.0, 10 * HOUR) < 1
    assert lost_fraction(1e6, 60.0, 1.0) == 1.0  # overflow guarded: nothing gets done


def test_advice_for_a_large_job_from_the_fleet_failure_rate() -> None:
    # 30 failures in 2,000 nodes x 30 days: one node fails every 2,000 days; a 512-node job every ~3.9 days.
    rate = FailureRate(failures=30, node_seconds=2000 * 30 * 24 * HOUR)
    job = JobCheckpoints(nodes=512, gpus=4096, checkpoint_seconds=300.0, interval_seconds=12 * HOUR)
    advice = advise(rate, job)
    assert isinstance(advice, Advice)
    assert advice.job_mtbf_seconds == pytest.approx(2000 * 30 * 24 * HOUR / (30 * 512))
    assert 3 * HOUR < advice.interval_seconds < 5 * HOUR  # Young: √(2·300·337,500) s ≈ 3.95 h
    assert advice.current_lost_gpu_hours_per_day is not None
    assert advice.advised_lost_gpu_hours_per_day < advice.current_lost_gpu_hours_per_day
    assert "512-node job" in advice.basis and advice.as_dict()["interval_seconds"] == round(
        advice.interval_seconds, 1
    )


def test_the_smaller_job_is_advised_a_longer_interval() -> None:
    rate = FailureRate(failures=10, node_seconds=100 * 30 * 24 * HOUR)
    small = advise(rate, JobCheckpoints(nodes=2, gpus=16, checkpoint_seconds=60.0))
    large = advise(rate, JobCheckpoints(nodes=64, gpus=512, checkpoint_seconds=60.0))
    assert isinstance(small, Advice) and isinstance(large, Advice)
    assert small.interval_seconds > large.interval_seconds
    assert small.current_lost_gpu_hours_per_day is None  # no current interval seen


@pytest.mark.parametrize(
    ("rate", "job", "reason"),
    [
        (FailureRate(2, 1e6), JobCheckpoints(4, 32, 60.0), "at least 3"),
        (FailureRate(5, 1e6), JobCheckpoints(4, 32, 0.0), "checkpoint_seconds"),
        (FailureRate(5, 1e6), JobCheckpoints(4, 32, float("nan")), "checkpoint_seconds"),
        (FailureRate(5, 0.0), JobCheckpoints(4, 32, 60.0), "node_seconds"),
        (FailureRate(5, 1e6), JobCheckpoints(0, 32, 60.0), "nodes"),
        (FailureRate(5, 1e6), JobCheckpoints(4, 32, 60.0, interval_seconds=-1), "interval_seconds"),
        (FailureRate(5, 1e6), JobCheckpoints(4, 32, 60.0, restart_seconds=float("inf")), "restart_seconds"),
    ],
)
def test_no_advice_without_a_sound_basis(rate: FailureRate, job: JobCheckpoints, reason: str) -> None:
    result = advise(rate, job)
    assert isinstance(result, NoAdvice) and reason in result.reason


def test_a_job_that_fails_faster_than_it_checkpoints_loses_nearly_the_whole_day() -> None:
    rate = FailureRate(failures=100, node_seconds=100 * HOUR)  # one failure an hour per node
    advice = advise(
        rate, JobCheckpoints(nodes=100, gpus=800, checkpoint_seconds=600.0, interval_seconds=4 * HOUR)
    )
    assert isinstance(advice, Advice)
    assert advice.current_lost_gpu_hours_per_day == pytest.approx(800 * 24, rel=1e-6)
    assert advice.advised_lost_gpu_hours_per_day <= advice.current_lost_gpu_hours_per_day
