"""Diagnosis scored on the corpus in tests/data/diagnosis: realistic logs built from public error texts.

Each case in ``cases.yaml`` names its log file, the alert labels it arrives with, the expected category, and,
where the evidence points at one, the expected culprit (any of node, rank, gpu). The test prints the scores
(``pytest -s`` shows them) and holds them to the thresholds the diagnosis is accepted on: categories right in
at least 95% of cases, at most 1 in 20 benign logs flagged as a fault, the culprit named in at least 90% of
the cases that have one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.diagnosis import BENIGN, UNKNOWN, Diagnosis, diagnose

CORPUS = Path(__file__).parents[1] / "data" / "diagnosis"
CASES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "cases.yaml").read_text(encoding="utf-8"))
NO_FAULT = (BENIGN, UNKNOWN)


def run(case: dict[str, Any]) -> Diagnosis:
    text = (CORPUS / case["file"]).read_text(encoding="utf-8")
    return diagnose(case.get("labels") or {}, text)


def culprit_named(case: dict[str, Any], result: Diagnosis) -> bool:
    """Every field the case expects matches the diagnosis' culprit."""
    expected = case["culprit"]
    if result.culprit is None:
        return False
    got = {"node": result.culprit.node, "rank": result.culprit.rank, "gpu": result.culprit.gpu}
    return all(got[key] == value for key, value in expected.items())


def test_the_corpus_is_large_varied_and_complete():
    assert len(CASES) >= 80
    files = {case["file"] for case in CASES}
    assert len(files) == len(CASES), "each case has its own log"
    assert files == {path.name for path in CORPUS.glob("*.log")}, "every log is in the index and vice versa"
    categories = {case["category"] for case in CASES}
    assert {BENIGN, "gpu_hardware", "nccl_network", "storage_io", "host_oom", "hang"} <= categories
    assert sum(case["category"] == BENIGN for case in CASES) >= 20
    assert sum("culprit" in case for case in CASES) >= 20


def test_corpus_scores(capsys: pytest.CaptureFixture[str]):
    results = [(case, run(case)) for case in CASES]
    wrong = [(c, r) for c, r in results if r.category != c["category"]]
    benign = [(c, r) for c, r in results if c["category"] in NO_FAULT]
    flagged = [(c, r) for c, r in benign if r.actionable]
    with_culprit = [(c, r) for c, r in results if "culprit" in c]
    missed = [(c, r) for c, r in with_culprit if not culprit_named(c, r)]
    accuracy = 1 - len(wrong) / len(results)
    false_positive = len(flagged) / len(benign)
    culprit_rate = 1 - len(missed) / len(with_culprit)
    with capsys.disabled():
        print(
            f"\ndiagnosis corpus: {len(results)} cases; categories {accuracy:.1%} right; "
            f"{len(flagged)}/{len(benign)} benign flagged ({false_positive:.1%}); "
            f"culprit named in {len(with_culprit) - len(missed)}/{len(with_culprit)} ({culprit_rate:.1%})"
        )
        for case, result in wrong:
            print(
                f"  category {case['file']}: expected {case['category']}, got {result.category}: {result.summary}"
            )
        for case, result in missed:
            print(f"  culprit {case['file']}: expected {case['culprit']}, got {result.culprit}")
    assert accuracy >= 0.95
    assert false_positive <= 0.05
    assert culprit_rate >= 0.90


@pytest.mark.parametrize("case", [c for c in CASES if c["category"] not in NO_FAULT], ids=lambda c: c["file"])
def test_a_fault_verdict_shows_its_evidence_and_is_actionable(case):
    result = run(case)
    if result.category == case["category"]:
        assert result.actionable
        assert result.evidence
        assert result.as_dict()["actionable"] is True
