"""TrainingStraggler is rendered from its settings (rules/settings/straggler.yml, rules/gen_straggler.py): the
committed rule files agree with them, a setting reaches the rule, and a bad setting is refused naming it."""

from __future__ import annotations

import pytest
import yaml

from rules import gen_straggler


def test_the_committed_rule_files_are_their_rendering() -> None:
    assert gen_straggler.main(["--check"]) == 0, "run: python -m rules.gen_straggler"


def test_k_and_the_windows_reach_the_rule() -> None:
    text = (gen_straggler.ROOT / "training.yml").read_text()
    values = gen_straggler.checked("production", {"k": 2.5, "rate": "10m", "for": "30m", "min_ranks": 4})
    rendered = gen_straggler.render(text, values)
    rule = next(
        r
        for group in yaml.safe_load(rendered)["groups"]
        for r in group["rules"]
        if r.get("alert") == "TrainingStraggler"
    )
    assert "2.5 * quantile" in rule["expr"] and "[10m]" in rule["expr"] and "[5m]" not in rule["expr"]
    assert rule["expr"].rstrip().endswith(">= 4)") and rule["for"] == "30m"
    assert "over 2.5x the job's median rank" in rule["annotations"]["description"]
    others = [
        r
        for g in yaml.safe_load(rendered)["groups"]
        for r in g["rules"]
        if r.get("alert") != "TrainingStraggler"
    ]
    assert others == [
        r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if r.get("alert") != "TrainingStraggler"
    ]


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"k": 1, "rate": "5m", "for": "15m", "min_ranks": 3}, "k"),
        ({"k": "1.5", "rate": "5m", "for": "15m", "min_ranks": 3}, "k"),
        ({"k": 1.5, "rate": "5 minutes", "for": "15m", "min_ranks": 3}, "rate"),
        ({"k": 1.5, "rate": "5m", "for": "0m", "min_ranks": 3}, "for"),
        ({"k": 1.5, "rate": "5m", "for": "15m", "min_ranks": 2}, "min_ranks"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(block: dict[str, object], field: str) -> None:
    with pytest.raises(gen_straggler.SettingsError, match=rf"production\.{field}:"):
        gen_straggler.checked("production", block)
