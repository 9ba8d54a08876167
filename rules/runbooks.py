"""The runbook of every shipped alert: ``runbook_url`` is ``<base>#<alert name in lower case>``, a section of
docs/runbooks.md, with ``<base>`` the repository's documentation (pyproject.toml ``[project.urls] Documentation``)
followed by ``/runbooks.md``. The chart swaps the base for ``monitoring.prometheusRule.runbookBaseUrl`` when that is
set (templates/prometheusrule.yaml; gen_prometheusrule writes the default base beside the rules for it).
tests/unit/test_runbooks.py checks that every alert has this URL and that its file and section exist."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = "docs/runbooks.md"  # in the repository, under the documentation's base "docs"


def base() -> str:
    """The default runbook base URL: the documentation's URL and the runbooks file."""
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    return f"{urls['Documentation'].rstrip('/')}/runbooks.md"


def url(alert: str) -> str:
    """The ``runbook_url`` of ``alert``."""
    return f"{base()}#{alert.lower()}"
