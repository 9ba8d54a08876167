"""Slurm actions: drain and resume nodes, requeue and cancel jobs, read job state and logs.

Every action talks to Slurm through ``ctx.clients.slurm`` (:class:`app.clients.slurm.SlurmClient`, over SSH).
Nightshift marks what it does: drain reasons start with ``nightshift:``, and it only ever resumes nodes that
carry that mark, so a drain set by a person is never cleared or overwritten by a playbook.
"""

from __future__ import annotations

import re
import shlex
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from app.actions.base import Action, ActionContext, Plan
from app.clients.node_check import NodeCheck, workdir
from app.clients.slurm import (
    MAX_TAIL_LINES,
    NodeInfo,
    SlurmClient,
    cancel_command,
    drain_command,
    exclude_command,
    job_owner_command,
    node_jobs_command,
    parse_job,
    parse_owner,
    reboot_command,
    requeue_command,
    resume_command,
    show_job_command,
    tail_command,
)
from app.domain.errors import (
    BackendError,
    CommandFailed,
    ConfigError,
    OutcomeUnknown,
    ParamError,
    Unavailable,
)
from app.domain.hostlist import compress_hostlist
from app.domain.outcome import Failed, Ok, Outcome, Retry, outcome_from_error, tail
from app.domain.params import (
    MAX_NODE_LIST,
    NODE_LIST_CHARS,
    SAFE_TEXT,
    SLURM_JOB_ID,
    SLURM_NODE_LIST,
    SLURM_NODE_NAME,
    SLURM_RESERVED,
    Param,
)
from app.domain.states import LedgerKind

if TYPE_CHECKING:
    from app.clients.ssh import CommandResult

REASON_PREFIX = "nightshift:"
# A node in one of these states or with one of these flags is not ready to validate: rebooting, not answering,
# or still running (or finishing) jobs.
NOT_SETTLED_FLAGS = frozenset(
    {"reboot_requested", "reboot_issued", "not_responding", "powering_up", "powered_down", "completing"}
)
NOT_SETTLED_STATES = frozenset({"allocated", "mixed", "completing", "unknown", "future"})
# A validation command for resume_node: words of safe characters, split on blanks, no quoting or shell syntax.
VALIDATION_COMMAND = r"[A-Za-z0-9_./=:,@%+-]+(?: [A-Za-z0-9_./=:,@%+-]+){0,31}"

_NODE = Param(pattern=SLURM_NODE_NAME, reserved=SLURM_RESERVED, description="Slurm node name (one; not ALL)")
_REASON = Param(
    pattern=SAFE_TEXT, max_length=180, prose=True, description="why (prefixed with 'nightshift: ')"
)
_JOB = Param(pattern=SLURM_JOB_ID, description="Slurm job id (1234, 1234_7, 1234+1)")


def ours(node: NodeInfo) -> bool:
    """Whether the node's drain/down reason was set by Nightshift."""
    return node.reason.startswith(REASON_PREFIX)


def prefixed_reason(reason: str) -> str:
    """The drain reason as Nightshift sets it: always starting with ``nightshift: ``."""
    reason = reason.strip()
    return reason if reason.startswith(REASON_PREFIX) else f"{REASON_PREFIX} {reason}"


def exclusion(
    nodes: Sequence[str], excluded: list[str], required: list[str], returned: Sequence[str] = ()
) -> tuple[str, str | None]:
    """The (ExcNodeList, ReqNodeList) that keep a job off ``nodes`` and let it back on ``returned``, given its
    lists expanded (``excluded``: ExcNodeList, ``required``: ReqNodeList), each one hostlist expression (a leaf's
    64 nodes are ``gpu[00064-00127]``, not 64 names). The nodes are added to the excluded ones and removed from the
    required ones, else the job could run nowhere; ``returned`` ones (Nightshift's own, back in service:
    app/domain/exclusions.py) leave the excluded ones. ReqNodeList is None when it needs no change."""
    kept = [n for n in excluded if n not in returned or n in nodes]
    exc = compress_hostlist([*kept, *nodes])
    req = compress_hostlist(n for n in required if n not in nodes) if set(nodes) & set(required) else None
    return exc, req


def excluded_nodes(params: Mapping[str, Any], key: str = "exclude_nodes") -> list[str]:
    """The ``exclude_nodes`` (or ``return_nodes``) of a requeue, as a list."""
    return [node for node in (params.get(key) or "").split(",") if node]


# The parameters of every validate_node action besides the node (Slurm: over SSH; Kubernetes: in a pod).
VALIDATION_PARAMS = {
    "command": Param(
        required=False,
        pattern=VALIDATION_COMMAND,
        max_length=400,
        description="command line of plain words run on the node (default repair.validation_command)",
    ),
    "timeout_seconds": Param(
        kind="integer", required=False, description="default repair.validation_timeout_seconds"
    ),
    "run": Param(
        kind="integer",
        required=False,
        default=0,
        description="the repair's id, which names the run: pod or node directory (the repair sets it)",
    ),
}


def check_validation(action: str, params: Mapping[str, Any], limit: int = 86_400) -> None:
    """A validation's ``timeout_seconds``, when given, is 1 s to a day; its ``run`` is not negative."""
    timeout = params.get("timeout_seconds")
    if timeout is not None and not 1 <= timeout <= limit:
        raise ParamError(action, "timeout_seconds", f"must be between 1 and {limit}, got {timeout}")
    if params.get("run", 0) < 0:
        raise ParamError(action, "run", f"must be >= 0, got {params['run']}")


def executed_commands(results: list[CommandResult]) -> str:
    """The command lines run so far, one a line, for the ledger."""
    return "\n".join(result.command for result in results)


class SlurmAction(Action):
    """An action carried out with commands on the Slurm host.

    :meth:`run` checks ``params`` again (so a direct call is as safe as one through the engine), then calls
    :meth:`execute`; backend errors become outcomes naming the commands ``execute`` appended to ``executed``,
    and a value refused by a pattern, or missing settings, is :class:`Failed` rather than an exception.
    """

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        executed: list[CommandResult] = []
        try:
            return self.execute(ctx.clients.slurm, self.validate(params), executed, ctx)
        except BackendError as exc:
            return outcome_from_error(exc, command=executed_commands(executed))
        except (ParamError, ConfigError) as exc:
            return Failed(reason=str(exc), command=executed_commands(executed))

    @abstractmethod
    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        """Do it with checked ``params``; append each finished command to ``executed``. May raise
        :mod:`app.domain.errors`."""


class DrainNode(SlurmAction):
    """Drain a node: running jobs finish, no new ones start. Never overwrites someone else's drain."""

    name = "slurm.drain_node"
    description = "Drain a Slurm node with a reason prefixed 'nightshift:'; leaves foreign drains alone"
    params = {"node": _NODE, "reason": _REASON}
    scope_keys = ("node", "partition")
    takes_out = True

    def plan(self, params: Mapping[str, Any]) -> Plan:
        argv = drain_command(params["node"], prefixed_reason(params["reason"]))
        return Plan(f"drain node {params['node']} unless someone else drained it", shlex.join(argv))

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        node, reason = params["node"], prefixed_reason(params["reason"])
        before = slurm.node_info(node)
        if before.drained and not ours(before):
            return Ok(
                output=f"node {node} already drained by someone else ({before.state_text}): {before.reason}",
                data={
                    "node": node,
                    "state": before.state_text,
                    "reason": before.reason,
                    "changed": False,
                },
            )
        executed.append(slurm.drain(node, reason))
        after = slurm.node_info(node)
        return Ok(
            command=executed_commands(executed),
            output=f"{executed[-1].output}node {node}: {after.state_text}, reason: {after.reason}",
            exit_code=0,
            data={"node": node, "state": after.state_text, "reason": after.reason, "changed": True},
        )


class ResumeNode(SlurmAction):
    """Return a node Nightshift drained to service, after an optional validation command passes.

    ``validate`` is a command line of plain words (no quotes or shell syntax, see ``VALIDATION_COMMAND``) run
    over SSH on the Slurm login host, split with :func:`shlex.split`; e.g. ``ssh node1 nvidia-smi -q`` or a
    site health-check script. A non-zero exit fails the action and the node stays drained.
    """

    name = "slurm.resume_node"
    description = "Resume a node drained by nightshift, after an optional validation command succeeds"
    params = {
        "node": _NODE,
        "validate": Param(
            required=False,
            pattern=VALIDATION_COMMAND,
            max_length=400,
            description="command run on the Slurm host first, e.g. 'ssh node1 nvidia-smi -q'",
        ),
    }
    return_to_service = True
    scope_keys = ("node", "partition")

    def plan(self, params: Mapping[str, Any]) -> Plan:
        commands = [shlex.join(resume_command(params["node"]))]
        if params.get("validate"):
            commands.insert(0, shlex.join(shlex.split(params["validate"])))
        return Plan(f"resume node {params['node']} if nightshift drained it", "\n".join(commands))

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        node = params["node"]
        before = slurm.node_info(node)
        if not (before.drained or before.state == "down"):
            return Ok(
                output=f"node {node} is {before.state_text}: nothing to resume",
                data={"node": node, "state": before.state_text, "changed": False},
            )
        if not ours(before):
            return Failed(
                reason=f"node {node} is {before.state_text} for a reason nightshift did not set "
                f"({before.reason or 'none'}); leaving it to whoever did",
                data={"node": node, "state": before.state_text, "reason": before.reason},
            )
        if params.get("validate"):
            check = slurm.runner.run(shlex.split(params["validate"]))
            executed.append(check)
            if check.exit_code != 0:
                return Failed(
                    reason=f"validation exited {check.exit_code}; node {node} stays drained",
                    command=executed_commands(executed),
                    output=tail(check.output),
                    exit_code=check.exit_code,
                )
        executed.append(slurm.resume(node))
        after = slurm.node_info(node)
        return Ok(
            command=executed_commands(executed),
            output=tail("".join(r.output for r in executed) + f"node {node}: {after.state_text}"),
            exit_code=0,
            data={"node": node, "state": after.state_text, "changed": True},
        )


class RebootNode(SlurmAction):
    """Reboot a node through Slurm as soon as its jobs are gone, to come back DOWN with our reason.

    ``scontrol reboot ASAP nextstate=DOWN reason=...``: ASAP drains the node meanwhile, and DOWN after the
    reboot keeps jobs off it until validation has passed and the repair resumes it (``slurm.resume_node``
    resumes a DOWN node whose reason carries our prefix). Needs ``RebootProgram`` in slurm.conf.
    """

    name = "slurm.reboot_node"
    description = "Reboot a Slurm node when idle (ASAP), to come back DOWN until validated and resumed"
    params = {"node": _NODE, "reason": _REASON}
    scope_keys = ("node", "partition")
    takes_out = True

    def plan(self, params: Mapping[str, Any]) -> Plan:
        argv = reboot_command(params["node"], prefixed_reason(params["reason"]))
        return Plan(f"reboot node {params['node']} once idle; it comes back DOWN", shlex.join(argv))

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        node = params["node"]
        before = slurm.node_info(node)
        if (before.drained or before.state == "down") and not ours(before):
            return Failed(
                reason=f"node {node} is {before.state_text} for a reason nightshift did not set "
                f"({before.reason or 'none'}): not rebooting it",
                data={"node": node, "state": before.state_text, "reason": before.reason},
            )
        executed.append(slurm.reboot(node, prefixed_reason(params["reason"])))
        after = slurm.node_info(node)
        return Ok(
            command=executed_commands(executed),
            output=f"{executed[-1].output}node {node}: {after.state_text}, reason: {after.reason}",
            exit_code=0,
            data={"node": node, "state": after.state_text, "reason": after.reason, "changed": True},
        )


class ValidateNode(SlurmAction):
    """Run the validation command ON the node (SSH to ``slurm.node_ssh_host``); exit 0 means healthy.

    Level-triggered, one short look per run (:mod:`app.clients.node_check`), so a validation of minutes never holds
    the worker: the first run waits (Retry) while the node is rebooting, not responding or still running jobs, then
    starts the command detached on the node; later runs answer Retry while it runs, and once it has ended read its
    exit status and output and clean up. A command still running ``timeout_seconds`` after its start is stopped and
    has failed, as has any non-zero exit. An unreachable node is Retry (the repair bounds the wait).
    """

    name = "slurm.validate_node"
    description = (
        "Validate a Slurm node with a command run on it over SSH (default: repair.validation_command)"
    )
    params = {"node": _NODE, **VALIDATION_PARAMS}
    scope_keys = ("node", "partition")

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        check_validation(self.name, params)
        return params

    def plan(self, params: Mapping[str, Any]) -> Plan:
        command = params.get("command") or "<repair.validation_command>"
        return Plan(
            f"validate node {params['node']}: run `{command}` on it, exit 0 = healthy",
            f"ssh <slurm.node_ssh_host for {params['node']}> {command} (detached in {workdir(params['run'])}, "
            "probed until it ends)",
        )

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        node, run = params["node"], params["run"]
        cfg = ctx.settings.repair
        command = params.get("command") or cfg.validation_command
        timeout = params.get("timeout_seconds") or cfg.validation_timeout_seconds
        if not re.fullmatch(VALIDATION_COMMAND, command):
            raise ParamError(
                self.name, "command", f"{command!r} does not match the pattern {VALIDATION_COMMAND}"
            )
        argv = shlex.split(command)
        check = NodeCheck(ctx.clients.node_runner(node))
        try:
            probe = check.probe(run)
            if probe.state == "absent":
                info = slurm.node_info(node)
                if NOT_SETTLED_FLAGS.intersection(info.flags) or info.state in NOT_SETTLED_STATES:
                    return Retry(
                        reason=f"node {node} is {info.state_text}: waiting for it to settle before validating",
                        after=cfg.poll_seconds,
                        data={"node": node, "state": info.state_text},
                    )
                check.start(run, argv)
                ctx.record(
                    LedgerKind.VALIDATION_STARTED, f"`{shlex.join(argv)}` started on {node}", {"node": node}
                )
                return Retry(reason=f"validation started on {node}", after=cfg.poll_seconds)
            if probe.state == "running" and probe.elapsed < timeout:
                return Retry(
                    reason=f"validation running on {node} for {probe.elapsed}s", after=cfg.poll_seconds
                )
            check.stop(run)
        except (Unavailable, OutcomeUnknown) as exc:  # not reached, or no answer in time: look again
            return Retry(reason=f"node {node}: {exc}", after=cfg.poll_seconds)
        data = {
            "node": node,
            "command": shlex.join(argv),
            "exit_code": probe.exit_code,
            "output": tail(probe.output),
        }
        if probe.state == "running":
            return Failed(
                reason=f"validation on {node} timed out after {timeout}s: counts as failed",
                command=shlex.join(argv),
                data={**data, "verdict": "fail", "timed_out": True},
            )
        if probe.exit_code != 0:
            return Failed(
                reason=f"validation `{shlex.join(argv)}` exited {probe.exit_code} on {node}",
                command=shlex.join(argv),
                output=tail(probe.output),
                exit_code=probe.exit_code,
                data={**data, "verdict": "fail"},
            )
        return Ok(
            command=shlex.join(argv), output=tail(probe.output), exit_code=0, data={**data, "verdict": "pass"}
        )


class RequeueJob(SlurmAction):
    """Requeue a batch job, optionally keeping it off a node.

    What works on Slurm 22.05 (verified live): ``scontrol update JobId=.. ExcNodeList=..`` on a RUNNING job is
    refused ("Job is no longer pending execution"), but is accepted once the job is COMPLETING or PENDING. So
    the job is requeued first, then updated. This is race-free because a requeued job only becomes eligible
    ``cred_expire + 1`` seconds later (121 s by default). When the node is also in the job's ReqNodeList
    (``sbatch -w``) it is removed from it, or the job would wait forever (Reason=BadConstraints). A job
    already pending, or still COMPLETING after an earlier requeue ("Job is pending execution"), is only
    updated.
    """

    name = "slurm.requeue_job"
    description = "Requeue a Slurm batch job (optionally keeping it off nodes)"
    params = {
        "job": _JOB,
        "exclude_nodes": Param(
            pattern=SLURM_NODE_LIST,
            max_length=NODE_LIST_CHARS,
            required=False,
            description=f"nodes to keep the job off, comma-separated (at most {MAX_NODE_LIST}; not ALL)",
        ),
        "return_nodes": Param(
            pattern=SLURM_NODE_LIST,
            max_length=NODE_LIST_CHARS,
            required=False,
            description="nodes Nightshift kept the job off that are back in service: dropped from its ExcNodeList "
            '("{{ incident.returned }}"; never a node someone else excluded)',
        ),
    }
    scope_keys = ("node", "partition")

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        for key in ("exclude_nodes", "return_nodes"):
            for node in excluded_nodes(params, key):
                if node.lower() in SLURM_RESERVED:
                    raise ParamError(self.name, key, f"{node!r} is a reserved word of Slurm")
        return params

    def plan(self, params: Mapping[str, Any]) -> Plan:
        commands = [shlex.join(requeue_command(params["job"]))]
        summary = f"requeue job {params['job']}"
        nodes, returned = excluded_nodes(params), excluded_nodes(params, "return_nodes")
        if nodes:
            commands.append(
                shlex.join(exclude_command(params["job"], compress_hostlist(nodes)))
                + " (merged with the job's lists)"
            )
            summary += f" and keep it off {', '.join(nodes)}"
        if returned:
            commands.append(f"ExcNodeList without {compress_hostlist(returned)} (back in service)")
            summary += f"; let it back on {', '.join(returned)}"
        return Plan(summary, "\n".join(commands))

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        job_id, nodes = params["job"], excluded_nodes(params)
        job = slurm.job_info(job_id)
        if not job.requeue:
            return Failed(reason=f"job {job_id} was submitted with --no-requeue; Slurm will not requeue it")
        notes = []
        try:
            executed.append(slurm.requeue(job_id))
        except CommandFailed as exc:
            # 22.05 says "Job is pending execution" for a pending job and for one still COMPLETING after
            # an earlier requeue: either way it is already waiting to run again.
            if "is pending execution" not in str(exc):
                raise
            notes.append(f"job {job_id} is {job.state}: already waiting to run, not requeued again")
        excluded = slurm.expand_hostlist(job.exc_nodes) if job.exc_nodes else []
        added = [n for n in nodes if n not in excluded]
        dropped = [n for n in excluded_nodes(params, "return_nodes") if n in excluded and n not in nodes]
        required = slurm.expand_hostlist(job.req_nodes) if job.req_nodes else []
        if added or dropped or set(nodes) & set(required):
            exc_nodes, req_nodes = exclusion(nodes, excluded, required, dropped)
            executed.append(slurm.update_job_exclude(job_id, exc_nodes, req_nodes))
        after = slurm.job_info(job_id)
        notes.append(f"job {job_id}: {after.state}, restarts {after.restarts}, excluded: {after.exc_nodes}")
        # What Nightshift added (not on the list before: ours from now on) and dropped (app/domain/exclusions.py).
        return Ok(
            command=executed_commands(executed),
            output=tail("".join(r.output for r in executed) + "\n".join(notes)),
            exit_code=0,
            data={**asdict(after), "added": added, "dropped": dropped},
        )


class RequeueNodeJobs(SlurmAction):
    """Requeue every job running on a node and keep each off it: for a node fault whose alert names no job (the
    GPUs carried no ``hpc_job`` label: the HPC job mapping was missing). The scheduler is asked which jobs run
    there (one ``squeue``), then each is requeued as :class:`RequeueJob` does."""

    name = "slurm.requeue_node_jobs"
    description = "Requeue the jobs running on a Slurm node (found with squeue), keeping them off it"
    params = {"node": _NODE}
    scope_keys = ("node", "partition")

    def plan(self, params: Mapping[str, Any]) -> Plan:
        node = params["node"]
        return Plan(
            f"requeue every job running on {node} and keep it off {node}",
            f"{shlex.join(node_jobs_command(node))}\n"
            f"then, for each job J it lists: scontrol requeue J; scontrol update JobId=J ExcNodeList={node} "
            "(merged with the job's lists)",
        )

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        node = params["node"]
        jobs = slurm.node_jobs(node)
        if not jobs:
            return Ok(output=f"no job runs on {node}", data={"node": node, "jobs": []})
        outcomes = [
            RequeueJob().execute(slurm, {"job": job, "exclude_nodes": node}, executed, ctx) for job in jobs
        ]
        failed = [(job, o) for job, o in zip(jobs, outcomes, strict=True) if not isinstance(o, Ok)]
        if failed:
            return Failed(
                reason="; ".join(f"job {job}: {getattr(o, 'reason', o.status)}" for job, o in failed),
                command=executed_commands(executed),
                data={"node": node, "jobs": jobs},
            )
        return Ok(
            command=executed_commands(executed),
            output=tail("\n".join(o.output for o in outcomes)),
            exit_code=0,
            data={"node": node, "jobs": jobs},
        )


class CancelJob(SlurmAction):
    """Cancel a job (``scancel``)."""

    name = "slurm.cancel_job"
    description = "Cancel a Slurm job"
    params = {"job": _JOB}
    scope_keys = ("node", "partition")

    def plan(self, params: Mapping[str, Any]) -> Plan:
        return Plan(f"cancel job {params['job']}", shlex.join(cancel_command(params["job"])))

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        executed.append(slurm.cancel(params["job"]))
        after = slurm.job_info(params["job"])
        return Ok(
            command=executed_commands(executed),
            output=tail(f"{executed[-1].output}job {params['job']}: {after.state}"),
            exit_code=0,
            data=asdict(after),
        )


class JobInfoAction(SlurmAction):
    """A job's state, nodes, restarts and log paths (read only)."""

    name = "slurm.job_info"
    description = "Show a Slurm job (state, nodes, restarts, log paths)"
    params = {"job": _JOB}
    read_only = True

    def plan(self, params: Mapping[str, Any]) -> Plan:
        return Plan(f"show job {params['job']}", shlex.join(show_job_command(params["job"])))

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        job = slurm.job_info(params["job"])
        return Ok(
            command=shlex.join(show_job_command(params["job"])),
            output=f"job {job.job_id}: {job.state} on {job.nodes or '-'} ({job.reason or 'no reason'})",
            exit_code=0,
            data=asdict(job),
        )


class JobLog(SlurmAction):
    """The last lines of a job's StdOut and StdErr files (read only).

    The paths come from ``scontrol show job`` and are chosen by the job's owner, so the files are read as the
    job's owner: ``setpriv --reuid/--regid`` with the numeric ids ``squeue`` reports (needs the SSH user to be
    root or the owner). A path pointing at a file the owner cannot read therefore yields an error, never its
    content.
    """

    name = "slurm.job_log"
    description = "Tail a Slurm job's stdout/stderr files"
    params = {
        "job": _JOB,
        "lines": Param(kind="integer", required=False, default=200, description=f"1..{MAX_TAIL_LINES}"),
    }
    read_only = True

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        if not 1 <= params["lines"] <= MAX_TAIL_LINES:
            raise ParamError(self.name, "lines", f"must be between 1 and {MAX_TAIL_LINES}")
        return params

    def plan(self, params: Mapping[str, Any]) -> Plan:
        example = shlex.join(tail_command("/STDOUT", params["lines"], (1000, 1000)))
        return Plan(
            f"tail the last {params['lines']} lines of job {params['job']}'s output files as its owner",
            f"{shlex.join(show_job_command(params['job']))}\n{example} (paths and ids from the job)",
        )

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        job_id, lines = params["job"], params["lines"]
        # The job's record and its owner's ids are independent: one round trip for both.
        record, owned = slurm.run_all([show_job_command(job_id), job_owner_command(job_id)])
        job = parse_job(slurm.checked(record).stdout)
        paths = list(dict.fromkeys(p for p in (job.stdout_path, job.stderr_path) if p))
        if not paths:
            return Failed(reason=f"job {job_id} has no StdOut/StdErr path (not a batch job?)")
        owner = parse_owner(job_id, slurm.checked(owned))
        sections, errors = [], []
        for path, result in zip(
            paths, slurm.run_all([tail_command(p, lines, owner) for p in paths]), strict=True
        ):
            try:
                text = slurm.checked(result).stdout
            except CommandFailed as exc:
                errors.append(f"{path}: {exc}")
                continue
            sections.append(text if len(paths) == 1 else f"==> {path} <==\n{text}")
        if not sections:
            return Failed(reason=f"job {job_id}: no log could be read: {'; '.join(errors)}")
        log = "\n".join(sections)
        return Ok(
            command="\n".join(shlex.join(tail_command(p, lines, owner)) for p in paths),
            output=tail("\n".join([log, *errors])),
            exit_code=0,
            data={"log": log, "paths": paths, "errors": errors},
        )


ACTIONS = (
    DrainNode(),
    ResumeNode(),
    RebootNode(),
    ValidateNode(),
    RequeueJob(),
    RequeueNodeJobs(),
    CancelJob(),
    JobInfoAction(),
    JobLog(),
)
