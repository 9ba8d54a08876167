"""Which labels each shipped alert carries, read from the promtool unit tests of ``rules/`` (``exp_labels`` of
every expected alert: what the real rule evaluation produced, checked by ``promtool test rules``).

An alert may carry a label in one case and not another (``slurm_job_id`` only while a job runs on the GPU); the
set is every label any tested firing carried. Used by ``nightshift lint`` (a template naming a label the matched
alerts never carry renders empty) and by docs/playbooks.md's table of alerts and labels.
"""

from __future__ import annotations

from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parents[1] / "rules"
# Nightshift's own alerts (rules/nightshift.yml) are named so: they go to people and never reach Nightshift, so no
# playbook matches them (alerts/alertmanager.yml, rules/gen_prometheusrule.py).
OWN_PREFIX = "Nightshift"


def own(name: str) -> bool:
    """Whether ``name`` is one of Nightshift's own alerts."""
    return name.startswith(OWN_PREFIX)


def alert_labels(rules_dir: Path = RULES_DIR) -> dict[str, frozenset[str]]:
    """Alert name → the labels its tested firings carry, from ``rules_dir/tests/*.yml`` (production tests only:
    the ``sim_*`` files test the simulator's copies of the same alerts), for the alerts that reach Nightshift (not
    its :func:`own`). Empty when the directory is absent (an install without the repository's rules)."""
    found: dict[str, set[str]] = {}
    for path in sorted((rules_dir / "tests").glob("*.yml")):
        if path.name.startswith("sim_"):
            continue
        for test in (yaml.safe_load(path.read_text()) or {}).get("tests") or []:
            for case in test.get("alert_rule_test") or []:
                for expected in case.get("exp_alerts") or []:
                    found.setdefault(case["alertname"], set()).update(expected.get("exp_labels") or {})
    return {name: frozenset({"alertname", *labels}) for name, labels in found.items() if not own(name)}


def labels_table(rules_dir: Path = RULES_DIR) -> str:
    """The Markdown table of docs/playbooks.md, "Labels of the shipped alerts" (a test keeps the two equal)."""
    rows = ["| alert | labels its firings carry (rules/tests) |", "|---|---|"]
    for name, labels in sorted(alert_labels(rules_dir).items()):
        rows.append(f"| `{name}` | {', '.join(f'`{label}`' for label in sorted(labels, key=str.lower))} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(labels_table())
