"""Every benchmark script runs end to end with tiny parameters and writes well-formed results. No timings asserted.

The ingest, memory and profile scripts start real gunicorn servers (fresh SQLite under a temporary directory,
free ports) and the load generator as a separate process, exactly as ``make bench`` does, only briefly.
``bench.e2e`` runs one round (about 35 s) on the session's Slurm cluster, marked ``e2e`` like the tier that
drives the same stack.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest

from bench import (
    contention,
    decision,
    e2e,
    engine_ingest,
    floor,
    ingest,
    lifecycle,
    memory,
    profile,
    record,
    report,
    servers,
)
from bench.servers import KINDS, NIGHTSHIFT_KINDS
from bench.stats import percentile
from bench.workload import Fleet, schedule
from tests.fixtures.procs import require_binary


def read(path):
    document = json.loads(path.read_text())
    assert document["machine"]["nproc"] >= 1 and document["machine"]["python"]
    assert len(document["loadavg_at_finish"]) == 3
    return document["results"]


def test_schedule_offers_exactly_the_alert_rate_in_groups_of_one_to_fifty():
    planned = schedule(Fleet(3), 500, duration_s=4)
    sizes = [n.alerts for _, n in planned]
    assert min(sizes) >= 1 and max(sizes) <= 50
    # Notification i is due when the alerts before it were offered at 500/s.
    assert [offset for offset, _ in planned[:3]] == [0, sizes[0] / 500, (sizes[0] + sizes[1]) / 500]
    assert planned[-1][0] < 4 <= (sum(sizes)) / 500
    bodies = [json.loads(n.body) for _, n in planned]
    assert all(
        b["version"] == "4" and len(b["alerts"]) == n.alerts
        for b, (_, n) in zip(bodies, planned, strict=True)
    )
    statuses = {a["status"] for b in bodies for a in b["alerts"]}
    assert statuses == {"firing", "resolved"}  # repeats resolve too
    assert len(schedule(Fleet(3), 100, total_alerts=1000)) >= 1000 / 50


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)
    assert percentile([7.0], 99) == 7.0


def test_decision_benchmark_writes_both_series(tmp_path):
    out = tmp_path / "decision.json"
    decision.main(["--sizes", "10,100", "--alerts", "20", "--repeats", "2", "--out", str(out)])
    series = read(out)["series"]
    assert set(series) == {"indexed", "unindexed_1pct"}
    for rows in series.values():
        assert [r["synthetic_playbooks"] for r in rows] == [10, 100]
        assert all(r["match_us"]["median"] > 0 and r["decision_us"]["n"] == 2 for r in rows)
        assert rows[0]["ratio_to_first"] == {"match_us": 1.0, "decision_us": 1.0}
    # The index keeps the candidates per alert independent of the number of playbooks.
    assert series["indexed"][0]["candidates_per_alert"] == series["indexed"][1]["candidates_per_alert"]


def test_engine_ingest_benchmark_times_each_round(tmp_path):
    out = tmp_path / "engine_ingest.json"
    engine_ingest.main(["--notifications", "5", "--rounds", "2", "--out", str(out)])
    results = read(out)
    assert results["per_alert_us"]["n"] == 2 and results["per_alert_us"]["median"] > 0
    assert all(r["alerts"] >= 5 for r in results["rounds"])


def test_lifecycle_benchmark_counts_incidents_and_their_transactions(tmp_path):
    out = tmp_path / "lifecycle.json"
    lifecycle.main(["--notifications", "10", "--rounds", "2", "--out", str(out)])
    results = read(out)
    assert results["ms_per_incident"]["n"] == 2 and results["ms_per_incident"]["median"] > 0
    for round_ in results["rounds"]:
        assert round_["incidents"] > 0 and "open" not in round_["by_state"]  # every incident ran to its end
        assert round_["write_transactions_per_incident"] >= 3  # claim, release and the close at the least


def test_ingest_benchmark_measures_every_server(tmp_path):
    out = tmp_path / "ingest.json"
    ingest.main(["--rates", "60", "--rounds", "1", "--duration", "2", "--warmup", "0.5", "--out", str(out)])
    results = read(out)
    assert sorted(r["server"] for r in results["runs"]) == sorted(KINDS)
    for run in results["runs"]:
        assert run["errors"] == 0, run["errors_by_kind"]
        assert set(run["latency_ms"]) == {"p50", "p90", "p99", "max", "mean"}
        assert run["offered"]["alerts_per_s"] > 0 and run["measured"]["notifications"] >= 1
        assert run["server_cpu_cores"] > 0  # the server parsed and stored every notification
    for kind in KINDS[1:]:
        row = next(r for r in results["summary"] if r["server"] == kind)
        assert set(row["ratio_to_floor"]) == {"p50", "p99"}
    # 500 alerts/s was not offered
    assert results["verdicts"] == [{"server": kind, "measured": False} for kind in NIGHTSHIFT_KINDS]


def test_contention_benchmark_measures_each_server_alone_and_beside_the_neighbour(tmp_path):
    out = tmp_path / "contention.json"
    contention.main(["--rate", "60", "--rounds", "1", "--duration", "2", "--out", str(out)])
    results = read(out)
    pairs = sorted((r["server"], r["neighbour"]) for r in results["runs"])
    assert pairs == sorted((s, n) for s in contention.SERVERS for n in contention.NEIGHBOURS)
    assert all(r["errors"] == 0 for r in results["runs"])
    busy = [r for r in results["runs"] if r["neighbour"] == "busy"]
    # It ran beside the server (how much of a core it got, asked 0.9, depends on what else the machine runs).
    assert all(r["neighbour_cpu_cores"] > 0 for r in busy)
    lone_floor = next(r for r in results["summary"] if r["server"] == "floor" and r["neighbour"] == "none")
    assert lone_floor["ratio_to_floor"]["p99"]["median"] == 1.0
    text = report.render(tmp_path)
    assert "### A CPU-bound neighbour on the same cores" in text and "| nightshift-webhook | busy |" in text


def test_server_cpu_seconds_count_this_process_work():
    before = servers.cpu_seconds(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    assert servers.cpu_seconds(os.getpid()) - before >= 0.1


def test_the_durable_floor_commits_every_body(tmp_path):
    client = floor.create_durable_app(str(tmp_path)).test_client()
    for n in range(3):
        assert client.post("/api/v1/alerts", json={"alerts": [n]}).get_json()["inbox_id"] == n + 1
    with sqlite3.connect(tmp_path / "floor.db") as conn:
        assert conn.execute("SELECT body FROM inbox ORDER BY id").fetchall() == [
            ('{"alerts": [0]}',),
            ('{"alerts": [1]}',),
            ('{"alerts": [2]}',),
        ]


def test_memory_benchmark_reads_worker_rss_at_each_step(tmp_path):
    out = tmp_path / "memory.json"
    memory.main(["--alerts", "150", "--step", "75", "--rate", "150", "--settle", "0.2", "--out", str(out)])
    results = read(out)
    assert [c["alerts"] >= 75 * i for i, c in enumerate(results["checkpoints"])] == [True, True, True]
    assert all(len(c["rss_mib"]) == 1 for c in results["checkpoints"])  # serve's SQLite default: one worker
    assert results["summary"]["errors"] == 0 and results["summary"]["idle_rss_mib"] > 10


def test_profile_benchmark_attributes_samples_to_app_code(tmp_path):
    if profile.py_spy() is None:
        require_binary("py-spy", "pip install py-spy (dev extra)")
    out = tmp_path / "profile.json"
    profile.main(["--rate", "200", "--duration", "3", "--out", str(out)])
    result = read(out)["profile"]
    assert result["samples"] > 0
    # Some samples are attributed to Nightshift's own files (which ones a few seconds catch depends on the load).
    assert result["app_inclusive_pct"]


def test_collapse_counts_a_frame_once_per_sample_whatever_the_line():
    lines = [
        'process 1:"x";process 2:"y";main (app/cli.py:3);f (app/a.py:1);f (app/a.py:2) 3\n',
        "main (app/cli.py:3);g (lib.py:9) 1\n",
    ]
    total, inclusive, own = profile.collapse(lines)
    assert total == 4
    assert inclusive["f (app/a.py)"] == 3 and inclusive["main (app/cli.py)"] == 4
    assert own == {"f (app/a.py)": 3, "g (lib.py)": 1}


@pytest.mark.parametrize("with_before", [False, True])
def test_report_renders_tables_from_results(tmp_path, with_before):
    decision.main(
        ["--sizes", "10", "--alerts", "10", "--repeats", "1", "--out", str(tmp_path / "decision.json")]
    )
    if with_before:
        (tmp_path / "before-fix").mkdir()
        (tmp_path / "before-fix" / "decision.json").write_text((tmp_path / "decision.json").read_text())
    text = report.render(tmp_path)
    assert "### Decision cost" in text and "| indexed | 10 |" in text
    assert "Webhook ingest" not in text  # no ingest results here


E2E_MARKS = {
    "fault": 0.0,
    "scraped": 0.6,
    "firing": 1.2,
    "opened": 2.5,
    "acting": 4.0,
    "requeued": 4.5,
    "steps_done": 5.0,
    "running": 11.0,
    "progress": 12.5,
    "recovered": 17.0,
}


def test_e2e_spans_add_up_to_fault_to_recovery_and_give_nightshifts_share():
    spans = e2e.spans(E2E_MARKS, [0.4, 0.6])
    stages = ("detect", "deliver", "decide", "act", "restart", "verify")
    assert sum(spans[key] for key in stages) == pytest.approx(spans["total"]) and spans["total"] == 17.0
    assert spans["scrape"] + spans["evaluate"] == pytest.approx(spans["detect"])
    assert (spans["decide"], spans["steps"], spans["own"]) == (1.5, 1.0, 2.5)
    assert spans["share"] == round(2.5 / 17, 4)
    assert (spans["slurm"], spans["verify_after_steps"]) == (6.5, 12.0)


def test_e2e_first_sample_is_the_earliest_one_after_the_fault_above_the_threshold():
    series = [{"values": [[99.0, "79"], [101.0, "0"], [102.5, "79"]]}, {"values": [[103.0, "5"]]}]
    assert e2e.first_sample(series, after=100) == 101.0
    assert e2e.first_sample(series, after=100, above=0) == 102.5
    assert e2e.first_sample(series, after=100, above=10) == 102.5
    assert e2e.first_sample(series, after=200) is None


@pytest.mark.e2e
def test_e2e_benchmark_times_every_stage_of_a_round(slurm_cluster, tmp_path):
    results = e2e.measure(slurm_cluster, 1, tmp_path, find_binary=require_binary)
    (measured,) = results["rounds"]
    marks = measured["marks_s"]
    order = ("fault", "scraped", "firing", "opened", "acting", "requeued", "steps_done", "recovered")
    assert [marks[m] for m in order] == sorted(marks[m] for m in order), marks
    assert marks["acting"] < marks["running"] < marks["progress"] < marks["recovered"], marks
    assert [s["phase"] for s in measured["steps"]] == [
        "collect",
        "steps",
    ]  # the job requeue (the drain: its repair)
    assert 0 < measured["spans"]["share"] < 1
    assert (
        results["slurm_requeue_to_running_s"]["n"] == 1 and results["slurm_requeue_to_running_s"]["min"] > 0
    )
    assert results["configured"]["verify_interval_s"] == 12 and results["configured"]["group_wait_s"] == 1
    assert results["summary"]["total"]["median"] == measured["spans"]["total"]


def test_report_renders_the_e2e_table_with_floors(tmp_path):
    rounds = [{"spans": e2e.spans(E2E_MARKS, [0.4, 0.6])}, {"spans": e2e.spans(E2E_MARKS, [0.5, 0.5])}]
    configured = {
        "scrape_interval_s": 1.0,
        "evaluation_interval_s": 1.0,
        "rule_for_s": 0.0,
        "group_wait_s": 1.0,
        "verify_interval_s": 12.0,
        "worker_poll_s": 0.5,
    }
    results = {
        "configured": configured,
        "slurm_requeue_to_running_s": {"rounds": [6.0, 6.4], "median": 6.2, "min": 6.0, "max": 6.4, "n": 2},
        "summary": e2e.summarize(rounds),
        "rounds": rounds,
    }
    record.write(tmp_path / "e2e.json", "e2e", {}, results)
    text = report.render(tmp_path)
    assert "### End to end" in text
    assert "| fault → incident recovered | 17.0 (17.0-17.0) | 15.0 |" in text  # 2 + 1 + max(12, 6.2 + 1)
    assert "| alert firing → incident opened (Alertmanager → webhook) | 1.3 (1.3-1.3) | 1.0 |" in text
    assert "Nightshift's own share of fault → recovered: 14.7 (14.7-14.7) %" in text
