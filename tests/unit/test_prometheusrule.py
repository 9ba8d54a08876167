"""The chart's PrometheusRule groups are generated from rules/*.yml and must not drift from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rules import gen_prometheusrule


def test_the_chart_rules_are_up_to_date() -> None:
    assert gen_prometheusrule.main(["--check"]) == 0, "run: python -m rules.gen_prometheusrule"


def test_every_production_rule_is_in_the_chart_unchanged() -> None:
    sources = sorted(gen_prometheusrule.RULES.glob("*.yml"))
    expected = [group for path in sources for group in yaml.safe_load(path.read_text())["groups"]]

    generated = yaml.safe_load(gen_prometheusrule.OUTPUT.read_text())["groups"]

    assert generated == expected
    assert sum(len(g["rules"]) for g in generated) == sum(len(g["rules"]) for g in expected) > 0


def test_a_hand_edit_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "prometheus-rules.yaml"
    stale.write_text(gen_prometheusrule.OUTPUT.read_text().replace("severity: critical", "severity: info", 1))
    monkeypatch.setattr(gen_prometheusrule, "OUTPUT", stale)

    assert gen_prometheusrule.main(["--check"]) == 1


def test_a_group_name_used_twice_is_refused(tmp_path: Path) -> None:
    for name in ("a.yml", "b.yml"):
        (tmp_path / name).write_text("groups:\n  - name: same\n    rules: []\n")

    with pytest.raises(ValueError, match="group 'same' is also in"):
        gen_prometheusrule.rule_groups(sorted(tmp_path.glob("*.yml")))


def test_no_shipped_alert_has_the_name_of_a_kube_prometheus_stack_default_rule() -> None:
    """Two alerts of one name are one Alertmanager group per label set: kube-prometheus-stack's KubeNodeNotReady
    (no Hostname) would merge every node's NotReady into one node-less incident. Names from the committed list
    (its source is in its header)."""
    listed = Path(__file__).resolve().parents[1] / "data" / "kubernetes" / "kube-prometheus-stack-alerts.txt"
    theirs = {line for line in listed.read_text().splitlines() if line and not line.startswith("#")}
    assert len(theirs) > 100 and "KubeNodeNotReady" in theirs
    ours = gen_prometheusrule.alert_names(sorted(gen_prometheusrule.RULES.glob("*.yml")))
    assert sorted(set(ours) & theirs) == []
