"""Root-cause diagnosis: Xid catalogue and classes, signature scoring and precedence, catalogue validation.

Log fixtures in tests/unit/data/logs are excerpts written from the exact upstream message formats
(tech.md §3, §4).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.domain.diagnosis import (
    CATEGORIES,
    MAX_EVIDENCE,
    MAX_EVIDENCE_CHARS,
    MAX_LINES,
    MAX_LOG_CHARS,
    Diagnosis,
    diagnose,
    load_catalogue,
    tail_lines,
)
from app.domain.diagnosis import xid as xids
from app.domain.errors import ConfigError

LOGS = Path(__file__).parent / "data" / "logs"


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def kernel_lines(name: str, *, keep: bool) -> str:
    """The fixture's kernel (NVRM) lines only, or everything but them."""
    return "\n".join(line for line in log(name).splitlines() if ("NVRM" in line) == keep)


# --- Xid catalogue -----------------------------------------------------------------------------------------


def test_catalogue_reads_every_row_including_the_multiline_mnemonic():
    catalogue = xids.catalogue()
    assert len(catalogue) == 172
    assert sorted(catalogue) == list(range(1, 173))
    assert catalogue[13].mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"
    assert catalogue[14].mnemonic == "ROBUST_CHANNEL_FAKE_ERROR"  # the row after the quoted one is intact
    assert catalogue[79] == xids.XidInfo(
        79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "CONTACT_SUPPORT"
    )


def test_every_catalogue_row_maps_to_a_known_class():
    classes = {code: xids.xid_class(code) for code in xids.catalogue()}
    assert set(classes.values()) <= xids.XID_CLASSES
    # and every class is reached by some row: the mapping does not collapse buckets
    assert set(classes.values()) == xids.XID_CLASSES


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (79, "reboot"),
        (48, "reset_gpu"),  # WORKFLOW_XID_48
        (95, "reset_gpu"),
        (74, "nvlink"),  # WORKFLOW_NVLINK_ERR
        (145, "nvlink"),  # WORKFLOW_NVLINK5_ERR
        (13, "restart_app"),
        (31, "restart_app"),
        (43, "ignore"),
        (63, "ignore"),
        (1, "contact_support"),
        (171, "contact_support"),  # blank immediate action
        (54, "other"),  # CHECK_MECHANICALS
        (45, "other"),  # WORKFLOW_XID_45
        (154, "other"),  # XID_154: the line's own recommendation decides
        (999, "other"),  # not in the catalogue
    ],
)
def test_xid_class(code, cls):
    assert xids.xid_class(code) == cls


@pytest.mark.parametrize(
    ("line", "code", "pci"),
    [
        ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.", 79, "0000:2b:00"),
        (
            "[ 12.5] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping",
            63,
            "0000:10:1c",
        ),
        ("NVRM: Xid (0000:01:00): 3, C 00000005 00000000", 3, "0000:01:00"),  # old drivers: no "PCI:"
    ],
)
def test_xid_from_line(line, code, pci):
    event = xids.xid_from_line(line)
    assert event is not None
    assert (event.code, event.pci, event.recovery) == (code, pci, None)


def test_xid_from_line_ignores_other_lines():
    assert xids.xid_from_line("NVRM: GPU at PCI:0000:2b:00: GPU-6a1e3c7b") is None
    assert xids.xid_from_line("Xid 79 mentioned in prose") is None


@pytest.mark.parametrize(
    ("target", "cls"),
    [
        ("0x2 (Node Reboot Required)", "reboot"),
        ("0x1 (GPU Reset Required)", "reset_gpu"),
        ("0x3 (Drain and Reset)", "reset_gpu"),
        ("0x0 (None)", "ignore"),
    ],
)
def test_xid_154_carries_the_driver_recommendation(target, cls):
    event = xids.xid_from_line(
        f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to {target}"
    )
    assert event is not None and event.xid_class == cls


def test_judge_most_severe_wins_and_keeps_all_events():
    events = [
        xids.XidEvent(63, "a"),
        xids.XidEvent(79, "b"),
        xids.XidEvent(48, "c"),
        xids.XidEvent(63, "a"),  # repeated: kept once
    ]
    verdict = xids.judge(events)
    assert verdict is not None
    assert (verdict.primary.code, verdict.xid_class) == (79, "reboot")
    assert [e.evidence for e in verdict.events] == ["a", "b", "c"]


def test_judge_xid_45_follows_the_other_xid_and_stands_alone_otherwise():
    with_other = xids.judge([xids.XidEvent(45, "a"), xids.XidEvent(13, "b")])
    assert with_other is not None and (with_other.primary.code, with_other.xid_class) == (13, "restart_app")
    solo = xids.judge([xids.XidEvent(45, "a")])
    assert solo is not None and (solo.primary.code, solo.xid_class) == (45, "other")
    assert xids.judge([]) is None


def test_judge_xid_154_raises_the_class_of_the_fault_but_not_lowers_it():
    reboot = xids.XidEvent(154, "r", recovery="Node Reboot Required")
    verdict = xids.judge([xids.XidEvent(13, "a"), reboot])
    assert verdict is not None
    assert (verdict.primary.code, verdict.xid_class, verdict.recovery) == (
        13,
        "reboot",
        "Node Reboot Required",
    )
    milder = xids.judge([xids.XidEvent(79, "a"), xids.XidEvent(154, "n", recovery="GPU Reset Required")])
    assert milder is not None and (milder.xid_class, milder.recovery) == ("reboot", None)


# --- diagnosis from realistic logs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "category", "xid", "xid_class"),
    [
        ("nccl_watchdog_timeout.log", "nccl_network", None, None),
        (
            "nccl_ib_remote_error.log",
            "nccl_network",
            None,
            None,
        ),  # DistBackendError traceback + ChildFailedError
        ("xid79_with_nccl.log", "gpu_hardware", 79, "reboot"),  # peers' NCCL errors are the consequence
        ("xid154_node_reboot.log", "gpu_hardware", 48, "reboot"),
        ("xid154_gpu_reset.log", "gpu_hardware", 119, "reset_gpu"),
        ("xid74_nvlink.log", "nvlink", 74, "nvlink"),
        ("cuda_oom.log", "cuda_oom", None, None),  # a peer's NCCL WARN and the torchrun block do not win
        ("storage_eio.log", "storage_io", None, None),
        ("object_store_timeout.log", "object_store_timeout", None, None),
        ("checkpoint_truncated.log", "checkpoint_corrupt", None, None),
        ("safetensors_header.log", "checkpoint_corrupt", None, None),
        ("nan_divergence.log", "numerical_divergence", None, None),
        ("app_keyerror.log", "application_error", None, None),
        ("xid13_app_fault.log", "application_error", 13, "restart_app"),
    ],
)
def test_log_fixture(name, category, xid, xid_class):
    result = diagnose({}, log(name))
    assert (result.category, result.xid, result.xid_class) == (category, xid, xid_class)
    assert 0.3 <= result.confidence <= 1.0
    assert result.evidence, "a diagnosis always shows its evidence"
    assert all(line.removesuffix("…") in log(name) for line in result.evidence)  # the log's own lines


def test_nccl_evidence_is_the_nccl_lines_and_the_summary_names_the_cause():
    result = diagnose({"Hostname": "gpu-node07"}, log("nccl_watchdog_timeout.log"))
    assert result.summary.startswith("NCCL/network failure on gpu-node07: collective operation timed out")
    assert any("Watchdog caught collective operation timeout" in line for line in result.evidence)
    assert any("NCCL WARN socketProgress" in line for line in result.evidence)
    assert not any("Traceback" in line for line in result.evidence)


def test_xid_79_with_nccl_errors_is_hardware_with_every_xid_as_evidence():
    result = diagnose({"Hostname": "node1"}, log("xid79_with_nccl.log"))
    assert result.summary == (
        "Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) on node1 PCI 0000:2b:00: "
        "drain and reboot the node."
    )
    xid_lines = [line for line in log("xid79_with_nccl.log").splitlines() if "NVRM: Xid" in line]
    assert [line for line in result.evidence if "NVRM: Xid" in line] == xid_lines
    assert len(xid_lines) == 2  # the 79 and the 45 that follows it
    nccl_only = diagnose({}, kernel_lines("xid79_with_nccl.log", keep=False))
    assert nccl_only.category == "nccl_network"
    assert result.confidence > 0.7


def test_xid_154_recommendation_is_in_the_summary():
    result = diagnose({}, log("xid154_node_reboot.log"))
    assert result.summary.endswith(
        "drain and reboot the node (driver recovery action: Node Reboot Required)."
    )


def test_an_app_class_xid_next_to_an_application_error_points_the_same_way():
    plain = diagnose({}, kernel_lines("xid13_app_fault.log", keep=False))
    with_xid = diagnose({}, log("xid13_app_fault.log"))
    assert plain.category == with_xid.category == "application_error"
    assert with_xid.confidence > plain.confidence
    assert (with_xid.xid, with_xid.xid_class) == (13, "restart_app")


def test_app_class_xid_alone_is_the_application():
    result = diagnose({}, kernel_lines("xid13_app_fault.log", keep=True))
    assert (result.category, result.xid, result.xid_class) == ("application_error", 13, "restart_app")
    assert result.summary.endswith("restart the job; the GPU stays in service.")


def test_full_disk_before_a_truncated_checkpoint_is_storage():
    logs = "\n".join(
        [
            "[default0]:OSError: [Errno 28] No space left on device: '/mnt/ckpt/run42/model.pt.tmp'",
            log("checkpoint_truncated.log"),
        ]
    )
    assert diagnose({}, logs).category == "storage_io"


def test_fp16_overflow_skips_are_noise_but_an_exhausted_loss_scale_is_divergence():
    overflow = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {0}, reducing to {1}"
    burst = "\n".join(overflow.format(2**k, 2 ** (k - 1)) for k in range(16, 8, -1))
    assert diagnose({}, burst).category == "benign"
    exhausted = f"{burst}\nException: Current loss scale already at minimum - cannot decrease scale anymore."
    assert diagnose({}, exhausted).category == "numerical_divergence"


# --- labels ------------------------------------------------------------------------------------------------


def test_dcgm_xid_alert_labels_only():
    labels = {
        "alertname": "GpuXidFatal",
        "Hostname": "node1",
        "gpu": "3",
        "err_code": "79",
        "err_msg": "GPU has fallen off the bus",
        "severity": "critical",
    }
    result = diagnose(labels)
    assert result.category == "gpu_hardware"
    assert (result.xid, result.xid_class) == (79, "reboot")
    assert result.summary == "Xid 79 (GPU has fallen off the bus) on node1 GPU 3: drain and reboot the node."
    assert result.evidence == ("label alertname=GpuXidFatal", "label err_code=79")
    assert result.confidence > 0.9


def test_xid_label_for_nvlink():
    result = diagnose({"alertname": "GpuXidFatal", "xid": "74"})
    assert (result.category, result.xid_class) == ("nvlink", "nvlink")
    assert "label xid=74" in result.evidence


def test_application_xid_alert_without_logs():
    result = diagnose({"alertname": "GpuXidApplication", "err_code": "13", "Hostname": "node2", "gpu": "1"})
    assert (result.category, result.xid_class) == ("application_error", "restart_app")
    assert result.confidence < 0.8


@pytest.mark.parametrize("value", ["0", "abc", "79; rm -rf /", ""])
def test_meaningless_xid_labels_are_ignored(value):
    result = diagnose({"err_code": value})
    assert (result.category, result.xid) == ("unknown", None)


def test_loss_nan_alert():
    result = diagnose({"alertname": "TrainingLossNaN", "job_id": "run42"})
    assert result.category == "numerical_divergence"
    assert result.evidence == ("label alertname=TrainingLossNaN",)
    assert 0.5 < result.confidence < 0.9


@pytest.mark.parametrize(
    ("error_class", "category"),
    [
        ("nccl", "nccl_network"),
        ("cuda_oom", "cuda_oom"),
        ("storage_io", "storage_io"),
        ("object_store_timeout", "object_store_timeout"),
        ("checkpoint_corrupt", "checkpoint_corrupt"),
        ("nan", "numerical_divergence"),
    ],
)
def test_error_class_label(error_class, category):
    result = diagnose({"alertname": "TrainingJobFailed", "error_class": error_class})
    assert result.category == category
    assert f"label error_class={error_class}" in result.evidence


def test_labels_and_logs_agree_for_more_confidence():
    from_logs = diagnose({}, log("cuda_oom.log"))
    both = diagnose({"error_class": "cuda_oom"}, log("cuda_oom.log"))
    assert both.category == "cuda_oom"
    assert both.confidence > from_logs.confidence
    assert both.evidence[0] == "label error_class=cuda_oom"


# --- nothing, and bounds -----------------------------------------------------------------------------------


@pytest.mark.parametrize("logs", ["", "\n\n", "epoch done\nsaving\n"])
def test_nothing_recognised_is_unknown(logs):
    result = diagnose({"alertname": "TrainingStalled"}, logs)
    assert result == Diagnosis(
        category="unknown",
        confidence=0.0,
        summary="No known failure signature in the alert labels or the "
        f"{len(logs.splitlines())} log lines examined.",
    )


def test_evidence_is_deduplicated_truncated_and_capped():
    warn = (
        "node1:1234:{0} [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> "
    )
    lines = [warn.format(i) + "x" * 900 for i in range(60)]
    result = diagnose({}, "\n".join(lines + lines))  # every line twice
    assert result.category == "nccl_network"
    assert len(result.evidence) == MAX_EVIDENCE
    assert all(len(item) <= MAX_EVIDENCE_CHARS for item in result.evidence)
    assert result.evidence[0].startswith(warn.format(0))
    assert result.evidence[1].startswith(warn.format(1))  # first occurrences, in order, no repeats


def test_only_the_last_lines_are_examined():
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.75 GiB."
    logs = "\n".join([oom] + ["step ok"] * MAX_LINES)
    assert diagnose({}, logs).category == "unknown"
    assert diagnose({}, logs + "\n" + oom).category == "cuda_oom"


def test_tail_lines_bounds_lines_and_characters():
    assert tail_lines("a\nb\n" * MAX_LINES) == ["a", "b"] * (MAX_LINES // 2)
    long_lines = "first\n" + ("y" * 999 + "\n") * (MAX_LOG_CHARS // 1000 + 1) + "last"
    lines = tail_lines(long_lines)
    assert sum(len(line) + 1 for line in lines) <= MAX_LOG_CHARS
    assert lines[-1] == "last"
    assert "first" not in lines


def test_tail_lines_drops_the_cut_partial_line():
    logs = "a" * 10 + "\n" + "b" * (MAX_LOG_CHARS - 5) + "\nlast"
    lines = tail_lines(logs)
    assert lines[-1] == "last"
    assert all(not line.startswith("a") for line in lines)


def test_as_dict():
    result = diagnose({"alertname": "GpuXidFatal", "err_code": "79"})
    assert result.as_dict() == {
        "category": "gpu_hardware",
        "confidence": result.confidence,
        "summary": result.summary,
        "evidence": ["label alertname=GpuXidFatal", "label err_code=79"],
        "xid": 79,
        "xid_class": "reboot",
        "actionable": True,
        "culprit": None,
        "restartable": True,
    }


# --- the signature catalogue -------------------------------------------------------------------------------


def test_packaged_catalogue_covers_every_category():
    catalogue = load_catalogue()
    covered = {
        s.category for s in catalogue.line_signatures + catalogue.label_signatures if s.role == "cause"
    }
    assert covered == set(CATEGORIES)
    assert {s.label for s in catalogue.label_signatures} == {"alertname", "error_class"}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "signatures.yaml"
    path.write_text(text, encoding="utf-8")
    return path


GOOD_ENTRY = "- category: cuda_oom\n  pattern: 'out of memory'\n  weight: 5\n  description: oom\n"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "- category: cuda_oom\n  pattern: 'Tried to (allocate'\n  weight: 5\n  description: oom\n",
            ":6: signature #2: invalid regex 'Tried to (allocate'",
        ),
        (
            "- category: gpu_melted\n  pattern: 'x'\n  weight: 5\n  description: d\n",
            ":5: signature #2: unknown category 'gpu_melted'",
        ),
        ("- category: cuda_oom\n  pattern: 'x'\n  weight: 5\n", ":5: signature #2: missing description"),
        (
            "- category: cuda_oom\n  pattern: 'x'\n  weight: 5\n  description: d\n  flags: i\n",
            ":9: signature #2: unknown key 'flags'",
        ),
        ("- category: cuda_oom\n  pattern: 'x'\n  weight: 0\n  description: d\n", ":7: signature #2: weight"),
        (
            "- category: cuda_oom\n  pattern: 'x'\n  weight: yes\n  description: d\n",
            ":7: signature #2: weight",
        ),
        (
            "- category: cuda_oom\n  pattern: '.*'\n  weight: 5\n  description: d\n",
            ":6: signature #2: regex '.*' matches the empty string",
        ),
        (
            "- category: cuda_oom\n  label: 'alert name'\n  pattern: 'x'\n  weight: 5\n  description: d\n",
            ":6: signature #2: label must be a label name",
        ),
        ("- just a string\n", ":5: signature #2 must be a mapping"),
    ],
)
def test_catalogue_errors_name_file_and_line(tmp_path, entry, message):
    path = _write(tmp_path, GOOD_ENTRY + entry)
    with pytest.raises(ConfigError) as caught:
        load_catalogue(path)
    assert str(caught.value).startswith(str(path) + message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("category: cuda_oom\n", ":1: the catalogue must be a list of signatures"),
        (GOOD_ENTRY + "- category: [unclosed\n", ":6: invalid YAML"),
    ],
)
def test_catalogue_shape_and_syntax_errors(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_catalogue(path)
    assert str(caught.value).startswith(str(path) + message)


def test_missing_catalogue_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read signature catalogue"):
        load_catalogue(tmp_path / "absent.yaml")


def test_a_custom_catalogue_drives_diagnosis(tmp_path):
    entry = (
        "- category: storage_io\n  pattern: 'lustre: .* evicted'\n  weight: 5\n  description: Lustre eviction"
    )
    catalogue = load_catalogue(_write(tmp_path, entry))
    result = diagnose({"Hostname": "n1"}, "kernel: lustre: fs1-OST0004 evicted this client", catalogue)
    assert result.category == "storage_io"
    assert result.summary.startswith("Storage I/O failure on n1: Lustre eviction (1 matching log line)")
    assert diagnose({}, log("cuda_oom.log"), catalogue).category == "unknown"


def test_the_diagnosis_package_stays_pure():
    """Importing every module of app.domain.diagnosis loads no network, database, process or web library."""
    code = (
        "import sys, app.domain.diagnosis, app.domain.diagnosis.lines, app.domain.diagnosis.evidence, "
        "app.domain.diagnosis.stacks, app.domain.diagnosis.signatures, app.domain.diagnosis.xid; "
        "io = ('flask', 'requests', 'sqlalchemy', 'socket', 'urllib.request', 'paramiko', 'subprocess', "
        "'kubernetes'); bad = [m for m in io if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_playbook_docs_list_every_diagnosis_category():
    docs = (Path(__file__).parents[2] / "docs" / "playbooks.md").read_text(encoding="utf-8")
    start = docs.index("The diagnosis category is one of")
    sentence = docs[start : docs.index("confidence_floor", start)]
    listed = set(re.findall(r"`([a-z_]+)`", sentence))
    assert listed == {*CATEGORIES, "benign", "unknown"}
