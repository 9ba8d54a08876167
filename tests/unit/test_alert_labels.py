"""docs/playbooks.md's table of the labels every shipped alert carries is the one app/alert_labels.py reads from
rules/tests."""

from __future__ import annotations

from pathlib import Path

from app.alert_labels import alert_labels, labels_table

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_generated_from_the_rules():
    assert labels_table() in (ROOT / "docs" / "playbooks.md").read_text()


def test_every_alert_of_the_rules_has_its_labels():
    labels = alert_labels()
    assert "gpu" not in labels["DcgmExporterDown"] and "gpu" in labels["GpuXidError"]
    assert all("alertname" in found and "severity" in found for found in labels.values())
