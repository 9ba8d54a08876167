"""Render TrainingStraggler from its settings, ``rules/settings/straggler.yml``: ``python -m rules.gen_straggler``.

The settings are ``k`` (a node's slowest rank against the job's median rank), ``rate`` (the window of the rates),
``for`` and ``min_ranks``, one block per rule file (the production rules and the simulator's fast variant). The
rule's block in each file, from its comment to its description, is replaced by the rendering; the rest of the file
is left as it is. ``--check`` exits 1 when a committed file differs from its rendering (a test runs it), so the
settings and the rules never disagree. After a change run ``python -m rules.gen_prometheusrule`` for the chart.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from string import Template
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
SETTINGS = ROOT / "settings" / "straggler.yml"
_DURATION = re.compile(r"[1-9][0-9]*[smh]")

# The rule, with $k, $rate, $for_ and $min_ranks (string.Template: a literal $ is $$).
RULE = Template((ROOT / "settings" / "straggler.rule.tmpl").read_text())
# The rule's block in a rule file: its comment (the lines above it starting "# Straggler") through its description.
_BLOCK = re.compile(
    r"^      # Straggler \(fail-slow\).*?^      - alert: TrainingStraggler\n.*?^          description: [^\n]*\n",
    re.MULTILINE | re.DOTALL,
)


class SettingsError(ValueError):
    """A setting of rules/settings/straggler.yml out of its bounds."""


def checked(name: str, block: Mapping[str, Any]) -> dict[str, str]:
    """The template values of one settings block; SettingsError naming the block and the field otherwise."""
    k = block.get("k")
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not 1 < k <= 100:
        raise SettingsError(f"{SETTINGS.name}: {name}.k: a number above 1 (at most 100), got {k!r}")
    for field in ("rate", "for"):
        if not isinstance(block.get(field), str) or not _DURATION.fullmatch(block[field]):
            raise SettingsError(
                f"{SETTINGS.name}: {name}.{field}: a duration such as 5m, got {block.get(field)!r}"
            )
    ranks = block.get("min_ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 3 <= ranks <= 1_000_000:
        raise SettingsError(f"{SETTINGS.name}: {name}.min_ranks: an integer of 3 or more, got {ranks!r}")
    return {"k": f"{k:g}", "rate": block["rate"], "for_": block["for"], "min_ranks": str(ranks)}


def render(text: str, values: Mapping[str, str]) -> str:
    """``text`` (a rule file) with its TrainingStraggler block rendered from ``values``."""
    rendered, count = _BLOCK.subn(lambda _: RULE.substitute(values), text)
    if count != 1:
        raise SettingsError(
            f"expected one TrainingStraggler block with its '# Straggler (fail-slow)' comment, found {count}"
        )
    return rendered


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rules.gen_straggler", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a rule file differs from its rendering"
    )
    args = parser.parse_args(argv)
    settings = yaml.safe_load(SETTINGS.read_text())
    stale = []
    for name, block in settings.items():
        path = ROOT / block["file"]
        text = path.read_text()
        rendered = render(text, checked(name, block))
        if rendered == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT.parent)))
        else:
            path.write_text(rendered)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run python -m rules.gen_straggler): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
