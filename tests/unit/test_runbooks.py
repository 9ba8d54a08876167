"""Every shipped alert (rules/*.yml, rules/sim/*.yml and the chart's generated PrometheusRule) has a runbook_url,
<docs base>/runbooks.md#<alert in lower case>, whose file and section exist in this repository (issue 21 item 3,
issue 23 item 7). The chart's base override: tests/integration/test_chart.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from rules import gen_prometheusrule, runbooks

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTATION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Documentation"]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M)
    }


def alerting_rules(path: Path) -> list[dict[str, Any]]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


SOURCES = [*sorted((ROOT / "rules").glob("*.yml")), *sorted((ROOT / "rules" / "sim").glob("*.yml"))]
RULES = [(path, rule) for path in [*SOURCES, gen_prometheusrule.OUTPUT] for rule in alerting_rules(path)]


@pytest.mark.parametrize(
    ("path", "rule"), RULES, ids=[f"{p.relative_to(ROOT)}:{r['alert']}" for p, r in RULES]
)
def test_every_alert_links_its_runbook_section(path, rule):
    url = rule["annotations"]["runbook_url"]
    assert url == runbooks.url(rule["alert"])
    assert url.startswith(DOCUMENTATION + "/")
    document, _, anchor = url.removeprefix(DOCUMENTATION + "/").partition("#")
    local = ROOT / "docs" / document  # the documentation's base is the repository's docs/
    assert local.is_file(), f"{url}: no {local.relative_to(ROOT)}"
    assert anchor in anchors(local.read_text()), f"{url}: no section {anchor!r} in {local.relative_to(ROOT)}"


def test_the_rule_files_hold_every_alert_of_the_contract():
    """The parametrisation above is not empty by accident: every file, every alert."""
    names = {rule["alert"] for _, rule in RULES}
    assert {"GpuXidError", "TrainingHang", "NightshiftDown", "SlurmNodeDown"} <= names
    assert len({path for path, _ in RULES}) == len(SOURCES) + 1


def test_a_missing_section_is_caught():
    text = (ROOT / "docs" / "runbooks.md").read_text()
    assert "gpuxiderror" in anchors(text)
    assert "gpuxiderror" not in anchors(text.replace("### GpuXidError", "### Xid errors"))
