"""bench.diagnosis runs end to end with small logs and writes well-formed results (no timings asserted), and
its synthetic logs get the verdicts they are built for."""

from __future__ import annotations

import json

from app.domain.diagnosis import MAX_LINES, MAX_LOG_CHARS, diagnose, tail_lines
from bench import diagnosis


def test_the_benchmark_writes_its_results(tmp_path):
    out = tmp_path / "diagnosis.json"
    diagnosis.main(["--repeats", "1", "--lines", "400", "--out", str(out)])
    document = json.loads(out.read_text())
    assert document["benchmark"] == "diagnosis" and document["params"]["lines"] == 400
    results = document["results"]
    assert set(results) == {"healthy", "fault", "all_errors", "stacks_64", "buried"}
    assert all(row["ms"]["n"] == 1 and row["ms"]["median"] > 0 for row in results.values())


def test_the_full_size_logs_sit_at_the_diagnosis_bounds():
    for make in (diagnosis.healthy_log, diagnosis.all_errors_log):
        text = make()
        assert len(text.splitlines()) == MAX_LINES
        assert 0.95 * diagnosis.TAIL_CHARS <= len(text) <= diagnosis.TAIL_CHARS
        assert len(tail_lines(text)) == MAX_LINES
    buried = diagnosis.buried_log()
    assert 0.9 * MAX_LOG_CHARS <= len(buried) <= MAX_LOG_CHARS
    assert len(buried.splitlines()) > 3 * MAX_LINES


def test_the_synthetic_logs_get_their_verdicts():
    assert diagnose({}, diagnosis.healthy_log(2000)).category == "benign"
    fault = diagnose({}, diagnosis.fault_log(2000))
    assert fault.category == "gpu_hardware" and fault.culprit is not None
    assert fault.culprit.node == diagnosis._node(13)
    buried = diagnose({}, diagnosis.buried_log(2000))
    assert buried.category == "gpu_hardware" and buried.culprit is not None
    assert buried.culprit.node == diagnosis._node(13)
    stacks = diagnose({}, diagnosis.stacks_log())
    assert stacks.category == "storage_io"
    assert stacks.culprit is not None and (stacks.culprit.rank, stacks.culprit.node) == (
        42,
        diagnosis._node(42),
    )
