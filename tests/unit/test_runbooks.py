"""Every alert of rules/nightshift.yml has a runbook_url whose section exists in docs/runbooks.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M)
    }


RULES = [
    rule
    for group in yaml.safe_load((ROOT / "rules" / "nightshift.yml").read_text())["groups"]
    for rule in group["rules"]
]


@pytest.mark.parametrize("rule", RULES, ids=[r["alert"] for r in RULES])
def test_every_own_alert_links_its_runbook_section(rule):
    url = rule["annotations"]["runbook_url"]
    path, _, anchor = url.partition("#")
    assert path.endswith("/docs/runbooks.md") and anchor == rule["alert"].lower()
    assert anchor in anchors(RUNBOOKS.read_text())
