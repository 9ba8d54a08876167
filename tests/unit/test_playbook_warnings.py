"""Warnings of ``nightshift lint``: playbooks that load but would not do what they say."""

from __future__ import annotations

from pathlib import Path

from app.actions import default_registry
from app.domain.playbook_warnings import warnings
from app.domain.playbooks import parse_playbooks

ROOT = Path(__file__).resolve().parents[2]


def test_lint_warns_when_a_verification_window_reaches_before_the_action():
    text = (ROOT / "playbooks" / "communication.yaml").read_text()
    assert warnings(parse_playbooks(text, "c.yaml", default_registry())) == []
    wide = text.replace("[1m]", "[10m]")
    (warning,) = warnings(parse_playbooks(wide, "c.yaml", default_registry()))
    assert warning.startswith("c.yaml:") and "looks back 600s, longer than the first poll (90s" in warning


def test_ranges_are_found_and_shortened_outside_string_literals():
    from datetime import timedelta

    from app.domain.promql_window import clamp_ranges, ranges

    expr = 'increase(x{a=~"n[0-9]+"}[5m]) > 0 and max_over_time(y[1h30m:1m]) > 0 and rate(z[10s])'
    assert ranges(expr) == [300, 5400, 10]
    assert clamp_ranges(expr, timedelta(seconds=40)) == (
        'increase(x{a=~"n[0-9]+"}[40s]) > 0 and max_over_time(y[40s:1m]) > 0 and rate(z[10s])'
    )
    assert clamp_ranges(expr, timedelta(0)).count("[1s") == 3
