"""Slurm and checkpoint actions on a real Slurm 22.05 (munged, slurmctld, node1 + node2) over real SSH."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.actions.base import ActionContext
from app.actions.checkpoint import QuarantineLatest
from app.actions.slurm import ACTIONS, CancelJob, DrainNode, JobInfoAction, JobLog, RequeueJob, ResumeNode
from app.clients import Clients
from app.domain.errors import ParamError
from app.domain.outcome import Failed, Ok
from tests.fixtures.procs import wait_until
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.integration


class FixedClock:
    def now(self) -> datetime:
        return datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC)

    def sleep(self, seconds: float) -> None:
        raise AssertionError("actions must not sleep here")


@pytest.fixture
def ctx(slurm_cluster: SlurmCluster) -> Iterator[ActionContext]:
    clients = Clients(slurm_cluster.settings)
    yield ActionContext(settings=slurm_cluster.settings, clients=clients, clock=FixedClock())
    clients.close()


def _wait_running(cluster: SlurmCluster, job: str, node: str, timeout: float = 20) -> None:
    wait_until(
        lambda: cluster.squeue_state(job) == "RUNNING" and cluster.job_nodes(job) == node,
        timeout,
        f"job {job} RUNNING on {node} (now {cluster.squeue_state(job)} on {cluster.job_nodes(job)!r})",
    )


# --- drain / resume ---


def test_drain_prefixes_the_reason(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    outcome = DrainNode().run({"node": "node1", "reason": "Xid 79 on gpu 3"}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert clean_slurm.node_state("node1") == "idle+drain"
    assert clean_slurm.node_reason("node1") == "nightshift: Xid 79 on gpu 3"
    assert outcome.data["changed"] is True
    assert outcome.data["state"] == "idle+drain"
    assert "scontrol update NodeName=node1 State=DRAIN" in outcome.command
    assert clean_slurm.node_state("node2") == "idle"


def test_drain_never_clobbers_a_foreign_drain(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    clean_slurm.command("scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=disk swap by alice")

    outcome = DrainNode().run({"node": "node1", "reason": "Xid 79"}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["changed"] is False
    assert "already drained by someone else" in outcome.output
    assert clean_slurm.node_reason("node1") == "disk swap by alice"


def test_resume_only_clears_our_own_drain(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    clean_slurm.command("scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=disk swap by alice")

    refused = ResumeNode().run({"node": "node1"}, ctx)

    assert isinstance(refused, Failed), refused
    assert "did not set" in refused.reason
    assert clean_slurm.node_state("node1") == "idle+drain"

    clean_slurm.command("scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=nightshift: Xid 79")
    resumed = ResumeNode().run({"node": "node1", "validate": "test -r /etc/hostname"}, ctx)

    assert isinstance(resumed, Ok), resumed
    assert resumed.data["changed"] is True
    wait_until(lambda: clean_slurm.node_state("node1") == "idle", 10, "node1 idle after resume")
    assert resumed.command.splitlines()[0] == "bash -lc 'test -r /etc/hostname'"


def test_resume_of_a_node_in_service_changes_nothing(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    outcome = ResumeNode().run({"node": "node2"}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["changed"] is False


def test_failing_validation_keeps_the_node_drained(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    clean_slurm.command("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=nightshift: Xid 48")

    outcome = ResumeNode().run({"node": "node2", "validate": "ls /nonexistent-gpu-check"}, ctx)

    assert isinstance(outcome, Failed), outcome
    assert outcome.exit_code == 2
    assert "stays drained" in outcome.reason
    assert "No such file or directory" in outcome.output
    assert clean_slurm.node_state("node2") == "idle+drain"


def test_unknown_node_is_a_failure_not_an_exception(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    outcome = DrainNode().run({"node": "node9", "reason": "Xid 79"}, ctx)

    assert isinstance(outcome, Failed), outcome
    assert "not found" in outcome.reason


# --- jobs ---


def test_requeue_moves_the_job_off_the_excluded_node(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    job = clean_slurm.sbatch("sleep 300", "--requeue", "--nodelist=node1")
    _wait_running(clean_slurm, job, "node1")
    assert isinstance(DrainNode().run({"node": "node1", "reason": "Xid 79"}, ctx), Ok)

    outcome = RequeueJob().run({"job": job, "exclude_nodes": "node1"}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["exc_nodes"] == "node1"
    assert outcome.data["req_nodes"] == ""  # -w node1 had to go, or the job could run nowhere
    assert outcome.data["restarts"] == 1
    # The requeued job becomes eligible after cred_expire (5 s) + the next scheduling pass.
    _wait_running(clean_slurm, job, "node2", timeout=30)


def test_requeue_of_a_pending_job_only_excludes(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    job = clean_slurm.sbatch("sleep 300", "--requeue", "--hold")

    outcome = RequeueJob().run({"job": job, "exclude_nodes": "node2"}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert "already waiting to run" in outcome.output
    assert outcome.data["state"] == "PENDING"
    assert outcome.data["exc_nodes"] == "node2"
    assert outcome.data["restarts"] == 0


def test_requeue_sends_the_exclusion_as_one_hostlist_and_slurm_reads_it_back(
    clean_slurm: SlurmCluster, ctx: ActionContext
) -> None:
    job = clean_slurm.sbatch("sleep 300", "--requeue", "--hold")

    outcome = RequeueJob().run({"job": job, "exclude_nodes": "node3,node1,node2"}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert "ExcNodeList=node[1-3]" in outcome.command
    assert outcome.data["exc_nodes"] == "node[1-3]"  # Slurm's own hostlist of the three nodes


def test_requeue_lets_the_job_back_on_returned_nodes_and_keeps_a_hand_exclusion(
    clean_slurm: SlurmCluster, ctx: ActionContext
) -> None:
    job = clean_slurm.sbatch("sleep 300", "--requeue", "--hold", "--exclude=node1")  # someone else's
    first = RequeueJob().run({"job": job, "exclude_nodes": "node2"}, ctx)
    assert isinstance(first, Ok) and (first.data["added"], first.data["dropped"]) == (["node2"], [])

    # node2 is back in service (the engine says so: return_nodes); node3 is the new culprit.
    outcome = RequeueJob().run({"job": job, "exclude_nodes": "node3", "return_nodes": "node2"}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert (outcome.data["added"], outcome.data["dropped"]) == (["node3"], ["node2"])
    assert outcome.data["exc_nodes"] == "node[1,3]"  # node1, excluded by hand, stays


def test_requeue_refuses_a_no_requeue_job(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    job = clean_slurm.sbatch("sleep 300", "--no-requeue")

    outcome = RequeueJob().run({"job": job}, ctx)

    assert isinstance(outcome, Failed), outcome
    assert "--no-requeue" in outcome.reason


def test_cancel(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    job = clean_slurm.sbatch("sleep 300")
    _wait_running(clean_slurm, job, clean_slurm.job_nodes(job) or "node1")

    outcome = CancelJob().run({"job": job}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["state"] in ("CANCELLED", "COMPLETING")
    wait_until(lambda: clean_slurm.squeue_state(job) == "CANCELLED", 10, f"job {job} CANCELLED")


def test_cancel_of_an_unknown_job_fails(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    outcome = CancelJob().run({"job": "987654"}, ctx)

    assert isinstance(outcome, Failed), outcome
    assert "Invalid job id" in outcome.reason


def test_job_info(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    job = clean_slurm.sbatch("sleep 300", "--requeue", "--nodelist=node2", "--job-name=train llama")
    _wait_running(clean_slurm, job, "node2")

    outcome = JobInfoAction().run({"job": job}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["job_id"] == job
    assert outcome.data["state"] == "RUNNING"
    assert outcome.data["nodes"] == "node2"
    assert outcome.data["requeue"] is True
    assert outcome.data["stdout_path"] == f"{clean_slurm.jobs_dir}/{job}.out"
    assert isinstance(JobInfoAction().run({"job": "987654"}, ctx), Failed)


def test_job_log_tails_the_output(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    job = clean_slurm.sbatch(script='#!/bin/sh\nfor i in $(seq 1 50); do echo "line $i"; done\n')
    wait_until(lambda: clean_slurm.squeue_state(job) == "COMPLETED", 20, f"job {job} COMPLETED")

    outcome = JobLog().run(JobLog().validate({"job": job, "lines": "5"}), ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data["log"] == "".join(f"line {i}\n" for i in range(46, 51))
    assert outcome.data["paths"] == [f"{clean_slurm.jobs_dir}/{job}.out"]


def test_job_log_reads_as_the_job_owner(clean_slurm: SlurmCluster, ctx: ActionContext) -> None:
    secret = clean_slurm.base / "secret"
    secret.write_text("TOPSECRET\n")
    secret.chmod(0o600)
    submitted = subprocess.run(
        ["runuser", "-u", "nobody", "--", "sbatch", "--parsable", f"--chdir={clean_slurm.jobs_dir}",
         f"--output={clean_slurm.jobs_dir}/nobody-%j.out", "--wrap=echo hello from nobody"],
        env={**os.environ, **clean_slurm.env}, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    job = submitted.stdout.strip()
    wait_until(lambda: clean_slurm.squeue_state(job) == "COMPLETED", 20, f"job {job} COMPLETED")
    assert JobLog().run({"job": job, "lines": 10}, ctx).data["log"] == "hello from nobody\n"

    # The owner swaps the log for a link to a file only root may read: the read must fail, not leak it.
    log = clean_slurm.jobs_dir / f"nobody-{job}.out"
    log.unlink()
    log.symlink_to(secret)
    outcome = JobLog().run({"job": job, "lines": 10}, ctx)

    assert isinstance(outcome, Failed), outcome
    assert "Permission denied" in outcome.reason
    assert "TOPSECRET" not in f"{outcome.reason}{outcome.output}{outcome.data}"


# --- hostile values ---

HOSTILE = ["node1; rm -rf /", "$(id)", "node1\nnode2", "`id`"]
VALID = {
    "job": "1",
    "node": "node1",
    "reason": "Xid 79",
    "dir": "/ckpt",
    "exclude_nodes": "node2",
    "validate": "true",
}


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_are_rejected_before_any_command(
    value: str, slurm_cluster: SlurmCluster, ctx: ActionContext
) -> None:
    sshd_log = slurm_cluster.daemons["sshd"].log_path
    logins_before = sshd_log.read_text(errors="replace").count("Accepted publickey")
    for action in (*ACTIONS, QuarantineLatest()):
        for name in action.params:
            if action.params[name].kind != "string":
                continue
            raw = {key: VALID[key] for key in action.params if action.params[key].required}
            with pytest.raises(ParamError):
                action.validate({**raw, name: value})
            # Even past validation, the client checks again, so nothing reaches SSH.
            outcome = action.run({**action.validate(raw), name: value}, ctx)
            assert isinstance(outcome, Failed), (action.name, name, outcome)

    assert sshd_log.read_text(errors="replace").count("Accepted publickey") == logins_before


# --- checkpoint quarantine ---


def _checkpoints(root: Path, *names: str) -> Path:
    root.mkdir(parents=True)
    for name in names:
        (root / name).mkdir()
    return root


def test_quarantine_renames_the_newest_checkpoint(slurm_cluster: SlurmCluster, ctx: ActionContext) -> None:
    run = _checkpoints(slurm_cluster.checkpoint_root / "run-a", "step_8", "step_9", "step_10", "notes")
    (run / "step_11.tmp").write_text("a file, not a checkpoint directory")

    outcome = QuarantineLatest().run(QuarantineLatest().validate({"dir": str(run), "pattern": "step_*"}), ctx)

    assert isinstance(outcome, Ok), outcome
    assert outcome.data == {
        "quarantined": f"{run}/step_10",
        "to": f"{run}/step_10.quarantined-20261202T150000Z",
        "previous": f"{run}/step_9",
    }
    assert sorted(p.name for p in run.iterdir()) == [
        "notes", "step_10.quarantined-20261202T150000Z", "step_11.tmp", "step_8", "step_9",
    ]  # fmt: skip

    again = QuarantineLatest().run({"dir": str(run), "pattern": "step_*"}, ctx)

    assert isinstance(again, Ok), again
    assert again.data["quarantined"] == f"{run}/step_9"  # earlier quarantines are not candidates


def test_quarantine_refuses_a_dir_outside_the_roots(slurm_cluster: SlurmCluster, ctx: ActionContext) -> None:
    outside = _checkpoints(slurm_cluster.base / "elsewhere", "step_1", "step_2")

    outcome = QuarantineLatest().run({"dir": str(outside), "pattern": "*"}, ctx)

    assert isinstance(outcome, Failed), outcome
    assert "not strictly below an allowed root" in outcome.reason
    assert sorted(p.name for p in outside.iterdir()) == ["step_1", "step_2"]


def test_quarantine_does_not_follow_symlinks_out_of_the_root(
    slurm_cluster: SlurmCluster, ctx: ActionContext
) -> None:
    outside = _checkpoints(slurm_cluster.base / "victim", "step_1", "step_2")
    escape = slurm_cluster.checkpoint_root / "escape"
    escape.symlink_to(outside)
    run = _checkpoints(slurm_cluster.checkpoint_root / "run-b", "step_5")
    (run / "step_99").symlink_to(outside / "step_2")

    refused = QuarantineLatest().run({"dir": str(escape), "pattern": "*"}, ctx)
    inside = QuarantineLatest().run({"dir": str(run), "pattern": "step_*"}, ctx)

    assert isinstance(refused, Failed), refused
    assert f"resolves to {outside}" in refused.reason
    assert isinstance(inside, Ok), inside
    assert inside.data["quarantined"] == f"{run}/step_5"  # the linked step_99 is not a candidate
    assert inside.data["previous"] is None
    assert sorted(p.name for p in outside.iterdir()) == ["step_1", "step_2"]


def test_quarantine_of_a_missing_dir_fails(slurm_cluster: SlurmCluster, ctx: ActionContext) -> None:
    outcome = QuarantineLatest().run(
        {"dir": str(slurm_cluster.checkpoint_root / "nope"), "pattern": "*"}, ctx
    )

    assert isinstance(outcome, Failed), outcome
    assert "No such file or directory" in outcome.reason


# --- planned swaps: the checkpoint request ---


def test_request_checkpoint_signals_the_running_steps_and_the_job_runs_on(
    clean_slurm: SlurmCluster, ctx: ActionContext
) -> None:
    from app.actions.checkpoint_request import RequestCheckpoint

    out = clean_slurm.jobs_dir
    # The progress library's own handler in a task srun started: it answers the request and exits 0.
    program = (
        "import pathlib, signal, sys, time\n"
        "from nightshift_progress.checkpoint_request import CheckpointRequest\n"
        "request = CheckpointRequest(pathlib.Path('/nonexistent'))\n"
        "assert request.install_signal(signal.SIGUSR1)\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "(out / 'ready').touch()\n"
        "deadline = time.monotonic() + 120\n"
        "while not request.requested() and time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\n"
        "(out / ('asked' if request.requested() else 'never-asked')).touch()\n"
    )
    (Path(out) / "answer.py").write_text(program)
    script = f"#!/bin/sh\nexec srun {sys.executable} {out}/answer.py {out}/\n"
    job = clean_slurm.sbatch(
        None, "--nodelist=node1", "--comment=nightshift.checkpoint_signal=USR1", script=script
    )
    wait_until(lambda: (Path(out) / "ready").exists(), 30, "the job's task installed its handler")

    outcome = RequestCheckpoint().run({"job": job}, ctx)

    assert isinstance(outcome, Ok), outcome
    assert f"--signal=USR1 {job}" in outcome.command
    wait_until(lambda: (Path(out) / "asked").exists(), 20, "the task heard the request")
    wait_until(lambda: clean_slurm.squeue_state(job) == "COMPLETED", 20, f"job {job} COMPLETED, not killed")


def test_a_job_that_announces_no_checkpoint_signal_is_not_signalled(
    clean_slurm: SlurmCluster, ctx: ActionContext
) -> None:
    from app.actions.checkpoint_request import RequestCheckpoint

    job = clean_slurm.sbatch("srun sleep 300", "--comment=nightshift.progress_port=9464")
    _wait_running(clean_slurm, job, clean_slurm.job_nodes(job) or "node1")

    outcome = RequestCheckpoint().run({"job": job}, ctx)

    assert isinstance(outcome, Failed), outcome
    assert "announces no checkpoint signal" in outcome.reason and "scancel" not in outcome.command
    assert clean_slurm.squeue_state(job) == "RUNNING"  # SIGUSR1 would have killed the sleep
    assert isinstance(RequestCheckpoint().run({"job": "987654"}, ctx), Failed)
    with pytest.raises(ParamError):
        RequestCheckpoint().validate({"job": "1; reboot"})
