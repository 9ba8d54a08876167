"""bench/ettr.py: the physical model's accounting, the baselines, and one fault through the real engine."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench import ettr

DAY = 86400


def test_a_crash_loses_the_work_since_the_last_checkpoint_and_a_restart_costs_its_minutes() -> None:
    p = ettr.Params(days=1)
    world = ettr.World(p, random.Random(0))
    world.advance(3600 + 20 * 60)  # checkpoints every 30 min: the last at 1 h
    assert world.job.progress == 4800 and world.job.checkpoint == 3600
    world.job.crash("boom")
    assert world.job.progress == 3600
    world.job.requeue(world.now)  # queued 60 s, then loading: training restart_minutes after it
    world.advance(world.now + p.restart_minutes * 60)
    assert world.job.state == "RUNNING" and world.job.progress == 3600
    world.advance(world.now + 600)
    assert world.job.progress == 3600 + 600


def test_no_fault_is_an_ettr_of_one_for_every_policy(tmp_path: Path) -> None:
    p = ettr.Params(days=0.5)
    assert ettr.run_baseline(p, [], 0, naive=False)["ettr"] == 1.0
    assert ettr.run_baseline(p, [], 0, naive=True)["ettr"] == 1.0
    assert ettr.run_nightshift(p, [], 0, tmp_path)["ettr"] == 1.0


def test_people_answer_slower_at_night() -> None:
    p = ettr.Params()
    assert ettr.person_delay(p, 3 * 3600) == (120 + 15) * 60  # 03:00
    assert ettr.person_delay(p, 14 * 3600) == (20 + 15) * 60  # 14:00


def test_faults_arrive_at_the_llama3_rate_scaled_to_the_job() -> None:
    p = ettr.Params(days=3000, hangs_per_day=0, stragglers_per_day=0)
    per_day = len(ettr.draw_faults(p, random.Random(1))) / p.days
    assert abs(per_day - 419 / 54 / 16) < 0.05  # 1,024 of 16,384 GPUs: 0.485 a day


def test_a_faulty_gpu_nightshift_excludes_the_node_the_naive_loop_lands_on_it_again(tmp_path: Path) -> None:
    p = ettr.Params(days=1)
    fault = [ettr.Fault(10 * 3600, "faulty_gpu", gpu=3)]
    copy = [ettr.Fault(10 * 3600, "faulty_gpu", gpu=3)]
    nightshift = ettr.run_nightshift(p, fault, 0, tmp_path)
    naive = ettr.run_baseline(p, copy, 0, naive=True)
    assert nightshift["restarts_onto_faulty_node"] == 0 and nightshift["wrong_actions"] == 0
    assert naive["restarts_onto_faulty_node"] >= 1
    assert nightshift["ettr"] > naive["ettr"]


def test_main_writes_the_table_of_the_three_policies(tmp_path: Path) -> None:
    out = tmp_path / "ettr.json"
    assert ettr.main(["--days", "1", "--seeds", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["table"]) == {"nightshift", "person", "naive"}
    assert all(0 < row["ettr_mean"] <= 1 for row in report["table"].values())
    assert report["interruptions_per_day"] == 419 / 54 / 16
