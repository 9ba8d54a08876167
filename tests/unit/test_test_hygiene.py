"""The suite keeps itself honest: no xfail that may pass unnoticed, no wall-clock sleep in a unit test."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# Unit tests that still wait on the wall clock: progress/'s exporter threads (a real HTTP endpoint and its writer).
SLEEPS_LEFT = {"test_progress.py"}


def test_an_xfail_that_passes_fails_the_run() -> None:
    options = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert options["xfail_strict"] is True


def test_no_test_makes_its_xfail_lenient() -> None:
    lenient = re.compile(r"xfail\([^)]*strict\s*=\s*False", re.DOTALL)
    found = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        if path.name != Path(__file__).name and lenient.search(path.read_text())
    ]
    assert not found, f"a lenient xfail in {found}"


def test_no_unit_test_sleeps_on_the_wall_clock() -> None:
    sleep = re.compile(r"\btime\.sleep\(|\bfrom time import sleep\b")
    found = [
        path.name
        for path in (TESTS / "unit").rglob("test_*.py")
        if path.name not in SLEEPS_LEFT and sleep.search(path.read_text())
    ]
    assert not found, f"a unit test sleeps (advance a FakeClock, or wait on an event): {found}"
