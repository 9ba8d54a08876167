"""docs/playbooks.md as a writer reads it (issue 23 item 4): its complete example loads and passes strict lint, and
the name pattern it states is the one the loader enforces."""

from __future__ import annotations

import re
from pathlib import Path

from app.actions import default_registry
from app.domain.playbooks import PLAYBOOK_NAME, parse_playbooks
from tests.fixtures.procs import nightshift_cli as nightshift

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "playbooks.md").read_text()


def example() -> str:
    section = DOC.split("## A complete example", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_complete_example_loads_with_every_part_and_passes_strict_lint(tmp_path):
    (playbook,) = parse_playbooks(example(), "example.yaml", default_registry())
    assert playbook.collect and playbook.steps and playbook.verify and playbook.recheck
    assert playbook.node_repair is not None and playbook.node_repair.validate is not None
    assert any(step.when for step in playbook.steps) and playbook.priority == 80
    path = tmp_path / "example.yaml"
    path.write_text(example())
    result = nightshift("lint", "--strict", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_documented_name_pattern_is_the_loaders():
    assert f"`{PLAYBOOK_NAME}`" in DOC
