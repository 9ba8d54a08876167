"""Diagnosis on the formats real jobs write: buried causes in big logs, torchrun's summary however it is cut,
py-spy's failure on a stopped rank, Flight Recorder dumps (the real corpus in tests/data/diagnosis/real holds
the full logs)."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.domain.diagnosis import (
    BENIGN,
    CATEGORIES,
    MAX_BURIED,
    MAX_LINES,
    MAX_LOG_CHARS,
    UNKNOWN,
    diagnose,
    flight,
    stacks,
    tail_lines,
)
from app.domain.diagnosis.launcher import LauncherReading

XID = (
    "Dec  3 09:59:58 gpu-n07 kernel: NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)


def progress(count: int) -> list[str]:
    return [f"[rank{i % 64}]: step {i} | loss 2.{i % 1000:03d} | tokens/s 180000" for i in range(count)]


def test_an_xid_20000_lines_before_the_end_of_a_2_mib_log_is_found():
    after = progress(20_000)
    before = progress(30_000)
    text = "\n".join([*before, XID, *after])
    assert 2 * 1024 * 1024 <= len(text) <= MAX_LOG_CHARS
    result = diagnose({}, text)
    assert (result.category, result.xid) == ("gpu_hardware", 79)
    assert result.culprit is not None and result.culprit.node == "gpu-n07"


def test_the_lines_before_the_classified_tail_keep_only_buried_causes_and_a_bounded_number():
    lines = tail_lines("\n".join([XID] * (MAX_BURIED + 50) + progress(MAX_LINES)))
    assert len(lines) == MAX_BURIED + MAX_LINES
    assert lines[:MAX_BURIED] == [XID] * MAX_BURIED


def test_a_summary_cut_inside_the_root_cause_keeps_what_it_saw():
    reading = LauncherReading()
    for index, line in enumerate(
        [
            "Root Cause (first observed failure):",
            "[0]:",
            "  host      : gpu-a11",
            "  rank      : 3 (local_rank: 3)",
            "  exitcode  : -9 (pi",
        ]
    ):
        reading.feed(index, line)
    reading.finish()
    (failure,) = reading.failures
    assert (failure.rank, failure.host, failure.exitcode, failure.signal_name, failure.root) == (
        3,
        "gpu-a11",
        -9,
        "SIGKILL",
        True,
    )


def test_the_agents_own_kills_are_victims_not_causes():
    reading = LauncherReading()
    lines = [
        "Sending process 18542 closing signal SIGTERM",
        "Unable to shutdown process 18542 via 15, forcefully exiting via 9",
        "Failures:",
        "[1]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 18542)  (SIGKILL)",
    ]
    for index, line in enumerate(lines):
        reading.feed(index, line)
    reading.finish()
    assert reading.killed() == []
    assert [f.rank for f in reading.unresponsive()] == [1]


def test_py_spy_that_cannot_suspend_a_stopped_rank_names_it():
    dump = []
    for rank in (0, 1):
        dump += [f"==> py-spy node=n1 rank={rank} pid={100 + rank} <==", f"Process {100 + rank}: python train.py",
                 f'Thread {100 + rank} (idle): "MainThread"', "    _engine_run_backward (torch/autograd/graph.py:979)",
                 "    backward (torch/autograd/__init__.py:395)"]  # fmt: skip
    dump += ["==> py-spy node=n1 rank=2 pid=102 <==", "Process 102: python train.py", "",
             "Error: Failed to get stack traces", "", "Caused by:", "    0: Failed to suspend process"]  # fmt: skip
    verdict = stacks.judge(stacks.parse_dumps(dump))
    assert verdict is not None and verdict.category == "hang"
    assert verdict.culprit is not None and verdict.culprit.rank == 2


def fr_dump(rank: int, enqueued: int, config: dict[str, Any] | None = None) -> list[str]:
    entries = [
        {
            "collective_seq_id": seq,
            "profiling_name": "gloo:all_reduce",
            "retired": seq < enqueued or rank == 1,
            "pg_id": 0,
        }
        for seq in range(1, enqueued + 1)
    ]
    status = {
        "0": {"last_enqueued_collective": str(enqueued), "last_completed_collective": str(enqueued - 1)}
    }
    return [
        f"==> flight-recorder rank={rank} file=trace{rank} <==",
        json.dumps({"entries": entries, "pg_status": status, **({"pg_config": config} if config else {})}),
    ]


def test_the_flight_recorder_names_the_rank_missing_from_the_stuck_collective():
    lines = fr_dump(0, 9) + fr_dump(1, 8) + fr_dump(2, 9)
    verdict = flight.judge(flight.parse_dumps(lines))
    assert verdict is not None
    assert (verdict.missing, verdict.waiting) == ((1,), (0, 2))
    assert "gloo:all_reduce #9" in verdict.collective


def test_the_flight_recorder_names_the_rank_that_did_not_answer_while_the_others_wait():
    """A SIGSTOPped rank answers nothing (the collect step's read times out); the others wait in one collective of a
    group that has it as a member (pg_config, as torch 2.13 writes it for the default group)."""
    config = {"": {"desc": "", "name": "", "ranks": "[0, 1, 2]"}}
    lines = [
        *fr_dump(0, 21, config),
        "==> flight-recorder rank=1 node=node2 pid=77 <==",
        "curl: (28) Operation timed out after 10001 milliseconds with 0 bytes received",
        *fr_dump(2, 21, config),
    ]
    verdict = flight.judge(flight.parse_dumps(lines), flight.silent_ranks(lines))
    assert verdict is not None and (verdict.missing, verdict.waiting) == ((1,), (0, 2))
    assert any("rank 1 did not answer" in line for line in verdict.evidence)
    result = diagnose(
        {"alertname": "TrainingHang"}, "\n".join(lines)
    )  # the node from the collect step's header
    assert (result.category, result.culprit and (result.culprit.node, result.culprit.rank)) == (
        "hang",
        ("node2", 1),
    )
    # Not when the answering ranks disagree, nor for a rank the group does not have.
    split = [*fr_dump(0, 21, config), "==> flight-recorder rank=1 <==", *fr_dump(2, 20, config)]
    assert flight.judge(flight.parse_dumps(split), flight.silent_ranks(split)).missing == (
        2,
    )  # behind, not silent
    stranger = [*fr_dump(0, 21, config), "==> flight-recorder rank=5 <==", *fr_dump(2, 21, config)]
    assert flight.judge(flight.parse_dumps(stranger), flight.silent_ranks(stranger)) is None


def test_a_flight_recorder_dump_that_is_not_json_is_skipped():
    assert flight.parse_dumps(["==> flight-recorder rank=0 <==", '{"entries": [', "==> other <=="]) == []


REAL = Path(__file__).parents[1] / "data" / "diagnosis" / "real"
PUBLIC = REAL.parent / "public"


@pytest.mark.parametrize("log", sorted(REAL.glob("*.log")), ids=lambda p: p.name)
def test_a_real_log_cut_anywhere_still_gets_a_diagnosis(log: Path):
    """A log cut at any byte (a collector's tail, a summary cut mid-way, a multi-byte character split) is
    diagnosed with what was seen, never an exception."""
    data = log.read_bytes()
    for cut in range(len(data) // 7, len(data), max(1, len(data) // 7)):
        for piece in (data[:cut], data[cut:]):
            result = diagnose({}, piece.decode("utf-8", errors="replace"))
            assert result.category in (*CATEGORIES, BENIGN, UNKNOWN)
            assert result.summary


def test_srun_names_the_one_node_whose_task_was_killed_and_not_a_cancel_that_killed_them_all():
    """The rendezvous host lost (a real Slurm log): srun saw node1's task killed and node2's exit on its own, so
    node2's network errors are the consequence and node1 the culprit. A cancel kills every node's task: srun then
    names no node."""
    log = (REAL / "slurm_rendezvous_host_lost.log").read_text()
    lost = diagnose({"alertname": "TrainingJobError"}, log)
    assert lost.culprit is not None and lost.culprit.node == "node1", lost.summary
    assert any("the task on node1 was killed" in line for line in lost.culprit.evidence)
    cancelled = log.replace(
        "srun: error: node2: task 1: Exited with exit code 1", "srun: error: node2: task 1: Killed"
    )
    both = diagnose({"alertname": "TrainingJobError"}, cancelled)
    assert both.culprit is None or not any("was killed" in line for line in both.culprit.evidence), (
        both.summary
    )


@pytest.mark.parametrize(
    "log",
    [
        "nccl_unique_id_store_reset_pdsh.log",
        "monitored_barrier_root_rank0_gloo.log",
        "nccl_unique_id_socket_timeout.log",
    ],
)
def test_a_rank_the_others_name_is_the_culprit_and_not_placed_on_their_node(log: str):
    """ProcessGroupNCCL's "retrieving ncclUniqueId from [0] ... store->get('0') got error" and ProcessGroupGloo's
    "successfully reached monitoredBarrier, but received errors ... from rank 0" are written by the ranks that
    waited for rank 0: a communication failure of rank 0's (restartable), not an application error of the writer.
    The host their lines name is theirs: rank 0's node stays unnamed rather than wrong."""
    result = diagnose({}, (PUBLIC / log).read_text())
    assert result.category == "nccl_network", result.summary
    assert result.restartable
    assert result.culprit is not None and result.culprit.rank == 0, result.summary
    assert result.culprit.node is None, result.summary


def test_a_rank_the_watchdog_aborted_after_its_own_timeout_report_is_not_the_culprit():
    """c10d's watchdog takes its process down (SIGABRT) after the collective timeout it reports, so torchrun's
    summary names a rank that waited. One node's log of a two-node job (ranks 8-15, all waiting): before, that
    node was blamed (and a requeue would have excluded it); the rank the collective waits for is on the other."""
    result = diagnose({}, (REAL.parent / "formats_one_node_of_two_watchdog_abort.log").read_text())
    assert result.category == "nccl_network", result.summary
    assert result.culprit is None or result.culprit.node is None, result.summary


def test_cuda_s_unknown_error_mid_run_is_the_gpu_not_the_application():
    """cudaErrorUnknown in a run that trained for hours is the driver losing the GPU (Xid 79 and the like), and
    c10's abort on it (SIGABRT, "terminate called after throwing") its consequence: the node is checked, the job
    restarted elsewhere. Before, the abort made it an application error, so the job was not recovered."""
    result = diagnose({}, (PUBLIC / "cuda_unknown_error_mid_run_sigabrt.log").read_text())
    assert result.category == "gpu_hardware", result.summary
    assert result.culprit is not None and (result.culprit.node, result.culprit.rank) == ("gpu-c14", 5)
    startup = (
        "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env "
        "variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero."
    )
    assert diagnose({}, startup).category != "gpu_hardware"


# Real multi-node logs at the moment only the failed node's agent has reported its killed worker (torchrun's restart
# under way, no summary yet): the log, the node the worker was killed on, and the healthy node that runs rank 0.
RESTARTING = [
    # copied from the file as the agent's line appeared (produce.py's `restarting`)
    ("two_nodes_elastic_sigkill_rank1_restarting.log", "trn-g02", "trn-g01"),
    # the same moment of finished runs: cut after the first agent's line (the e2e oom run on the real Slurm)
    ("two_nodes_elastic_sigkill_rank1.log", "trn-f02", "trn-f01"),
    ("slurm_oom_cgroup_kill.log", "node2", "node1"),
]


@pytest.mark.parametrize(("log", "killed_on", "healthy"), RESTARTING, ids=[log for log, *_ in RESTARTING])
def test_a_worker_killed_on_one_node_of_several_is_not_read_as_the_job_s_rank_0(log, killed_on, healthy):
    """The agent's ``failed (exitcode: -9) local_rank: 0`` names a local rank, on every node; until its summary
    names the agent's host, nothing says where the worker ran. The diagnosis names neither rank 0 nor the healthy
    node the alert came from (a peer's error); it says it does not know."""
    lines = (REAL / log).read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "failed (exitcode: -9) local_rank: 0" in line)
    assert not any("Root Cause" in line or "host      :" in line for line in lines[: first + 1])
    result = diagnose({"alertname": "TrainingJobError", "Hostname": healthy}, "".join(lines[: first + 1]))
    assert result.category == "host_oom", result.summary
    assert result.culprit is None or (result.culprit.rank is None and result.culprit.node == killed_on), (
        result.culprit
    )
    assert "rank 0" not in result.summary and f"on {healthy}" not in result.summary, result.summary
    assert "local rank 0 on a node the log does not name" in " ".join(result.evidence), result.evidence


def _world_info(value: object) -> str:
    """DeepSpeed's runner line (runner.py: base64 of the JSON host -> slots map)."""
    encoded = base64.urlsafe_b64encode(json.dumps(value).encode()).decode()
    return f"[INFO] [runner.py:555:main] cmd = python -u -m deepspeed.launcher.launch --world_info={encoded} t.py"


@pytest.mark.parametrize(
    ("world", "rank"),
    [({"localhost": [0, 1]}, 1), ({"worker-1": [0, 1], "worker-2": [0, 1]}, None), (None, None)],
    ids=["one host", "two hosts", "no world info"],
)
def test_deepspeed_s_local_rank_is_the_job_s_rank_only_when_its_world_info_names_one_host(world, rank):
    crash = (
        "[ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 't.py', '--local_rank=1'] exits with "
        "return code = -11"
    )
    result = diagnose({}, "\n".join([*([_world_info(world)] if world else []), crash]))
    assert result.category == "application_error", result.summary
    assert (result.culprit.rank if result.culprit else None) == rank, result.culprit


@pytest.mark.parametrize(
    "text",
    [b"not json", b'{"localhost": [0, 1]', b"[0, 1]", b"{}", b"[" * 1500],
    ids=["not json", "cut off", "not a map", "no host", "nested past the recursion limit"],
)
def test_deepspeed_world_info_that_is_not_a_host_map_is_ignored(text):
    reading = LauncherReading()
    info = base64.urlsafe_b64encode(text).decode()
    reading.feed(0, f"-m deepspeed.launcher.launch --world_info={info} t.py")
    assert reading.nodes is None


def shipped(text: str, form: str) -> str:
    """The log as a shipper keeps it: each line after a time (one second apart) and, for the container runtime's
    files on a Kubernetes node (/var/log/pods, CRI), the stream and a full-line tag."""
    start = datetime(2026, 6, 1, 12, 0, 0)
    stamp = {
        "cri": lambda t: f"{t.isoformat()}.123456789Z stderr F ",
        "python-logging": lambda t: f"{t.strftime('%Y-%m-%d %H:%M:%S')},123 ",
    }[form]
    return "\n".join(stamp(start + timedelta(seconds=i)) + line for i, line in enumerate(text.splitlines()))


@pytest.mark.parametrize("form", ["cri", "python-logging"])
@pytest.mark.parametrize(
    "log",
    [p for p in sorted(REAL.glob("*.log")) if "==> py-spy" not in p.read_text(errors="replace")],
    ids=lambda p: p.name,
)
def test_a_real_log_as_a_shipper_keeps_it_gets_the_same_verdict(log: Path, form: str):
    """The same job output read from a Kubernetes node's container log (CRI) or a shipper's store gets the same
    category and culprit. Before, a prefix hid the exception lines (84 of 218 corpus logs lost their culprit as CRI)
    and srun's task ends. py-spy dumps, which our own collection writes unprefixed, are left out."""
    text = log.read_text(errors="replace")
    plain, prefixed = diagnose({}, text), diagnose({}, shipped(text, form))
    assert prefixed.category == plain.category, prefixed.summary
    assert prefixed.culprit == plain.culprit or (
        prefixed.culprit is not None
        and plain.culprit is not None
        and (prefixed.culprit.node, prefixed.culprit.rank) == (plain.culprit.node, plain.culprit.rank)
    ), (prefixed.culprit, plain.culprit)


def test_mpirun_names_the_rank_and_node_that_died_of_a_signal():
    """Open MPI's own word on the first process to die (MPI rank = the job's rank, its node, the signal): a SIGKILL
    is a worker killed from outside (restartable, the node named), not the gloo error a surviving rank logged."""
    result = diagnose({}, (PUBLIC / "mpirun_rank_killed_signal9.log").read_text())
    assert (result.category, result.restartable) == ("host_oom", True), result.summary
    assert result.culprit is not None and (result.culprit.rank, result.culprit.node) == (3, "gpu-a02")


def test_nccl_s_older_ib_completion_error_is_a_network_fault_not_the_abort_it_causes():
    """NCCL before 2.12 wrote "NET/IB : Got completion with error 12" (no peer): the retry counter ran out on the
    link. The rank's abort that follows (terminate, SIGABRT under mpirun) is its consequence, not a program bug."""
    result = diagnose({}, (PUBLIC / "ib_completion_error12_old_format.log").read_text())
    assert (result.category, result.restartable) == ("nccl_network", True), result.summary
    assert result.culprit is not None and result.culprit.node == "gpu-node-2"


def test_nccl_invalid_usage_is_the_program_s_not_the_network_s():
    """ncclInvalidUsage (two ranks on one GPU): a configuration or code bug that a restart repeats, though c10d
    reports it as a DistBackendError like a network failure."""
    result = diagnose({}, (PUBLIC / "nccl_invalid_usage_duplicate_gpu.log").read_text())
    assert (result.category, result.restartable) == ("application_error", False), result.summary


def test_a_kernel_line_names_the_node_and_the_rank_that_reported_the_fault_there_names_the_rank():
    """An application-class Xid names a node and a PCI address, not a process; the worker torchrun saw fail first on
    that node is the culprit rank (its "unspecified launch failure" names no category on its own: it follows
    application faults and hardware Xids alike)."""
    result = diagnose({}, (PUBLIC / "unspecified_launch_failure_xid13_dmesg.log").read_text())
    assert (result.category, result.restartable) == ("application_error", False), result.summary
    assert result.culprit is not None and (result.culprit.node, result.culprit.rank) == ("gpu-b05", 9)


def test_talosctl_dmesg_names_the_node_of_an_xid():
    result = diagnose({}, (PUBLIC / "xid119_gsp_timeout_talos_kmsg.log").read_text())
    assert (result.category, result.xid) == ("gpu_hardware", 119), result.summary
    assert result.culprit is not None and result.culprit.node == "192.168.11.119"


def test_kubectl_describe_s_exit_code_137_is_a_killed_worker_that_explains_the_peers_timeout():
    """kubectl describe pads "Exit Code:    137" (Reason: Error, not OOMKilled): the container got SIGKILL; the
    master's collective timeout 30 minutes later is its consequence. Restartable: the log does not say who sent
    it."""
    result = diagnose({}, (PUBLIC / "k8s_describe_exit137_reason_error.log").read_text())
    assert (result.category, result.restartable) == ("host_oom", True), result.summary
    assert result.culprit is not None and result.culprit.node == "gke-a3-pool-3c1e"


def test_a_loss_still_nan_when_the_run_finishes_was_not_survived():
    """A run whose loss and gradient norm stayed non-finite to its last step and then finished ran on diverged:
    finishing explains away other errors, not a model that is NaN at the end."""
    nan = "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1.2e-05, 'epoch': 0.8}"
    done = "{'train_runtime': 10303.79, 'train_samples_per_second': 0.623, 'train_loss': 0.38, 'epoch': 2.0}"
    diverged = diagnose({}, "\n".join(["{'loss': 1.8998, 'grad_norm': 21.9, 'epoch': 0.4}", nan, nan, done]))
    assert (diverged.category, diverged.restartable) == ("numerical_divergence", False), diverged.summary
    recovered = "{'loss': 1.7712, 'grad_norm': 3.1, 'learning_rate': 1e-05, 'epoch': 1.2}"
    survived = diagnose({}, "\n".join([nan, recovered, recovered.replace("1.7712", "1.7650"), done]))
    assert survived.category == BENIGN, survived.summary


@pytest.mark.parametrize(
    ("log", "category", "restartable"),
    [
        ("ray_oom_killer_rollout_worker.log", "host_oom", False),  # Ray's memory monitor, not a Python bug
        ("hf_hub_504_at_startup.log", "object_store_timeout", True),  # the Hub's 504: a retry works
        ("hub_upload_s3_500_during_training.log", "object_store_timeout", True),  # S3's 500 under the Hub
        (
            "nccl_error2_all_to_all_torch24.log",
            "nccl_network",
            True,
        ),  # "NCCL Error 2: unhandled system error"
        ("nccl_error2_dataparallel_old.log", "nccl_network", True),
        ("k8s_node_shutdown_spot_exit137.log", BENIGN, False),  # the SIGKILL ending a shutdown's grace
        ("cuda_error_802_fabric_manager.log", "gpu_hardware", True),  # CUDA cannot start on the node
        ("ibv_reg_mr_memlock_nccl.log", "nccl_network", True),  # ibv_reg_mr's ENOMEM: the memlock limit
        ("torch_shm_unable_to_write_enospc.log", "host_oom", False),  # </torch_N_M>: /dev/shm, not a disk
    ],
)
def test_service_and_shutdown_texts_are_not_read_as_program_bugs_or_kills(log, category, restartable):
    """Exceptions that a service or the platform raised in the program (Ray's OOM killer, the model hub's 5xx, an
    NCCL error code) name that service's failure, not the program's; a container killed at the end of its node's
    graceful shutdown was stopped, not killed by the OOM killer."""
    result = diagnose({}, (PUBLIC / log).read_text())
    assert (result.category, result.restartable) == (category, restartable), result.summary


def test_ray_names_the_node_its_memory_monitor_killed_a_worker_on():
    result = diagnose({}, (PUBLIC / "ray_oom_killer_rollout_worker.log").read_text())
    assert result.culprit is not None and result.culprit.node == "172.24.0.226"


def test_an_nvswitch_driver_name_is_not_a_host():
    """dmesg's "nvidia-nvswitch1: SXid (...)" is the driver's name: the culprit is the node whose dmesg it is."""
    result = diagnose({}, (PUBLIC / "nvswitch_sxid_fatal_dmesg_section.log").read_text())
    assert result.category == "nvlink", result.summary
    assert result.culprit is not None and result.culprit.node == "gpu-d11"


def test_cuda_s_own_wording_of_a_busy_or_unavailable_gpu_is_a_gpu_fault():
    """cudaErrorDevicesUnavailable as torch prints it (karpathy/neuraltalk2#127: after an unspecified launch
    failure, "all CUDA-capable devices are busy or unavailable" until the machine was restarted)."""
    result = diagnose({}, "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable")
    assert (result.category, result.restartable) == ("gpu_hardware", True), result.summary


def test_a_journal_json_record_names_its_host_and_nccl_s_rank_table_the_rank_on_the_failed_gpu():
    result = diagnose({}, (PUBLIC / "xid79_journalctl_json.log").read_text())
    assert (result.category, result.xid) == ("gpu_hardware", 79), result.summary
    assert result.culprit is not None
    assert (result.culprit.node, result.culprit.rank, result.culprit.gpu) == ("gpu-n07", 11, "3")


def test_a_sub_communicator_s_rank_is_not_read_as_the_job_s_rank_of_a_failed_gpu():
    """A tensor-parallel group's NCCL table says "rank 1 nranks 2": with communicators of two sizes in the log, the
    GPU's rank in the job is not known."""
    xid = "Jun  2 03:11:09 gpu-n07 kernel: NVRM: Xid (PCI:0000:91:00): 79, pid=1, GPU has fallen off the bus."
    table = "gpu-n07:20411:20411 [3] NCCL INFO comm 0x55 rank {rank} nranks {n} cudaDev 3 nvmlDev 3 busId 91000 - Init"
    one = diagnose({}, "\n".join([table.format(rank=11, n=16), xid]))
    assert one.culprit is not None and (one.culprit.node, one.culprit.rank) == ("gpu-n07", 11)
    mixed = diagnose({}, "\n".join([table.format(rank=1, n=2), table.format(rank=11, n=16), xid]))
    assert mixed.culprit is not None and (mixed.culprit.node, mixed.culprit.rank) == ("gpu-n07", None)


@pytest.mark.parametrize(
    "line",
    [
        # torchtitan: f"loss: {global_avg_loss:7.4f}  grad_norm: {grad_norm:7.4f}" pads NaN to the field's width
        "[rank0]:[titan] 2026-05-18 16:04:54,191 - root - INFO - step: 21  loss:      nan  grad_norm:     nan",
        # a tensor printed as it is: print("loss:", loss)
        "step 21 loss: tensor(nan, device='cuda:0', grad_fn=<NllLossBackward0>)",
    ],
)
def test_a_padded_or_printed_nan_loss_is_divergence_not_progress(line):
    result = diagnose({}, "\n".join([line, line.replace(" 21 ", " 22 "), line.replace(" 21 ", " 23 ")]))
    assert (result.category, result.restartable) == ("numerical_divergence", False), result.summary


def test_weights_and_biases_own_upload_errors_are_not_the_job_s_object_store():
    """wandb uploads its files to GCS in the background and retries ("wandb: ERROR Error uploading", a common
    report): its 503 from storage.googleapis.com is not the job's object store failing."""
    text = "\n".join(
        [
            "{'loss': 1.21, 'learning_rate': 1e-05, 'epoch': 0.5}",
            'wandb: ERROR Error uploading "output.log": CommError, 503 Server Error: Service Unavailable for url: '
            "https://storage.googleapis.com/wandb-production.appspot.com/u/p/r/output.log",
        ]
    )
    assert not diagnose({}, text).actionable


def test_deepspeed_s_world_info_numbers_a_local_rank_on_one_of_several_hosts():
    """DeepSpeed's launch.py numbers each host's slots in the world info's order: local rank 3 on the second of
    three 8-slot hosts is rank 11; pdsh names the host (an address when the hostfile lists addresses)."""
    result = diagnose({}, (PUBLIC / "deepspeed_pdsh_ip_hosts_sigkill.log").read_text())
    assert (result.category, result.restartable) == ("host_oom", True), result.summary
    assert result.culprit is not None and (result.culprit.node, result.culprit.rank) == ("192.168.0.32", 11)
