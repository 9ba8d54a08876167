"""The parts of app.domain.diagnosis: who wrote a line, required literals, py-spy dumps, and the rules that keep healthy
runs quiet and name the culprit (each shown on the smallest log that exercises it)."""

from __future__ import annotations

import pytest

from app.domain.diagnosis import BENIGN, Culprit, Diagnosis, diagnose
from app.domain.diagnosis.lines import normalise_pci, parse_line, read_layout
from app.domain.diagnosis.signatures import required_literals
from app.domain.diagnosis.stacks import judge, parse_dumps

# --- who wrote a line -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "rank", "host", "gpu"),
    [
        ("[rank3]:[E321 02:07:08.408 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught", 3, None, None),
        ("[default5]:RuntimeError: boom", 5, None, None),
        ("12: KeyError: 'x'", 12, None, None),
        ("2026-06-01T12:00:00.123456789Z stderr F [rank3]: RuntimeError: x", 3, None, None),  # CRI log file
        # srun -l over one torchrun per node: the label is the task (node), the worker's own tag the rank
        ("1: [rank9]: torch.OutOfMemoryError: CUDA out of memory.", 9, None, None),
        (
            "0: [Rank 4] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE",
            4,
            None,
            None,
        ),
        ("node-17: [rank9]: OSError: [Errno 116] Stale file handle", 9, "node-17", None),
        ("[pod/llama-worker-3/pytorch] [rank3]: RuntimeError: x", 3, "llama-worker-3", None),
        (
            "gpu-h3:55120:55120 [6] include/alloc.h:103 NCCL WARN Cuda failure 2 'out of memory'",
            None,
            "gpu-h3",
            "6",
        ),
        ("Mar  3 04:12:55 gpu-a07 kernel: NVRM: Xid (PCI:0000:c1:00): 79, pid=1", None, "gpu-a07", None),
        # journalctl -o short-precise; RFC 3164 and RFC 5424 syslog with their <PRI> as shippers forward them
        (
            "Nov 04 22:37:29.880214 gpu-e03 kernel: NVRM: Xid (PCI:0000:07:00): 48, pid=1",
            None,
            "gpu-e03",
            None,
        ),
        ("<4>Jun  2 03:11:09 gpu-n07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1", None, "gpu-n07", None),
        (
            "<4>1 2024-06-02T03:11:09.123456+00:00 gpu-n07 kernel - - - NVRM: Xid (PCI:0000:3b:00): 79",
            None,
            "gpu-n07",
            None,
        ),
        (
            "2025-02-11T13:01:44+00:00 hgx-07 kernel: NVRM: Xid (PCI:0000:b3:00): 74, pid=9",
            None,
            "hgx-07",
            None,
        ),
        ("2025-03-02T04:12:07.331Z gpu-c12 [stderr] [rank27]: x", 27, "gpu-c12", None),
        ("srun: error: gpu-e09: task 12: Out Of Memory", 12, "gpu-e09", None),
        (
            "AssertionError: Rank 13: found NaN in local forward loss calculation. Device: 5, node: gpu-d04",
            13,
            "gpu-d04",
            "5",
        ),
        ("/job:jax_worker/replica:0/task:3", 3, None, None),
        ("[rank: 2] Received SIGTERM: 15", 2, None, None),
        ("[1,7]<stderr>:Traceback (most recent call last):", 7, None, None),
        (
            "[1,3]<stderr>:[gpu-a02:12345] Signal: Segmentation fault (11)",
            3,
            "gpu-a02",
            None,
        ),  # Open MPI's handler
        ("[4]<stderr>:RuntimeError: x", 4, None, None),
        ("[2] jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED", 2, None, None),
        ("[    2.123] NVRM: x", None, None, None),
        (  # talosctl dmesg: the node as talosctl was given it, facility, right-aligned level, time
            "192.168.11.119: kern: warning: [2026-04-22T21:27:45.100431901Z]: NVRM: Xid (PCI:0000:01:00): 119, pid=9",
            None,
            "192.168.11.119",
            None,
        ),
        ("(RayTrainWorker pid=2211, ip=10.0.3.7) RuntimeError: x", None, "10.0.3.7", None),
        # SkyPilot: the rank in its prefix is the node's, not a process's; the worker's address names the node
        ("(worker1, rank=1, pid=15406, ip=10.164.0.57) [rank9]: RuntimeError: x", 9, "10.164.0.57", None),
        ("(head, rank=0, pid=17894) RuntimeError: x", None, None, None),
        ("(node-1 pid=23066, ip=172.31.23.131) RuntimeError: x", None, "172.31.23.131", None),
        (
            '{"time": "2025-01-01T00:00:00Z", "rank": 6, "host": "gpu-9", "msg": "OSError: x"}',
            6,
            "gpu-9",
            None,
        ),
        ("fp16: True", None, None, None),  # a config key is not a host
        (
            "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal",
            None,
            None,
            None,
        ),  # a driver
        ("RuntimeError: CUDA error", None, None, None),
    ],
)
def test_parse_line_reads_rank_host_and_gpu(raw, rank, host, gpu):
    line = read_layout([raw]).resolve(parse_line(0, raw))  # the line is the whole log
    assert (line.rank, line.host, line.gpu) == (rank, host, gpu)


TORCHRUN_PER_NODE = [  # srun -l over one torchrun --tee 3 a node, two nodes of two workers
    "0: [default0]:step 10 loss 2.1",
    "1: [default1]:RuntimeError: boom",
    "srun: error: gpu-b: task 1: Exited with exit code 1",
    "srun: error: gpu-a: task 0: Exited with exit code 1",
]


def test_under_one_torchrun_a_node_srun_s_task_names_the_node_and_the_worker_s_tag_no_job_rank():
    layout = read_layout(TORCHRUN_PER_NODE)
    assert (layout.tasks_are_ranks, layout.one_node, dict(layout.task_hosts)) == (
        False,
        False,
        {0: "gpu-a", 1: "gpu-b"},
    )
    line = layout.resolve(parse_line(1, TORCHRUN_PER_NODE[1]))
    assert (line.rank, line.local_rank, line.task, line.host) == (None, 1, 1, "gpu-b")


@pytest.mark.parametrize(
    ("log", "rank"),
    [
        (["12: KeyError: 'x'", "3: step 1"], 12),  # srun, a task a rank
        (["[default5]:KeyError: 'x'", "torchrun --nnodes=1 --nproc-per-node=8 train.py"], 5),  # one node
        (["[default5]:KeyError: 'x'", "host-a:1:1 [0] NCCL INFO x", "host-b:1:1 [0] NCCL INFO x"], None),
        # the label is not the rank: a launcher a node
        (["1: [rank9]: KeyError: 'x'", "12: KeyError: 'x'"], 9),
        (["12: KeyError: 'x'", "1: [rank9]: step 1"], None),
        (["12: KeyError: 'x'", "LocalElasticAgent: starting workers"], None),
    ],
)
def test_what_a_task_and_a_local_rank_mean_is_read_from_the_whole_log(log, rank):
    assert read_layout(log).resolve(parse_line(0, log[0])).rank == rank


def test_terminal_colours_do_not_hide_an_error():
    coloured = (
        "\x1b[31m[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\x1b[0m"
    )
    result = diagnose({}, coloured)
    assert result.category == "cuda_oom"
    assert result.culprit is not None and result.culprit.rank == 2
    assert "\x1b" not in "".join(result.evidence)


def test_parse_line_reads_timestamps_with_and_without_a_year():
    iso = parse_line(0, "2025-02-01T12:00:02Z step 1 loss 2.0").time
    glog = parse_line(0, "I0201 12:00:02.118 1 train.py:3] step 1 loss 2.0").time
    assert iso is not None and glog is not None
    assert iso - glog == pytest.approx((2025 - 2000) * 365.25 * 86400, rel=0.001)  # glog has no year: 2000


@pytest.mark.parametrize("text", ["0000:3b:00", "00000000:3B:00.0", "3b000", "3B:00.0"])
def test_normalise_pci_agrees_across_nvrm_dcgm_and_nccl(text):
    assert normalise_pci(text) == "0000:3b:00"


def test_required_literals():
    assert required_literals("Stale file handle") == ("stale file handle",)
    assert required_literals(r"(?i)\bnfs: server \S+ not responding|LustreError: ") == (
        " not responding",  # the longest certain run of each branch
        "lustreerror: ",
    )
    assert required_literals(r"\d+/\d+ \[") is None  # nothing of three characters is certain


# --- py-spy dumps -----------------------------------------------------------------------------------------


def _dump(node: str, rank: int, frames: list[str]) -> str:
    pid = 100 + rank
    body = "".join(f"    {frame}\n" for frame in frames)
    header = f"==> py-spy node={node} rank={rank} pid={pid} <==\nProcess {pid}: python t.py\n\n"
    return header + f'Thread {pid} (idle): "MainThread"\n{body}'


COLLECTIVE = ["all_reduce (torch/distributed/distributed_c10d.py:2288)", "step (t.py:10)"]


def test_stacks_one_rank_elsewhere_is_the_culprit():
    text = "".join(_dump("n1" if r < 2 else "n2", r, COLLECTIVE) for r in range(3))
    text += _dump("n2", 3, ["compute (t.py:40)", "step (t.py:11)"])
    verdict = judge(parse_dumps(text.splitlines()))
    assert verdict is not None and verdict.category == "hang"
    assert verdict.culprit is not None and (verdict.culprit.node, verdict.culprit.rank) == ("n2", 3)


def test_stacks_all_in_one_collective_point_at_the_network():
    verdict = judge(parse_dumps("".join(_dump("n1", r, COLLECTIVE) for r in range(4)).splitlines()))
    assert verdict is not None and (verdict.category, verdict.culprit) == ("nccl_network", None)


def test_stacks_in_io_are_storage_and_agents_are_left_out():
    io = ["read (data.py:5)", "load (data.py:9)"]
    agent = ["_monitor_workers (torch/distributed/elastic/agent/server/local_elastic_agent.py:300)"]
    text = "".join(_dump("n1", r, io) for r in range(2)) + _dump("n1", 9, agent)
    stacks = parse_dumps(text.splitlines())
    assert [s.rank for s in stacks] == [0, 1]
    verdict = judge(stacks)
    assert verdict is not None and verdict.category == "storage_io"


def test_plain_py_spy_output_without_headers_is_read():
    text = (
        'Process 42: python t.py\nPython v3.11.7\n\nThread 42 (active): "MainThread"\n    read (data.py:5)\n'
    )
    (stack,) = parse_dumps(text.splitlines())
    assert (stack.pid, stack.rank, stack.frames) == (42, None, ("read (data.py:5)",))


def test_a_command_line_s_rank_is_the_job_s_rank_and_its_local_rank_only_a_local_rank():
    def plain(pid: int, args: str) -> str:
        return f'Process {pid}: python -u train.py {args}\nThread {pid} (idle): "MainThread"\n    read (d.py:5)\n'

    text = plain(7, "--rank=5 --local_rank=1") + plain(8, "--local_rank=1") + plain(9, "--node_rank=1")
    assert [(s.rank, s.local_rank) for s in parse_dumps(text.splitlines())] == [
        (5, None),
        (None, 1),
        (None, None),
    ]


def test_a_local_rank_from_a_command_line_names_no_host_in_a_multi_node_job():
    """DeepSpeed passes ``--local_rank=N`` to every worker: on a two-node job it is not rank N, whose host the
    log names; the culprit's node stays unknown rather than wrong."""
    table = "gpu-{h}:1:1 [{d}] NCCL INFO comm 0x1 rank {r} nranks 4 cudaDev {d} busId 1b000 - Init COMPLETE"
    hosts = "\n".join(table.format(h="ab"[r // 2], d=r % 2, r=r) for r in range(4))
    dumps = [
        f"Process {100 + r}: python -u train.py --local_rank={r % 2}\n"
        f'Thread {100 + r} (idle): "MainThread"\n    {COLLECTIVE[0]}\n    {COLLECTIVE[1]}\n'
        for r in range(3)
    ]
    dumps.append(
        'Process 103: python -u train.py --local_rank=1\nThread 103 (idle): "MainThread"\n'
        "    compute (t.py:40)\n    step (t.py:11)\n"
    )
    stacks = parse_dumps("".join(dumps).splitlines())
    verdict = judge(stacks)
    assert verdict is not None and verdict.culprit is not None
    assert (verdict.culprit.rank, verdict.culprit.local_rank) == (None, 1)
    assert "local rank 1" in verdict.description
    result = diagnose({"job_id": "7"}, hosts + "\n" + "".join(dumps))
    assert result.category == "hang"
    # not rank 1's host gpu-a: a local rank 1 runs on both nodes
    assert result.culprit is None or result.culprit.node is None


# --- quiet on healthy runs ----------------------------------------------------------------------------------


PROGRESS = "\n".join(f"step {n} loss {2 - n / 1000:.3f}" for n in range(100, 104))


def test_errors_followed_by_sustained_progress_are_survived():
    result = diagnose(
        {}, 'botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: "https://s3/x"\n' + PROGRESS
    )
    assert result.category == BENIGN and not result.actionable
    assert "object store timeouts followed by 4 progress lines" in result.summary


def test_the_label_of_a_survived_error_does_not_flag_the_run():
    labels = {"alertname": "TrainingJobError", "error_class": "object_store_timeout"}
    text = "An error occurred (SlowDown) when calling the GetObject operation: reduce your rate\n" + PROGRESS
    assert diagnose(labels, text).category == BENIGN
    assert diagnose(labels, text.splitlines()[0]).category == "object_store_timeout"


def test_a_recovery_marker_cancels_its_category():
    down = "nfs: server fs1 not responding, still trying"
    assert diagnose({}, down).category == "storage_io"
    assert diagnose({}, f"{down}\nnfs: server fs1 OK").category == BENIGN


def test_errors_after_a_cancel_are_shutdown_noise_but_errors_before_it_are_not():
    cancel = "slurmstepd: error: *** JOB 5 ON n1 CANCELLED AT 2025-01-01T00:00:00 ***"
    noise = "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15"
    assert diagnose({}, f"{cancel}\n{noise}").category == BENIGN
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert diagnose({}, f"{oom}\n{cancel}\n{noise}").category == "cuda_oom"


def test_a_long_gap_before_the_time_limit_is_a_hang():
    progress = "\n".join(f"[2025-02-01 06:{m:02d}:00] step {m} loss 1.9" for m in range(50, 59))
    limit = "slurmstepd: error: *** JOB 9 ON n4 CANCELLED AT {} DUE TO TIME LIMIT ***"
    hang = diagnose({}, progress + "\n" + limit.format("2025-02-01T12:00:00"))
    assert hang.category == "hang" and "5h 02m" in hang.summary
    assert diagnose({}, progress + "\n" + limit.format("2025-02-01T06:59:30")).category == BENIGN


def test_actionable_and_the_culprit_in_the_stored_dict():
    fault = Diagnosis("gpu_hardware", 0.9, "s", culprit=Culprit("n7", 3, "5", ("line",)))
    assert fault.actionable and fault.as_dict()["culprit"] == {
        "node": "n7",
        "rank": 3,
        "gpu": "5",
        "evidence": ["line"],
    }
    for category in ("benign", "unknown"):
        assert not Diagnosis(category, 0.5, "s").actionable
        assert Diagnosis(category, 0.5, "s").as_dict()["actionable"] is False


# --- the culprit ------------------------------------------------------------------------------------------


def test_the_rank_that_does_not_report_the_timeout_is_the_culprit():
    timeout = (
        "[rank{0}]:[E1 00:00:00.0 ProcessGroupNCCL.cpp:607] [Rank {0}] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 ms"
    )
    table = "n{1}:1:1 [{2}] NCCL INFO comm 0x1 rank {0} nranks 4 cudaDev {2} busId 1b000 - Init COMPLETE"
    text = "\n".join(
        [table.format(r, r // 2, r % 2) for r in range(4)] + [timeout.format(r) for r in (0, 1, 3)]
    )
    result = diagnose({"Hostname": "n0"}, text)
    assert result.category == "nccl_network"
    assert result.culprit is not None and (result.culprit.rank, result.culprit.node, result.culprit.gpu) == (
        2,
        "n1",
        "0",
    )
    assert "culprit rank 2 on n1 GPU 0" in result.summary
    assert "The alert came from n0; the log points at n1." in result.summary


def test_an_xid_pci_address_maps_to_the_gpu_of_the_alert_labels():
    labels = {"Hostname": "n3", "gpu": "5", "pci_bus_id": "00000000:87:00.0"}
    result = diagnose(
        labels, "[ 1.0] NVRM: Xid (PCI:0000:87:00): 79, pid=1, name=python, GPU has fallen off the bus."
    )
    assert result.culprit is not None and (result.culprit.node, result.culprit.gpu) == (None, "5")
    assert result.summary.startswith(
        "Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) on n3 GPU 5 (PCI 0000:87:00)"
    )


def test_shutdown_noise_ends_where_the_job_runs_again():
    stop = "[rank0]: received signal 15, exiting"
    rerun = "[rank0]: resuming from step 50 (/ckpt/step_000050)"
    crash = "[rank0]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, remote process exited"
    assert diagnose({}, f"{stop}\n{crash}").category == BENIGN
    assert diagnose({}, f"{stop}\n{rerun}\n{crash}").category == "nccl_network"
    assert diagnose({}, f"{stop}\nstep 60 loss 2.0\n{crash}").category == "nccl_network"


def test_the_rank_that_enqueued_least_is_the_culprit():
    line = (
        "[rank{0}]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:1664] [PG 1 Rank {0}] Exception (either an error or "
        "timeout) detected by watchdog at work: 1580, last enqueued NCCL work: {1}, last completed NCCL work: 1579."
    )
    text = "\n".join(line.format(rank, 1579 if rank == 5 else 1582) for rank in range(8))
    result = diagnose({}, text)
    assert result.culprit is not None and result.culprit.rank == 5


PEER_GONE = "\n".join(
    f"[rank{r}]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1970, remote process exited or there "
    "was a network error, NCCL version 2.21.5"
    for r in (1, 2)
)


def test_peers_reporting_a_dead_rank_are_the_consequence_of_its_crash():
    summary = (
        "Root Cause (first observed failure):\n[0]:\n  host      : gpu-n2\n  rank      : 4 (local_rank: 0)\n"
    )
    signal = "  exitcode  : -11 (pid: 55121)\n  traceback : Signal 11 (SIGSEGV) received by PID 55121"
    crash = f"{PEER_GONE}\n{summary}{signal}"
    result = diagnose({}, crash)
    assert result.category == "application_error"
    assert result.culprit is not None and (result.culprit.rank, result.culprit.node) == (4, "gpu-n2")
    # Without a named crash, a peer gone is all there is: the NCCL failure stands.
    launcher_only = (
        f"{PEER_GONE}\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n  exitcode  : 1"
    )
    assert diagnose({}, launcher_only).category == "nccl_network"


def test_slurm_accounting_out_of_memory_is_host_oom():
    sacct = "4412.0       python     gpu        acct          8 OUT_OF_ME+    0:125"
    assert diagnose({}, sacct).category == "host_oom"
    assert diagnose({}, "State: OUT_OF_MEMORY (exit code 0)").category == "host_oom"


def test_a_log_that_names_one_host_names_it_as_the_culprit_node():
    table = "dgx-7:1201:1201 [0] NCCL INFO comm 0x1 rank 0 nranks 8 cudaDev 0 busId 1b000 - Init COMPLETE"
    text = f"{table}\nOSError: [Errno 28] No space left on device: '/scratch/ckpt/model.pt'"
    result = diagnose({}, text)
    assert result.category == "storage_io"
    assert result.culprit is not None and result.culprit.node == "dgx-7"
