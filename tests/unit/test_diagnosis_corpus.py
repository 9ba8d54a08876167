"""Diagnosis scored on the corpora in tests/data/diagnosis.

- the held-out-style corpus (``cases.yaml`` at the top): realistic logs built from public error texts;
- the real corpus (``real/cases.yaml``): logs written by real torchrun jobs (torch CPU build, gloo) with one fault
  injected each (``real/produce.py`` remakes them; ``real/README.md`` says how each was made);
- the public-texts corpus (``public/cases.yaml``): logs built around real error texts of public reports (NCCL,
  EFA, DeepSpeed, JAX, Ray, Lustre, S3, Kubernetes), each citing its sources, and bad input (not UTF-8, lines
  interleaved, a summary cut off mid-way).

Each case names its log file, the alert labels it arrives with, the expected category, and, where the evidence
points at one, the expected culprit (any of node, rank, gpu); a real case also says whether a restart can recover
the job (``restartable``). The test prints the scores (``pytest -s`` shows them) and holds them to the thresholds
the diagnosis is accepted on: categories right in at least 95% of cases, at most 1 in 20 benign logs flagged as a
fault, the culprit named in at least 90% of the cases that have one; on the real corpus, every case right; on the
public-texts corpus, 90% of categories and culprits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.domain.diagnosis import BENIGN, UNKNOWN, Diagnosis, diagnose

CORPUS = Path(__file__).parents[1] / "data" / "diagnosis"
REAL = CORPUS / "real"
PUBLIC = CORPUS / "public"
NO_FAULT = (BENIGN, UNKNOWN)


def load(directory: Path) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = yaml.safe_load((directory / "cases.yaml").read_text(encoding="utf-8"))
    for case in cases:
        case["path"] = directory / case["file"]
    return cases


CASES = load(CORPUS)
REAL_CASES = load(REAL)
PUBLIC_CASES = load(PUBLIC)


def run(case: dict[str, Any]) -> Diagnosis:
    # Real output is bytes: read it as the log collectors do (undecodable bytes replaced, never an error).
    text = case["path"].read_bytes().decode("utf-8", errors="replace")
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


@pytest.mark.parametrize(
    ("directory", "cases", "why"), [(REAL, REAL_CASES, "fault"), (PUBLIC, PUBLIC_CASES, "source")]
)
def test_the_real_and_public_corpora_are_complete(directory: Path, cases: list[dict[str, Any]], why: str):
    files = {case["file"] for case in cases}
    assert len(files) == len(cases), "each case has its own log"
    assert files == {path.name for path in directory.glob("*.log")}, (
        "every log is in the index and vice versa"
    )
    assert all(why in case and "restartable" in case for case in cases)


def score(
    name: str, cases: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> tuple[float, float, float]:
    """(accuracy, benign false-positive rate, culprit rate), printed with every miss."""
    results = [(case, run(case)) for case in cases]
    wrong = [(c, r) for c, r in results if r.category != c["category"]]
    benign = [(c, r) for c, r in results if c["category"] in NO_FAULT]
    flagged = [(c, r) for c, r in benign if r.actionable]
    with_culprit = [(c, r) for c, r in results if "culprit" in c]
    missed = [(c, r) for c, r in with_culprit if not culprit_named(c, r)]
    unrestartable = [(c, r) for c, r in results if "restartable" in c and r.restartable != c["restartable"]]
    accuracy = 1 - len(wrong) / len(results)
    false_positive = len(flagged) / len(benign) if benign else 0.0
    culprit_rate = 1 - len(missed) / len(with_culprit) if with_culprit else 1.0
    with capsys.disabled():
        print(
            f"\ndiagnosis corpus {name}: {len(results)} cases; categories {accuracy:.1%} right; "
            f"{len(flagged)}/{len(benign)} benign flagged ({false_positive:.1%}); "
            f"culprit named in {len(with_culprit) - len(missed)}/{len(with_culprit)} ({culprit_rate:.1%})"
        )
        for case, result in wrong:
            print(
                f"  category {case['file']}: expected {case['category']}, got {result.category}: {result.summary}"
            )
        for case, result in missed:
            print(f"  culprit {case['file']}: expected {case['culprit']}, got {result.culprit}")
        for case, result in unrestartable:
            print(f"  restartable {case['file']}: expected {case['restartable']}, got {result.summary}")
    assert not unrestartable
    return accuracy, false_positive, culprit_rate


def test_corpus_scores(capsys: pytest.CaptureFixture[str]):
    accuracy, false_positive, culprit_rate = score("held-out style", CASES, capsys)
    assert accuracy >= 0.95
    assert false_positive <= 0.05
    assert culprit_rate >= 0.90


def test_real_corpus_scores(capsys: pytest.CaptureFixture[str]):
    assert score("real", REAL_CASES, capsys) == (1.0, 0.0, 1.0)


def test_public_texts_corpus_scores(capsys: pytest.CaptureFixture[str]):
    accuracy, false_positive, culprit_rate = score("public texts", PUBLIC_CASES, capsys)
    assert accuracy >= 0.9
    assert false_positive <= 0.05
    assert culprit_rate >= 0.9


@pytest.mark.parametrize(
    "case",
    [c for c in CASES + REAL_CASES + PUBLIC_CASES if c["category"] not in NO_FAULT],
    ids=lambda c: c["file"],
)
def test_a_fault_verdict_shows_its_evidence_and_is_actionable(case):
    result = run(case)
    if result.category == case["category"]:
        assert result.actionable
        assert result.evidence
        assert result.as_dict()["actionable"] is True
