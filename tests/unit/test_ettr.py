"""bench/ettr: the fault mix as published, the physics' accounting, the policies' invariants, the report's format,
and the READMEs equal to the results JSON. No figure of a run is asserted (they are the benchmark's output).

The detection used here is the one the benchmark saved (bench/results/ettr-detection.json: promtool's answer for
the shipped rules); tests/integration/test_ettr_detection.py runs promtool itself.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from bench.ettr import benchmark, causes, report, signals, simulation
from bench.ettr.causes import Fault, Rates
from bench.ettr.detection import Detection, encode
from bench.ettr.world import Physics, World

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@pytest.fixture(scope="module")
def detection() -> Detection:
    saved = json.loads((RESULTS / "ettr-detection.json").read_text())
    return Detection.from_json(saved["alerts"])


def test_table5_is_used_as_counted_and_the_printed_faulty_gpu_share_is_a_typo() -> None:
    assert sum(c.count for c in causes.TABLE5) == causes.LLAMA3_UNEXPECTED == 419
    shares = causes.table_shares()
    assert round(shares["Faulty GPU"], 3) == 0.353 != causes.LLAMA3_PRINTED_FAULTY_GPU_SHARE
    kinds = {c.kind for c in causes.TABLE5}
    assert {"silent_data_corruption", "nccl_watchdog", "dependency_outage"} <= kinds
    assert kinds <= set(causes.KINDS)


def test_a_sweep_of_one_rate_leaves_the_other_faults_where_they_were() -> None:
    fewer_hangs = replace(Rates(), silent_hang_per_gpu_day=0.0)
    others = [f for f in causes.draw_faults(Rates(), 1024, 30, 5).faults if f.kind != "silent_hang"]
    assert [(f.at, f.kind) for f in causes.draw_faults(fewer_hangs, 1024, 30, 5).faults] == [
        (f.at, f.kind) for f in others
    ]


def test_every_rate_grows_with_the_job() -> None:
    rates = Rates()
    small = causes.draw_faults(rates, 1024, 400, 3)
    large = causes.draw_faults(rates, 4096, 400, 3)
    per_day = rates.per_gpu_day()
    for kind in ("gpu_fell_off_bus", "silent_hang", "transient_straggler"):
        count = sum(1 for f in large.faults if f.kind == kind)
        expected = per_day[kind] * 4096 * 400
        assert abs(count - expected) < 4 * expected**0.5 + 1
        assert count > sum(1 for f in small.faults if f.kind == kind)


def test_the_series_encoding_is_promtools_expanding_notation() -> None:
    assert encode([0.0, 3.0, 6.0, 6.0, None, None, signals.STALE, float("nan")]) == "0+3x2 6 _x2 stale NaN"
    assert encode([5.0, 4.0, 3.0]) == "5-1x2"


def world(detection: Detection, **physics: float) -> World:
    return World(Physics(**physics), detection, random.Random(0))  # type: ignore[arg-type]


def test_a_crash_loses_the_work_since_the_last_checkpoint_and_a_restart_costs_its_minutes(
    detection: Detection,
) -> None:
    w = world(detection, days=1, checkpoint_interval=3600, checkpoint_seconds=0)
    w.advance(3600 + 20 * 60)
    assert w.job.progress == 4800 and w.job.checkpoint == 3600
    w.strike(Fault(w.now, "network_flap", pick=0.5))
    w.advance(w.now + 120)  # NCCL's IB error: the job exits
    assert w.job.state == "FAILED" and w.job.progress == 3600
    w.requeue(rollback=False)
    w.advance(w.now + w.p.restart_minutes * 60)
    assert w.job.state == "RUNNING" and w.job.progress == 3600
    w.advance(w.now + 600)
    assert w.job.progress == 3600 + 600


def test_every_lost_second_is_charged_to_a_fault_class(detection: Detection) -> None:
    p = Physics(days=3)
    draw = causes.draw_faults(replace(Rates(), table5_scale=20), p.gpus, p.days, 1)
    for policy in ("team", "oracle", "naive-loop"):
        result = simulation.run(policy, p, Rates(), draw, detection, 1)
        accounted = result["ettr"] * p.days * 24 + sum(result["lost_hours"].values())
        assert accounted == pytest.approx(p.days * 24, abs=0.01)


def test_without_faults_only_the_checkpoints_cost_time(detection: Detection, tmp_path: Path) -> None:
    p = Physics(days=0.5)
    expected = 1 - p.checkpoint_seconds / (p.checkpoint_interval + p.checkpoint_seconds)
    for policy in simulation.POLICIES:
        result = simulation.run(policy, p, Rates(), causes.Draw(), detection, 0, tmp_path / policy)
        assert result["ettr"] == pytest.approx(expected, abs=2e-3)
        assert set(result["lost_hours"]) <= {"checkpointing"}


def test_the_oracle_keeps_off_a_faulty_node_the_naive_loop_lands_on_it_again(detection: Detection) -> None:
    p = Physics(days=1)
    draw = causes.Draw((Fault(10 * 3600, "gpu_fell_off_bus", gpu=3, pick=0.2),))
    oracle = simulation.run("oracle", p, Rates(), draw, detection, 0)
    naive = simulation.run("naive-loop", p, Rates(), draw, detection, 0)
    assert oracle["restarts_onto_faulty_node"] == 0 and naive["restarts_onto_faulty_node"] >= 1
    assert oracle["ettr"] > naive["ettr"]


def test_nightshift_takes_the_faulty_node_out_and_pages_nobody_for_it(
    detection: Detection, tmp_path: Path
) -> None:
    p = Physics(days=1)
    draw = causes.Draw((Fault(10 * 3600, "gpu_fell_off_bus", gpu=3, pick=0.2),))
    result = simulation.run("nightshift", p, Rates(), draw, detection, 0, tmp_path)
    assert result["restarts_onto_faulty_node"] == 0 and result["wrong_actions"] == 0
    assert result["incidents"] >= 1 and result["pages"] == 0 and result["human_minutes"] == 0


def test_people_answer_slower_at_night() -> None:
    from bench.ettr.responders import ON_CALL, TEAM

    assert TEAM.delay(3 * 3600) == 120 * 60 and TEAM.delay(14 * 3600) == 20 * 60
    assert ON_CALL.delay(3 * 3600) == 30 * 60 and ON_CALL.delay(14 * 3600) == 5 * 60


def test_a_tiny_run_writes_every_table(detection: Detection, tmp_path: Path) -> None:
    args = benchmark.parse_args(
        [
            "--days",
            "0.5",
            "--seeds",
            "1",
            "--calibration-seeds",
            "1",
            "--calibration-days",
            "0.5",
            "--calibration-steps",
            "2",
            "--sweep-seeds",
            "1",
            "--jobs",
            "1",
            "--out",
            str(tmp_path / "e.json"),
        ]
    )
    result = benchmark.execute(args, detection, 0.0, "tiny")
    document = json.loads(report.dumps(result))
    assert set(document["main"]["table"]) == set(simulation.POLICIES)
    text = report.markdown(document)
    for heading in (
        "| policy | ETTR | share of the achievable gain | human minutes |",
        "| fault class |",
        "| policy at 16,384 GPUs | ETTR |",
        "| interval | restart |",
        "| assumption | value |",
        "| fault | alerts (first firing, s) |",
        "| component | category | count | share | simulated as |",
    ):
        assert heading in text
    assert "Nightshift takes" in report.summary_sentence(document)


def test_the_readmes_show_the_saved_results() -> None:
    document = json.loads((RESULTS / "ettr.json").read_text())
    bench_readme = report.BENCH_README.read_text()
    assert report.block_of(bench_readme, report.BEGIN, report.END) == report.markdown(document)
    readme = report.README.read_text()
    assert report.block_of(readme, report.SUMMARY_BEGIN, report.SUMMARY_END) == report.summary_sentence(
        document
    )
