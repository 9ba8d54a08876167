"""bench/ettr/detection.py against the real promtool: the shipped rules, over the series a fault leaves, raise the
alerts the playbooks match on, on the right nodes, after their windows; and the detection the benchmark saved is
what promtool answers for the rules in the tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.ettr import detection, signals
from tests.fixtures.procs import require_binary

KINDS = ("gpu_fell_off_bus", "silent_hang", "thermal_straggler")
WATCHDOG = 600.0


@pytest.fixture(scope="module")
def found() -> detection.Detection:
    promtool = require_binary("promtool", "apt-get install prometheus")
    return detection.evaluate(WATCHDOG, 0.6, promtool=promtool, kinds=KINDS)


def alerts(found: detection.Detection, kind: str) -> dict[tuple[str, str], detection.Detected]:
    return {(a.alertname, a.role): a for a in found.of(kind, 4200)}


def test_an_xid_79_raises_the_reboot_class_on_the_culprit_and_the_peers_errors_after_the_watchdog(found):
    raised = alerts(found, "gpu_fell_off_bus")
    xid = raised[("GpuXidError", "culprit")].label_dict()
    assert xid["xid"] == "79" and xid["xid_class"] == "reboot" and xid["slurm_job_id"] == signals.JOB_ID
    assert xid["Hostname"] == signals.CULPRIT and raised[("GpuXidError", "culprit")].delay <= 60
    peer_error = raised[("TrainingJobError", "peer")]
    assert peer_error.label_dict()["error_class"] == "nccl" and peer_error.delay >= WATCHDOG
    assert ("GpuXidError", "peer") not in raised


def test_a_silent_hang_raises_training_hang_on_every_node_after_its_window(found):
    raised = alerts(found, "silent_hang")
    assert {name for name, _ in raised} == {"TrainingHang"}
    assert {role for _, role in raised} == {"culprit", "peer"}
    assert all(15 * 60 <= a.delay <= 21 * 60 for a in raised.values())


def test_a_throttled_gpu_is_a_straggler_on_its_node_only(found):
    raised = alerts(found, "thermal_straggler")
    assert ("TrainingStraggler", "culprit") in raised and ("GpuThermalThrottle", "culprit") in raised
    assert all(role == "culprit" for _, role in raised)


def test_the_saved_detection_is_promtools_answer(found):
    saved = json.loads(
        (Path(__file__).resolve().parents[2] / "bench/results/ettr-detection.json").read_text()
    )
    assert saved["digest"] == detection.inputs_digest(WATCHDOG, 0.6)
    saved_alerts = detection.Detection.from_json(saved["alerts"])
    for kind in KINDS:
        assert saved_alerts.of(kind, 4200) == found.of(kind, 4200)
