"""``slurm.job_stacks``: the Python stacks of every process of a hung Slurm job, for the diagnosis (read only).

One command over the SSH connection to the Slurm host: ``srun --jobid=J --overlap`` runs a fixed script once on
each node of the job's allocation (Slurm's own route to the job's nodes: no SSH keys to compute nodes needed).
On each node the script lists the job's processes (``scontrol listpids``), keeps the Python ones, reads each
one's rank from its environment (``RANK``, else ``SLURM_PROCID``) and runs ``py-spy dump`` on it under a
timeout. The dumps come back as one log with a ``==> py-spy node=N rank=R pid=P <==`` header per process, which
:mod:`app.diagnosis.stacks` reads: all ranks in one collective but one, and that one is the culprit.

Who may do this: the SSH user runs srun into the job, so it must be root or the job's owner, and py-spy needs
ptrace rights over the processes: root (CAP_SYS_PTRACE), or the owner where ``kernel.yama.ptrace_scope`` is 0.
py-spy must be installed on the compute nodes (``pip install py-spy``); ``py_spy`` names it (a path or a command
on the nodes' PATH, written out in the playbook).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.actions.base import ActionContext, Plan
from app.actions.slurm import SlurmAction
from app.clients.slurm import SlurmClient, show_job_command
from app.outcome import Failed, Ok, Outcome, tail
from app.params import ABS_PATH, SLURM_JOB_ID, Param

if TYPE_CHECKING:
    from app.clients.ssh import CommandResult

MAX_NODES = 256
MAX_PROCESSES_PER_NODE = 16  # ranks per node are 8 on most GPU nodes; the rest are launchers and helpers
DUMP_TIMEOUT_SECONDS = 10  # per process; py-spy attaches, walks and detaches in well under a second
MAX_DUMP_LINES = 200  # per process: the innermost frames are what matters
STEP_START_SECONDS = 30  # srun --immediate: the dump step starts now or not at all
# The whole command's bound: the step's start, then each node's processes one after the other (nodes in parallel).
COMMAND_TIMEOUT_SECONDS = STEP_START_SECONDS + MAX_PROCESSES_PER_NODE * DUMP_TIMEOUT_SECONDS

# Run on each node as: bash -c NODE_SCRIPT nightshift-stacks JOB PY_SPY TIMEOUT MAX_LINES MAX_PROCESSES. Constant
# text: every value reaches it as a positional argument, never as code.
NODE_SCRIPT = r"""
job=$1 spy=$2 seconds=$3 lines=$4 most=$5 own=${SLURM_STEP_ID:-none} node=${SLURMD_NODENAME:-$(hostname)} n=0
# The node name argument picks this node's slurmd where several run on one host (a test cluster).
scontrol listpids "$job" ${SLURMD_NODENAME:+"$SLURMD_NODENAME"} 2>/dev/null | while read -r pid _ step _ global; do
  case "$pid" in ''|*[!0-9]*) continue ;; esac
  [ "$step" = "$own" ] && continue
  case "$(readlink "/proc/$pid/exe" 2>/dev/null)" in *python*) ;; *) continue ;; esac
  env=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null)
  rank=$(printf '%s\n' "$env" | sed -n 's/^RANK=//p' | head -n 1)
  [ -n "$rank" ] || rank=$(printf '%s\n' "$env" | sed -n 's/^SLURM_PROCID=//p' | head -n 1)
  [ -n "$rank" ] || rank=$global
  n=$((n + 1)); [ "$n" -gt "$most" ] && break
  echo "==> py-spy node=$node rank=$rank pid=$pid <=="
  timeout "$seconds" "$spy" dump --pid "$pid" 2>&1 | head -n "$lines"
done
"""

_PY_SPY = rf"{ABS_PATH}|[A-Za-z0-9._+-]{{1,64}}"
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


def stacks_command(job_id: str, nodes: list[str], py_spy: str) -> list[str]:
    """The srun command that dumps the stacks on each of ``nodes`` (argv; values checked by the caller)."""
    return [
        "srun", f"--jobid={job_id}", "--overlap", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
        "--ntasks-per-node=1", "--label", "--kill-on-bad-exit=0", f"--immediate={STEP_START_SECONDS}",
        "bash", "-c", NODE_SCRIPT, "nightshift-stacks", job_id, py_spy, str(DUMP_TIMEOUT_SECONDS),
        str(MAX_DUMP_LINES), str(MAX_PROCESSES_PER_NODE),
    ]  # fmt: skip


def by_node(output: str) -> str:
    """``srun --label`` output (``0: line``, nodes interleaved) regrouped: each task's lines together, in task
    order, without the labels."""
    tasks: dict[int, list[str]] = {}
    for line in output.splitlines():
        if match := _LABEL.match(line):
            tasks.setdefault(int(match.group(1)), []).append(match.group(2))
    return "\n".join(line for task in sorted(tasks) for line in tasks[task])


class JobStacks(SlurmAction):
    """Dump the Python stacks of every process of a Slurm job on each of its nodes (py-spy)."""

    name = "slurm.job_stacks"
    description = "Dump the Python stacks of a Slurm job's processes on each of its nodes (py-spy via srun)"
    params = {
        "job": Param(pattern=SLURM_JOB_ID, description="Slurm job id (1234, 1234_7, 1234+1)"),
        "py_spy": Param(
            pattern=_PY_SPY,
            required=False,
            default="py-spy",
            literal=True,
            description="py-spy on the compute nodes: a path or a command on their PATH",
        ),
    }
    read_only = True

    def plan(self, params: Mapping[str, Any]) -> Plan:
        argv = stacks_command(params["job"], ["NODES"], params["py_spy"])
        return Plan(
            f"dump the Python stacks of job {params['job']}'s processes on each of its nodes with py-spy",
            f"{shlex.join(show_job_command(params['job']))}\n{shlex.join(argv)} (nodes from the job)",
        )

    def execute(
        self, slurm: SlurmClient, params: Mapping[str, Any], executed: list[CommandResult], ctx: ActionContext
    ) -> Outcome:
        job_id = params["job"]
        job = slurm.job_info(job_id)
        if job.state != "RUNNING" or not job.nodes:
            return Failed(reason=f"job {job_id} is {job.state} on {job.nodes or 'no nodes'}: nothing to dump")
        nodes = slurm.expand_hostlist(job.nodes)[:MAX_NODES]
        argv = stacks_command(job_id, nodes, params["py_spy"])
        # No exit-status check: a node without py-spy must not hide the other nodes' dumps.
        result = slurm.runner.run(argv, timeout=COMMAND_TIMEOUT_SECONDS)
        executed.append(result)
        log = by_node(result.stdout)
        dumped = log.count("\nProcess ") + log.startswith("Process ")
        if not dumped:
            return Failed(
                reason=f"job {job_id}: no Python stack could be dumped on {', '.join(nodes)} "
                f"(exit {result.exit_code}): {tail(result.output, 800)}",
                command=shlex.join(argv),
            )
        return Ok(
            command=shlex.join(argv),
            output=tail(log),
            exit_code=result.exit_code,
            data={"log": log, "nodes": nodes, "processes": dumped},
        )


ACTIONS = (JobStacks(),)
