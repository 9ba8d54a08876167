"""Nightshift as a non-root account on Slurm: the shipped deploy/slurm/sudoers, judged by the real sudo, allows the
exact commands Nightshift builds and refuses crafted variants; the actions run end to end over the real sshd as
``nightshift`` with ``sudo -n``; without the sudoers rule the refusal is a credential error."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator

import pytest

from app.actions.base import ActionContext
from app.actions.slurm import (
    CancelJob,
    DrainNode,
    JobLog,
    RequeueJob,
    RequeueNodeJobs,
    ResumeNode,
    prefixed_reason,
)
from app.clients import Clients
from app.clients.slurm import (
    cancel_command,
    drain_command,
    exclude_command,
    reboot_command,
    requeue_command,
    resume_command,
    tail_command,
)
from app.config import Settings
from app.domain.outcome import Ok
from tests.fixtures.procs import wait_until
from tests.fixtures.slurm import SHIPPED_SUDOERS, SlurmCluster

pytestmark = pytest.mark.integration


def _allowed(argv: list[str]) -> bool:
    """Whether the installed sudoers lets ``nightshift`` run ``argv`` as root (``sudo -l -U``: the real policy)."""
    program = subprocess.run(["which", argv[0]], capture_output=True, text=True, check=True).stdout.strip()
    check = subprocess.run(["sudo", "-n", "-l", "-U", "nightshift", program, *argv[1:]], capture_output=True)
    return check.returncode == 0


OURS = [
    drain_command("node1", prefixed_reason("Xid 79 (reboot) gpu 3")),
    resume_command("node1"),
    reboot_command("gpu-a17", prefixed_reason("Xid 79")),
    requeue_command("4242"),
    requeue_command("4242_7"),
    exclude_command("4242", "node1,node[3-4]", ""),
    exclude_command("4242", "node1"),
    cancel_command("4242"),
    tail_command("/home/alice/slurm-4242.out", 200, (1001, 1001)),
]


@pytest.mark.parametrize("argv", OURS, ids=shlex.join)
def test_every_command_nightshift_builds_is_allowed(least_privilege: Settings, argv: list[str]) -> None:
    assert _allowed(argv)


CRAFTED = [
    ["setpriv", "--reuid=0", "--regid=0", "--clear-groups", "--", "tail", "-n", "5", "--", "/etc/shadow"],
    [
        "setpriv",
        "--reuid=104",
        "--regid=104",
        "--clear-groups",
        "--",
        "tail",
        "-n",
        "5",
        "--",
        "/etc/munge/munge.key",
    ],
    ["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups", "--", "sh", "-c", "id"],
    ["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups", "--", "tail", "-n", "5", "--", "/a", "/b"],
    ["setpriv", "--reuid=1001", "--regid=1001", "--", "tail", "-n", "5", "--", "/a"],
    ["scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=someone else"],
    ["scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=nightshift: x", "Weight=0"],
    ["scontrol", "update", "NodeName=node1,node2", "State=RESUME"],
    ["scontrol", "update", "JobId=4242", "ExcNodeList=node1", "Command=/bin/sh"],
    ["scontrol", "update", "JobId=4242", "ExcNodeList=node1", "ReqNodeList=", "TimeLimit=UNLIMITED"],
    ["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=nightshift: x", "node1"],
    ["scontrol", "show", "config"],
    ["scontrol", "shutdown"],
    ["scontrol", "requeue", "4242", "4243"],
    ["scancel", "--verbose", "--user=alice"],
    ["scancel", "4242"],
    ["sh", "-c", "id"],
    ["tail", "-n", "5", "/etc/shadow"],
]


@pytest.mark.parametrize("argv", CRAFTED, ids=shlex.join)
def test_crafted_variants_are_refused(least_privilege: Settings, argv: list[str]) -> None:
    assert not _allowed(argv)


def test_the_shipped_file_parses_and_has_only_anchored_rules(least_privilege: Settings) -> None:
    subprocess.run(["visudo", "-c", "-q", "-f", str(SHIPPED_SUDOERS)], check=True)
    text = SHIPPED_SUDOERS.read_text().replace("\\\n", " ")
    (alias,) = re.findall(r"^Cmnd_Alias NIGHTSHIFT_SLURM = (.*)$", text, re.MULTILINE)
    commands = [item.strip() for item in re.split(r"(?<!\\),", alias)]
    assert len(commands) == 7
    # Each: an absolute program and one anchored regular expression over its arguments, never a glob.
    assert all(re.fullmatch(r"/usr/bin/[a-z]+ \^.*\$", command) for command in commands), commands
    assert "env_keep" not in text and "SETENV" not in text and "ALL=(ALL" not in text


@pytest.fixture
def ctx(least_privilege: Settings) -> Iterator[ActionContext]:
    clients = Clients(least_privilege)
    yield ActionContext(settings=least_privilege, clients=clients)
    clients.close()


def test_actions_run_as_the_account_through_sudo(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    assert ctx.clients.slurm.run(["id", "-un"]).stdout.strip() == "nightshift"

    drained = DrainNode().run({"node": "node1", "reason": "Xid 79"}, ctx)
    assert isinstance(drained, Ok), drained
    assert "sudo -n -- scontrol update NodeName=node1 State=DRAIN" in drained.command
    assert clean_slurm.node_reason("node1") == "nightshift: Xid 79"
    assert isinstance(ResumeNode().run({"node": "node1"}, ctx), Ok)
    assert "drain" not in clean_slurm.node_state("node1")

    job = clean_slurm.sbatch("sleep 300", "--requeue", "--nodelist=node1")
    wait_until(lambda: clean_slurm.squeue_state(job) == "RUNNING", 20, f"job {job} running")
    requeued = RequeueJob().run({"job": job, "exclude_nodes": "node1"}, ctx)
    assert isinstance(requeued, Ok), requeued
    assert "sudo -n -- scontrol requeue" in requeued.command
    wait_until(lambda: clean_slurm.squeue_state(job) == "RUNNING", 30, f"job {job} running again")
    assert clean_slurm.job_nodes(job) != "node1"
    assert isinstance(CancelJob().run({"job": job}, ctx), Ok)


def test_job_log_is_read_as_the_job_owner_through_sudo(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    submitted = subprocess.run(
        ["runuser", "-u", "nobody", "--", "sbatch", "--parsable", f"--chdir={clean_slurm.jobs_dir}",
         f"--output={clean_slurm.jobs_dir}/nobody-%j.out", "--wrap=echo hello from nobody"],
        env={**os.environ, **clean_slurm.env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    wait_until(lambda: (clean_slurm.jobs_dir / f"nobody-{job}.out").exists(), 20, "the job's output")
    wait_until(lambda: clean_slurm.squeue_state(job) in ("", "COMPLETED"), 20, f"job {job} done")

    outcome = JobLog().run({"job": job, "lines": 10}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["log"] == "hello from nobody\n"


def test_without_the_rule_sudo_refuses_and_that_is_a_credential_error(
    clean_slurm: SlurmCluster, ctx: ActionContext
) -> None:
    # A root job (uid 0): the sudoers never lets Nightshift read files as root.
    job = clean_slurm.sbatch("echo from root")
    wait_until(lambda: clean_slurm.squeue_state(job) in ("", "COMPLETED"), 20, f"job {job} done")

    outcome = JobLog().run({"job": job, "lines": 10}, ctx)

    assert outcome.status == "credential_error", outcome
    assert "sudo refused" in outcome.reason and "deploy/slurm/sudoers" in outcome.reason


def test_the_jobs_of_a_node_are_found_with_squeue_and_requeued_off_it(
    clean_slurm: SlurmCluster, ctx: ActionContext
) -> None:
    job = clean_slurm.sbatch("sleep 300", "--requeue", "--nodelist=node3")
    wait_until(lambda: clean_slurm.squeue_state(job) == "RUNNING", 20, f"job {job} running")
    assert RequeueNodeJobs().run({"node": "node4"}, ctx).output == "no job runs on node4"

    outcome = RequeueNodeJobs().run({"node": "node3"}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["jobs"] == [job]
    assert outcome.command.splitlines()[0].endswith("sudo -n -- scontrol requeue " + job + "'")
    wait_until(lambda: clean_slurm.squeue_state(job) == "RUNNING", 30, f"job {job} running again")
    assert clean_slurm.job_nodes(job) != "node3"
