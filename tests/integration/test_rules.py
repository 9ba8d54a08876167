"""Prometheus rule files: promtool checks and unit tests for every file, coverage of every alert by those tests,
the generated Xid rules (up to date, one class per code, same classes as the diagnosis), and the fast variant
kept in step with production."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.domain.diagnosis.xid import catalogue, xid_class
from rules import gen_xid_rules
from tests.fixtures.procs import require_binary

pytestmark = pytest.mark.integration

RULES = Path(gen_xid_rules.__file__).resolve().parent
PRODUCTION = sorted(RULES.glob("*.yml"))
FAST = sorted((RULES / "sim").glob("*.yml"))
# Nightshift's own alerts: no simulator variant (rules/sim/ is the simulated GPU cluster's).
OWN = RULES / "nightshift.yml"
TESTS = sorted((RULES / "tests").glob("*.yml"))
ALERTS = {
    "GpuXidError",
    "GpuEccDoubleBitError",
    "GpuRowRemapFailure",
    "GpuNvlinkErrors",
    "GpuThermalThrottle",
    "GpuEccCorrectableRising",
    "GpuRowRemapPending",
    "GpuPcieReplaysRising",
    "GpuNvlinkCrcRising",
    "NodeInfinibandErrorsRising",
    "TrainingStraggler",
    "GpuMemoryGrowth",
    "GpuVanished",
    "DcgmExporterDown",
    "SlurmNodeDown",
    "GpuNodeNotReady",
    "HostMemoryPressure",
    "TrainingHang",
    "TrainingThroughputDrop",
    "TrainingCheckpointStale",
    "TrainingLossNaN",
    "TrainingLossDivergence",
    "TrainingMetricsAbsent",
    "TrainingJobError",
    "NightshiftDown",
    "NightshiftTargetDown",
    "NightshiftStoreUnavailable",
    "NightshiftInboxBacklog",
    "NightshiftInboxSetAside",
    "NightshiftWorkerStalled",
    "NightshiftCredentialError",
    "NightshiftIncidentsNeedPeople",
    "NightshiftNodesHeld",
    "NightshiftWebhookRejecting",
    "NightshiftAlertsTruncated",
    "NightshiftPaused",
}


def promtool() -> str:
    return require_binary("promtool", "apt-get install prometheus")


def rules_of(path: Path) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def name(path: Path) -> str:
    return str(path.relative_to(RULES))


def test_rule_files_exist() -> None:
    assert [p.name for p in PRODUCTION] == [
        "gpu.yml",
        "gpu_xid.yml",
        "nightshift.yml",
        "node.yml",
        "training.yml",
    ]
    assert [p.name for p in FAST] == [p.name for p in PRODUCTION if p != OWN]


@pytest.mark.parametrize("path", PRODUCTION + FAST, ids=name)
def test_promtool_check_rules(path: Path) -> None:
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules_of(path))} rules found" in result.stdout


@pytest.mark.parametrize("path", TESTS, ids=name)
def test_promtool_unit_tests(path: Path) -> None:
    # promtool resolves rule_files relative to the test file.
    result = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_of_every_file_is_tested_firing_and_quiet() -> None:
    """Each rule file's alerts appear in its unit tests both with expected alerts and with none."""
    for rule_file in PRODUCTION + FAST:
        firing: set[str] = set()
        quiet: set[str] = set()
        for test_file in TESTS:
            spec = yaml.safe_load(test_file.read_text())
            if (test_file.parent / spec["rule_files"][0]).resolve() != rule_file:
                continue
            for case in (c for test in spec["tests"] for c in test.get("alert_rule_test", [])):
                (firing if case["exp_alerts"] else quiet).add(case["alertname"])
        alerts = {rule["alert"] for rule in rules_of(rule_file)}
        assert alerts <= firing, f"{name(rule_file)}: never tested firing: {alerts - firing}"
        if rule_file in PRODUCTION:
            assert alerts <= quiet, f"{name(rule_file)}: never tested quiet: {alerts - quiet}"
    assert {rule["alert"] for path in PRODUCTION for rule in rules_of(path)} == ALERTS


def test_fast_variant_has_the_same_alerts_and_labels() -> None:
    """rules/sim/X.yml differs from rules/X.yml in windows only: same alerts, same static labels, in order."""
    for production, fast in zip([p for p in PRODUCTION if p != OWN], FAST, strict=True):
        signature = [(rule["alert"], rule.get("labels")) for rule in rules_of(production)]
        assert signature == [(rule["alert"], rule.get("labels")) for rule in rules_of(fast)], name(fast)


def test_every_alert_has_severity_and_annotations() -> None:
    for path in PRODUCTION + FAST:
        for rule in rules_of(path):
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
            assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]


def test_generated_xid_rules_are_up_to_date() -> None:
    assert gen_xid_rules.main(["--check"]) == 0, "run: python -m rules.gen_xid_rules"


def xid_matchers(expr: str) -> list[tuple[str, re.Pattern[str]]]:
    """The (operator, anchored regex) matchers on ``xid`` in one GpuXidError expression."""
    found = re.findall(r'\bxid(=~|!~)"([^"]*)"', expr)
    assert found, expr
    return [(op, re.compile(f"(?:{regex})")) for op, regex in found]


def test_each_xid_code_has_exactly_one_class_and_it_is_the_diagnosis_class() -> None:
    rules = rules_of(RULES / "gpu_xid.yml")
    matchers = [(rule["labels"]["xid_class"], xid_matchers(rule["expr"])) for rule in rules]

    def classes_of(code: int) -> list[str]:
        return [
            cls
            for cls, ms in matchers
            if all(bool(regex.fullmatch(str(code))) == (op == "=~") for op, regex in ms)
        ]

    for code in [*catalogue(), 173, 999, 12345]:  # codes past the catalogue are class "other"
        assert classes_of(code) == [xid_class(code)], code
    assert classes_of(0) == []  # DCGM's "no Xid"
    assert (
        classes_of(79) == ["reboot"] and classes_of(48) == ["reset_gpu"] and classes_of(13) == ["restart_app"]
    )
    assert {
        rule["labels"]["xid_class"]: rule["labels"]["severity"] for rule in rules
    } == gen_xid_rules.CLASS_SEVERITY
