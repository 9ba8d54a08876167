"""The simulator's ``dcgmi`` look-alike (sim/dcgmi.py): dcgmi 4.x's table and exit status, a verdict that follows
the injected faults, and the injected verdicts (fail, pass, hang)."""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path

import pytest

from sim import dcgmi, faults

# dcgmi 4.4.2's output of `dcgmi diag -r 2 -i 0` on a healthy GPU, as posted in NVIDIA/DCGM issue #124.
REAL_PASS = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 4.4.2                                          |
| Driver Version Detected   | 580.105.08                                     |
| GPU Device IDs Detected   | 2237                                           |
|-----  Deployment  --------+------------------------------------------------|
| software                  | Pass                                           |
|                           | GPU0: Pass                                     |
+-----  Hardware  ----------+------------------------------------------------+
| memory                    | Pass                                           |
|                           | GPU0: Pass                                     |
+-----  Integration  -------+------------------------------------------------+
| pcie                      | Pass                                           |
|                           | GPU0: Pass                                     |
+---------------------------+------------------------------------------------+
"""


def test_a_healthy_level_2_run_prints_dcgmis_table_and_passes() -> None:
    diagnosis = dcgmi.report(2, [0], [], driver="580.105.08")
    expected = REAL_PASS.replace("| 2237   ", "| 2330   ")  # an H100 instead of the post's GPU
    assert diagnosis.output == expected
    assert (diagnosis.exit_code, diagnosis.passed) == (0, True)


def test_xid_79_fails_the_software_test_of_that_gpu(tmp_path: Path) -> None:
    faults.inject_xid(tmp_path, "node2", 3, 79)
    diagnosis = dcgmi.diagnose(faults.load(tmp_path), "node2", 2, range(8))
    assert diagnosis.exit_code == dcgmi.EXIT_FAIL == 226
    assert diagnosis.findings == (dcgmi.Finding("software", 3, "Detected XID 79 for GPU 3"),)
    lines = diagnosis.output.splitlines()
    assert "| software                  | Fail                                           |" in lines
    assert "|                           | GPU3: Fail                                     |" in lines
    assert "| Warning: GPU3             | Detected XID 79 for GPU 3                      |" in lines
    assert "| memory                    | Pass                                           |" in lines
    assert all(len(line) == 78 for line in lines[1:]), "every table line is 78 characters wide"


def test_other_nodes_and_harmless_xids_pass(tmp_path: Path) -> None:
    faults.inject_xid(tmp_path, "node2", 3, 79)
    faults.inject_xid(tmp_path, "node1", 0, 13)  # Graphics Engine Exception: the application's, not the GPU's
    assert dcgmi.diagnose(faults.load(tmp_path), "node1", 2, range(8)).passed
    assert dcgmi.diagnose(faults.load(tmp_path), "node3", 2, range(8)).passed


@pytest.mark.parametrize(
    ("kind", "test", "message"),
    [
        ("ecc", "memory", "CUDA APIs have indicated that a double-bit ECC error has occured on GPU 5."),
        ("row_remap", "software", "GPU 5 had uncorrectable memory errors and row remapping failed."),
        ("nvlink", "pcie", "Detected 50 CRC FLIT NvLink errors on GPU 5's NVLink (should be 0)"),
        (
            "vanish",
            "memory",
            "Unable to find a corresponding CUDA device for GPU 5: 'no CUDA-capable device is detected'",
        ),
    ],
)
def test_gpu_faults_fail_the_test_that_finds_them(tmp_path: Path, kind: str, test: str, message: str) -> None:
    faults.inject_gpu_fault(tmp_path, "node1", 5, kind)
    diagnosis = dcgmi.diagnose(faults.load(tmp_path), "node1", 2, range(8))
    assert diagnosis.findings == (dcgmi.Finding(test, 5, message),)
    # Long messages wrap at 45 characters under their "Warning: GPU5" line, as dcgmi's DisplayVerboseInfo does.
    warning = [line for line in diagnosis.output.splitlines() if "Warning: GPU5" in line]
    assert warning and message.startswith(warning[0][30:75].rstrip())


def test_thermal_throttling_does_not_fail_level_2(tmp_path: Path) -> None:
    faults.inject_gpu_fault(tmp_path, "node1", 2, "thermal")
    assert dcgmi.diagnose(faults.load(tmp_path), "node1", 2, range(8)).passed


def test_injected_verdicts_override_the_faults_until_the_node_is_cleared(tmp_path: Path) -> None:
    faults.inject_validation(tmp_path, "node2", "fail")
    failed = dcgmi.diagnose(faults.load(tmp_path), "node2", 1, range(8))  # level 1 runs `software` only
    assert failed.exit_code == 226 and failed.findings[0].test == "software"

    faults.inject_xid(tmp_path, "node2", 3, 79)
    faults.inject_validation(tmp_path, "node2", "pass")  # e.g. the GPU was replaced
    assert dcgmi.diagnose(faults.load(tmp_path), "node2", 2, range(8)).passed

    faults.inject_validation(tmp_path, "node2", "fail")
    faults.clear(tmp_path, node="node2")  # a reboot clears the faults and the injected verdict
    assert faults.load(tmp_path).validation("node2") is None
    assert dcgmi.diagnose(faults.load(tmp_path), "node2", 2, range(8)).passed
    with pytest.raises(ValueError, match="unknown validation verdict"):
        faults.inject_validation(tmp_path, "node2", "maybe")


def args(*argv: str) -> argparse.Namespace:
    return dcgmi.parse_args(["diag", *argv])


def test_run_reads_the_node_and_state_from_the_environment(tmp_path: Path) -> None:
    faults.inject_xid(tmp_path, "node2", 3, 79)
    env = {"SIM_STATE_DIR": str(tmp_path), "SIM_NODE": "node2"}
    slept: list[float] = []
    code, output = dcgmi.run(args("-r", "medium", "-i", "2,3"), env, sleep=slept.append)
    assert code == 226 and "GPU Device IDs Detected   | 2330,2330 " in output
    assert "GPU3: Fail" in output and "GPU0" not in output
    assert slept == [1.0]  # the run takes $SIM_DIAG_SECONDS (default 1)
    code, _ = dcgmi.run(args("-r", "2", "--host", "node1"), env, sleep=slept.append)
    assert code == 0  # --host wins over $SIM_NODE


def test_no_host_engine_without_a_node_or_a_simulated_cluster(tmp_path: Path) -> None:
    code, output = dcgmi.run(args("-r", "2"), {"SIM_STATE_DIR": str(tmp_path)}, sleep=lambda _: None)
    assert code == dcgmi.EXIT_NO_HOST
    assert output.startswith("Error: unable to establish a connection to the specified host: localhost")
    missing = {"SIM_STATE_DIR": str(tmp_path / "gone")}
    assert (
        dcgmi.run(args("-r", "2", "--host", "node1"), missing, sleep=lambda _: None)[0] == dcgmi.EXIT_NO_HOST
    )


def test_a_hanging_verdict_returns_only_when_its_reader_is_gone(tmp_path: Path) -> None:
    faults.inject_validation(tmp_path, "node1", "hang")
    hung: list[bool] = []
    env = {"SIM_STATE_DIR": str(tmp_path)}
    code, output = dcgmi.run(args("-r", "2", "--host", "node1"), env, hang=lambda: hung.append(True))
    assert (hung, code, output) == ([True], 1, "")

    read, write = os.pipe()
    waiter = threading.Thread(target=dcgmi.hang_until_hangup, args=(write,))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # someone still reads: it hangs
    os.close(read)  # the SSH channel closed at the caller's timeout
    waiter.join(5)
    assert not waiter.is_alive()
    os.close(write)


@pytest.mark.parametrize(("level", "message"), [("9", "invalid run level"), ("xxl", "invalid run level")])
def test_bad_levels_and_gpu_lists_are_refused(tmp_path: Path, level: str, message: str) -> None:
    env = {"SIM_STATE_DIR": str(tmp_path), "SIM_NODE": "node1"}
    with pytest.raises(dcgmi.UsageError, match=message):
        dcgmi.run(args("-r", level), env, sleep=lambda _: None)
    with pytest.raises(dcgmi.UsageError, match="invalid GPU list"):
        dcgmi.run(args("-r", "2", "-i", "0,x"), env, sleep=lambda _: None)
    assert dcgmi.main(["diag", "-r", level, "--host", "node1"]) == 1
