#!/usr/bin/env python3
"""Write the RBAC table of docs/kubernetes.md from charts/nightshift/files/rbac.yaml, the rights' one source (the
chart renders its roles from the same file). Usage: scripts/rbac_table.py [--check]; --check exits 1, writing
nothing, when the document's table is not the file's (tests/integration/test_chart.py runs it)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "charts" / "nightshift" / "files" / "rbac.yaml"
DOC = ROOT / "docs" / "kubernetes.md"
BEGIN = "<!-- rbac table: scripts/rbac_table.py writes it from charts/nightshift/files/rbac.yaml -->"
END = "<!-- end of rbac table -->"


def table(source: Path = SOURCE) -> str:
    """The Markdown table: one row per rule, its group's scope, and why."""
    rows = ["| object | scope | apiGroups | resources | verbs | why |", "|---|---|---|---|---|---|"]
    for group, spec in yaml.safe_load(source.read_text())["groups"].items():
        for rule in spec["rules"]:
            groups = ", ".join(f"`{g}`" if g else '`""` (core)' for g in rule["apiGroups"])
            cells = [
                f"`{group}`",
                spec["scope"],
                groups,
                ", ".join(rule["resources"]),
                ", ".join(rule["verbs"]),
                rule["why"],
            ]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def with_table(text: str, rendered: str) -> str:
    """``text`` with the lines between the markers replaced by ``rendered``."""
    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise SystemExit(f"{DOC}: the markers {BEGIN!r} and {END!r} are missing")
    return f"{head}{BEGIN}\n{rendered}\n{END}{tail}"


def main(argv: list[str]) -> int:
    current = DOC.read_text()
    wanted = with_table(current, table())
    if "--check" in argv:
        if current != wanted:
            print(f"{DOC}: the RBAC table differs from {SOURCE}: run scripts/rbac_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
