"""Pure parts of the Slurm client and actions, on output captured from a live Slurm 22.05.8."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from app.actions.checkpoint import QuarantineLatest, below, by_age, parse_listing
from app.actions.slurm import DrainNode, JobLog, RequeueJob, ResumeNode, exclusion, ours, prefixed_reason
from app.clients.slurm import (
    JOB_KEYS,
    JobInfo,
    SlurmClient,
    drain_command,
    exclude_command,
    parse_job,
    parse_node,
    parse_record,
    tail_command,
)
from app.clients.ssh import CommandResult
from app.domain.errors import CommandFailed, NotFound, ParamError
from app.domain.hostlist import compress_hostlist, expand_hostlist
from app.domain.params import MAX_NODE_LIST

NODE_IDLE = (
    "NodeName=node2 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.62 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=37209 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC "
    "@0  RealMemory=1000 AllocMem=0 FreeMem=23210 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-12-02T14:55:52 "
    "SlurmdStartTime=2026-12-02T15:04:19 LastBusyTime=2026-12-02T15:09:18 "
    "CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n"
)
NODE_DRAINING = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=0.62 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=47375 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC "
    "@0  RealMemory=1000 AllocMem=0 FreeMem=23210 Sockets=1 Boards=1 State=MIXED+DRAIN ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-12-02T14:55:51 "
    "SlurmdStartTime=2026-12-02T15:04:19 LastBusyTime=2026-12-02T15:10:06 "
    "CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES=cpu=1 CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=nightshift: Xid 79 [gpu 3] code=79 "
    "[root@2026-12-02T15:10:09]\n"
)
NODE_FOREIGN_DRAIN_WITH_COMMENT = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.25 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=47375 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC "
    "@0  RealMemory=1000 AllocMem=0 FreeMem=23360 Sockets=1 Boards=1 State=IDLE+DRAIN+NOT_RESPONDING "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  "
    "BootTime=2026-12-02T14:55:51 SlurmdStartTime=2026-12-02T15:04:19 LastBusyTime=2026-12-02T15:04:57 "
    "CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES=cpu=1 CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=admin: State=IDLE x=y "
    "[root@2026-12-02T15:06:10] Comment=node comment State=X\n"
)
JOB_RUNNING = (
    "JobId=5 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901754 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-12-02T15:10:07 EligibleTime=2026-12-02T15:10:07 AccrueTime=2026-12-02T15:10:07 "
    "StartTime=2026-12-02T15:10:08 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-12-02T15:10:08 Scheduler=Main Partition=debug AllocNode:Sid=localhost:15656 "
    "ReqNodeList=node1 ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/proto "
    "StdErr=/tmp/proto/jobs/5.out StdIn=/dev/null StdOut=/tmp/proto/jobs/5.out Power= \n"
)
JOB_PENDING_AFTER_REQUEUE = (
    "JobId=5 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901754 Nice=0 "
    "Account=(null) QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-12-02T15:10:09 EligibleTime=2026-12-02T15:10:15 AccrueTime=2026-12-02T15:10:15 "
    "StartTime=2026-12-02T15:10:15 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-12-02T15:10:08 Scheduler=Main Partition=debug AllocNode:Sid=localhost:15656 "
    "ReqNodeList=(null) ExcNodeList=node1 NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1000M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/proto "
    "StdErr=/tmp/proto/jobs/5.out StdIn=/dev/null StdOut=/tmp/proto/jobs/5.out Power= \n"
)
JOB_WITH_SPACES = (
    "JobId=3 JobName=my job UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-12-02T15:06:09 EligibleTime=2026-12-02T15:06:09 AccrueTime=2026-12-02T15:06:09 "
    "StartTime=2026-12-02T15:06:09 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-12-02T15:06:09 Scheduler=Main Partition=debug AllocNode:Sid=localhost:15656 "
    "ReqNodeList=node1 ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/proto "
    "Comment=hi StdOut=/etc/shadow Reason=x  StdErr=/tmp/proto/jobs/a b 3.out StdIn=/dev/null "
    "StdOut=/tmp/proto/jobs/a b 3.out Power= \n"
)


class RecordingRunner:
    """A runner of our own interface: answers from a script and records every argv it was given."""

    def __init__(self, *answers: tuple[int, str, str]):
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        self.calls.append(list(argv))
        code, out, err = self.answers.pop(0)
        return CommandResult(tuple(argv), " ".join(argv), code, out, err, 0.01)

    def close(self) -> None:
        pass


def test_idle_node() -> None:
    node = parse_node(NODE_IDLE)

    assert (node.name, node.state, node.flags, node.reason) == ("node2", "idle", (), "")
    assert not node.drained
    assert node.state_text == "idle"


def test_draining_node_keeps_the_whole_reason() -> None:
    node = parse_node(NODE_DRAINING)

    assert (node.state, node.flags) == ("mixed", ("drain",))
    assert node.drained
    assert node.reason == "nightshift: Xid 79 [gpu 3] code=79 [root@2026-12-02T15:10:09]"
    assert ours(node)


def test_key_like_text_in_a_reason_cannot_change_the_state() -> None:
    node = parse_node(NODE_FOREIGN_DRAIN_WITH_COMMENT)

    assert (node.state, node.flags) == ("idle", ("drain", "not_responding"))
    assert node.reason == "admin:"  # cut at the known key; enough to tell it is not ours
    assert not ours(node)


def test_record_values_with_spaces_and_empty_values() -> None:
    record = parse_record(NODE_IDLE, ["NodeName", "OS", "RealMemory", "AllocTRES", "CapWatts"])

    assert record["OS"] == "Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0"
    assert record["AllocTRES"] == ""
    assert record["CapWatts"].startswith("n/a")  # unknown keys stay inside the previous value


def test_running_job() -> None:
    job = parse_job(JOB_RUNNING)

    assert job == JobInfo(
        job_id="5",
        state="RUNNING",
        nodes="node1",
        reason="",
        restarts=0,
        stdout_path="/tmp/proto/jobs/5.out",
        stderr_path="/tmp/proto/jobs/5.out",
        requeue=True,
        exc_nodes="",
        req_nodes="node1",
        user="root(0)",
    )


def test_pending_job_after_requeue() -> None:
    job = parse_job(JOB_PENDING_AFTER_REQUEUE)

    assert (job.state, job.reason, job.restarts, job.nodes) == ("PENDING", "BeginTime", 1, "")
    assert (job.exc_nodes, job.req_nodes) == ("node1", "")


def test_job_name_and_paths_with_spaces() -> None:
    job = parse_job(JOB_WITH_SPACES)

    assert job.stderr_path == "/tmp/proto/jobs/a b 3.out"
    assert parse_record(JOB_WITH_SPACES, JOB_KEYS)["JobName"] == "my job"
    # A Comment is the job owner's text: the shadowed StdOut shows why log reads run as the owner.
    assert job.stdout_path == "/etc/shadow"


@pytest.mark.parametrize("text", ["", "Node nodeX not found\n", "garbage without keys"])
def test_non_records_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_node(text)
    with pytest.raises(ValueError):
        parse_job(text)


@pytest.mark.parametrize(
    ("build", "args"),
    [
        (drain_command, ("node1; rm -rf /", "reason")),
        (drain_command, ("node1", "x\ny")),
        (drain_command, ("node1", "$(id)")),
        (drain_command, ("node1", "")),
        (exclude_command, ("$(id)", "node1")),
        (exclude_command, ("12", "node1 node2")),
        (tail_command, ("relative/path", 10)),
        (tail_command, ("/var/../etc/shadow", 10)),
        (tail_command, ("/tmp/x\n", 10)),
        (tail_command, ("/tmp/x", 0)),
    ],
)
def test_hostile_values_never_become_argv(build: object, args: tuple[object, ...]) -> None:
    with pytest.raises(ParamError):
        build(*args)  # type: ignore[operator]


def test_client_validates_before_running_anything() -> None:
    runner = RecordingRunner()
    slurm = SlurmClient(runner)

    for call in (
        lambda: slurm.node_info("node1; rm -rf /"),
        lambda: slurm.drain("node1", "reason `id`"),
        lambda: slurm.job_info("$(id)"),
        lambda: slurm.cancel("1\n2"),
        lambda: slurm.run(tail_command("/tmp/../etc/shadow", 5)),
    ):
        with pytest.raises(ParamError):
            call()
    assert runner.calls == []


def test_tail_runs_as_the_given_owner() -> None:
    assert tail_command("/data/a b.out", 5, (1000, 100)) == [
        "setpriv", "--reuid=1000", "--regid=100", "--clear-groups", "--",
        "tail", "-n", "5", "--", "/data/a b.out",
    ]  # fmt: skip


def test_errors_are_translated() -> None:
    slurm = SlurmClient(
        RecordingRunner(
            (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
            (1, "Node nodeX not found\n", ""),
            (1, "", "slurm_update error: Invalid node name specified\n"),
            (1, "", "Job is pending execution for job 2\n"),
            (0, "", "scancel: error: Kill job error on job id 9: Invalid job id specified\n"),
        )
    )

    with pytest.raises(NotFound):
        slurm.job_info("424242")
    with pytest.raises(NotFound):
        slurm.node_info("nodeX")
    with pytest.raises(NotFound):
        slurm.drain("nodeX", "nightshift: test")
    with pytest.raises(CommandFailed) as failed:
        slurm.requeue("2")
    assert failed.value.exit_code == 1
    assert "pending execution" in str(failed.value)
    with pytest.raises(NotFound):  # scancel exits 0 for unknown ids; only --verbose says so
        slurm.cancel("9")


def test_reason_prefix() -> None:
    assert prefixed_reason("Xid 79 on gpu 3") == "nightshift: Xid 79 on gpu 3"
    assert prefixed_reason("nightshift: already") == "nightshift: already"


def test_exclusion_merges_and_frees_required_nodes() -> None:
    assert exclusion(["node1"], [], ["node1"]) == ("node1", "")
    assert exclusion(["node3"], [], []) == ("node3", None)
    assert exclusion(["node1"], ["node1"], []) == ("node1", None)
    assert exclusion(["node2"], ["node1"], ["node2", "node4"]) == ("node[1-2]", "node4")
    assert exclusion(["node2", "node3"], ["node1"], ["node2", "node4"]) == ("node[1-3]", "node4")
    # Returned nodes leave the list; one also named again stays.
    assert exclusion(["node3"], ["node1", "node2"], [], ["node2"]) == ("node[1,3]", None)
    assert exclusion(["node2"], ["node1", "node2"], [], ["node2"]) == ("node[1-2]", None)
    assert exclusion([], ["node1"], [], ["node1"]) == ("", None)


@pytest.mark.parametrize(
    "names",
    [
        [f"gpu{i:05d}" for i in range(64, 128)],
        ["n1", "n2", "n10", "n01", "login", "x9", "x10", "x11", "r1n1", "r1n2"],
        ["n08", "n09", "n10", "n11", "n7"],
        ["node1"],
    ],
)
def test_a_compressed_hostlist_expands_to_the_same_nodes(names: list[str]) -> None:
    compressed = compress_hostlist(names)
    assert sorted(expand_hostlist(compressed)) == sorted(set(names))
    assert len(compressed) <= len(",".join(names))


def test_a_leaf_of_nodes_is_excluded_as_one_short_hostlist() -> None:
    leaf = [f"gpu{i:05d}" for i in range(64, 128)]
    params = RequeueJob().validate({"job": "7", "exclude_nodes": ",".join(leaf)})
    exc, _ = exclusion(params["exclude_nodes"].split(","), ["login1"], [])
    assert exc == "gpu[00064-00127],login1"
    assert sorted(expand_hostlist(exc)) == sorted([*leaf, "login1"])


def test_requeue_excludes_a_list_of_nodes_and_never_all() -> None:
    assert (
        RequeueJob().validate({"job": "7", "exclude_nodes": "node1,node2"})["exclude_nodes"] == "node1,node2"
    )
    too_many = ",".join(["n"] * (MAX_NODE_LIST + 1))
    for hostile in ("ALL", "node1,all", "node[1-4]", "node1;reboot", "node1,,node2", too_many):
        with pytest.raises(ParamError):
            RequeueJob().validate({"job": "7", "exclude_nodes": hostile})
    assert "exclude_nodes" not in RequeueJob().validate({"job": "7", "exclude_nodes": ""})


def test_action_params_reject_hostile_values() -> None:
    with pytest.raises(ParamError):
        DrainNode().validate({"node": "node1; rm -rf /", "reason": "x"})
    with pytest.raises(ParamError):
        DrainNode().validate({"node": "node1", "reason": "line\nbreak"})
    with pytest.raises(ParamError):
        RequeueJob().validate({"job": "$(id)"})
    with pytest.raises(ParamError):
        ResumeNode().validate({"node": "node1", "validate": "nvidia-smi; reboot"})
    with pytest.raises(ParamError):
        ResumeNode().validate({"node": "node1", "validate": "sh -c 'reboot'"})
    with pytest.raises(ParamError):
        JobLog().validate({"job": "1", "lines": 0})
    with pytest.raises(ParamError):
        QuarantineLatest().validate({"dir": "/ckpt/../etc"})
    with pytest.raises(ParamError):
        QuarantineLatest().validate({"dir": "/ckpt", "pattern": "a/b"})
    assert ResumeNode().validate({"node": "node1", "validate": "ssh node1 nvidia-smi -q"})["validate"]
    assert JobLog().validate({"job": "12_3"}) == {"job": "12_3", "lines": 200}


def test_plans_show_the_commands() -> None:
    plan = RequeueJob().plan({"job": "7", "exclude_nodes": "node1,node3"})
    assert "scontrol requeue 7" in plan.command
    assert "ExcNodeList=node[1,3]" in plan.command
    assert plan.summary == "requeue job 7 and keep it off node1, node3"
    drain = DrainNode().plan({"node": "node1", "reason": "Xid 79"})
    assert drain.command == "scontrol update NodeName=node1 State=DRAIN 'Reason=nightshift: Xid 79'"


def test_checkpoint_listing_and_order() -> None:
    listing = "\0".join(
        ["1700000300.5 step_10", "1700000100.0 step_9", "1.0 step_8.quarantined-20260101T000000Z", ""]
    )
    entries = parse_listing(listing)

    assert entries == [(1700000300.5, "step_10"), (1700000100.0, "step_9")]
    assert by_age(entries) == ["step_9", "step_10"]  # by number: step_10 is newer than step_9
    assert by_age([(2.0, "final"), (1.0, "step_3")]) == ["step_3", "final"]  # a name without a number: mtime
    assert by_age([]) == []


def test_below_roots() -> None:
    assert below("/ckpt/run1", ["/ckpt"])
    assert below("/ckpt/run1", ["/ckpt/"])
    assert not below("/ckpt", ["/ckpt/"])  # the root itself holds every job's directories
    assert not below("/ckpt", ["/ckpt"])
    assert not below("/ckpt2/run1", ["/ckpt"])
    assert not below("/etc", ["/ckpt", "/data"])
