"""``slurm.job_stacks``: the Python stacks and the Flight Recorders of every process of a hung Slurm job, for the
diagnosis (read only).

One command over the SSH connection to the Slurm host: ``srun --jobid=J --overlap`` runs a fixed script once on
each node of the job's allocation (Slurm's own route to the job's nodes: no SSH keys to compute nodes needed).
On each node the script lists the job's processes (``scontrol listpids``), keeps the Python ones, reads each
one's rank from its environment (``RANK``, else ``SLURM_PROCID``) and runs ``py-spy dump`` on it under a
timeout. The dumps come back as one log with a ``==> py-spy node=N rank=R pid=P <==`` header per process, which
:mod:`app.domain.diagnosis.stacks` reads: all ranks in one collective but one, and that one is the culprit.

A PyTorch rank (``RANK`` in its environment) that serves its debug socket (``nightshift_progress.torch_debug``:
PyTorch's worker server at ``torch-rank-<RANK>.sock`` in the progress library's node-local exchange directory,
``NIGHTSHIFT_PROGRESS_DIR`` else ``/dev/shm/nightshift-progress-<uid>-<SLURM_JOB_ID>``) is also asked for its
Flight Recorder (``curl --unix-socket ... -X POST /handler/fr_trace_json``, under the same timeout, at most
:data:`MAX_FLIGHT_BYTES`), under a ``==> flight-recorder rank=R node=N pid=P <==`` header that
:mod:`app.domain.diagnosis.flight` reads: the ranks behind the collective the others wait in, or that do not answer at
all (stopped), are the culprits. The worker server answers while the rank's training thread is blocked in the
collective, which py-spy shows only as ``_engine_run_backward``.

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
from app.domain.outcome import Failed, Ok, Outcome, tail
from app.domain.params import ABS_PATH, SLURM_JOB_ID, Param

if TYPE_CHECKING:
    from app.clients.ssh import CommandResult

MAX_NODES = 256
MAX_PROCESSES_PER_NODE = 16  # ranks per node are 8 on most GPU nodes; the rest are launchers and helpers
DUMP_TIMEOUT_SECONDS = 10  # per process; py-spy attaches, walks and detaches in well under a second
MAX_DUMP_LINES = 200  # per process: the innermost frames are what matters
STEP_START_SECONDS = 30  # srun --immediate: the dump step starts now or not at all
# The whole command's bound: the step's start, then each node's processes one after the other (nodes in parallel),
# each a py-spy dump and a Flight Recorder read.
COMMAND_TIMEOUT_SECONDS = STEP_START_SECONDS + MAX_PROCESSES_PER_NODE * 2 * DUMP_TIMEOUT_SECONDS

MAX_FLIGHT_BYTES = (
    512 * 1024
)  # per rank: TORCH_FR_BUFFER_SIZE=1000 (about 500 KB of JSON) fits; a longer one is cut
# Shell functions shared by the Slurm node script and the Kubernetes pod script (app/actions/kubernetes_exec.py);
# they read the caller's variables node, spy, seconds and lines. python_pid P: P runs a Python interpreter.
# env_of P NAME: that variable of P's environment. dump_one P RANK: the header, then P's stack.
DUMP_FUNCTIONS = r"""
python_pid() { case "$(readlink "/proc/$1/exe" 2>/dev/null)" in *python*) return 0 ;; esac; return 1; }
env_of() { tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=//p" | head -n 1; }
dump_one() {
  echo "==> py-spy node=$node rank=$2 pid=$1 <=="
  timeout "$seconds" "$spy" dump --pid "$1" 2>&1 | head -n "$lines"
}
"""
# Run on each node as: bash -c NODE_SCRIPT nightshift-stacks JOB PY_SPY TIMEOUT MAX_LINES MAX_PROCESSES MAX_BYTES.
# Constant text: every value reaches it as a positional argument, never as code.
NODE_SCRIPT = (
    DUMP_FUNCTIONS
    + r"""
job=$1 spy=$2 seconds=$3 lines=$4 most=$5 bytes=$6 own=${SLURM_STEP_ID:-none} n=0
node=${SLURMD_NODENAME:-$(hostname)}
var() { printf '%s\n' "$env" | sed -n "s/^$1=//p" | head -n 1; }
# The node name argument picks this node's slurmd where several run on one host (a test cluster).
scontrol listpids "$job" ${SLURMD_NODENAME:+"$SLURMD_NODENAME"} 2>/dev/null | while read -r pid _ step _ global; do
  case "$pid" in ''|*[!0-9]*) continue ;; esac
  [ "$step" = "$own" ] && continue
  python_pid "$pid" || continue
  env=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null)
  worker=$(var RANK) rank=$(var RANK)
  [ -n "$rank" ] || rank=$(var SLURM_PROCID)
  [ -n "$rank" ] || rank=$global
  n=$((n + 1)); [ "$n" -gt "$most" ] && break
  dump_one "$pid" "$rank"
  # A PyTorch rank's debug socket (nightshift_progress.torch_debug): its Flight Recorder.
  case "$worker" in ''|*[!0-9]*) continue ;; esac
  dir=$(var NIGHTSHIFT_PROGRESS_DIR)
  if [ -z "$dir" ]; then
    base=/dev/shm; [ -d "$base" ] || base=$(var TMPDIR); base=${base:-/tmp}
    dir="$base/nightshift-progress-$(stat -c %u "/proc/$pid")-$(var SLURM_JOB_ID | tr -c 'A-Za-z0-9_.\n-' _)"
  fi
  sock="$dir/torch-rank-$worker.sock"
  [ -S "$sock" ] && command -v curl >/dev/null 2>&1 || continue
  echo "==> flight-recorder rank=$worker node=$node pid=$pid <=="
  timeout "$seconds" curl -sS --max-time "$seconds" --unix-socket "$sock" -X POST \
    http://localhost/handler/fr_trace_json 2>&1 | head -c "$bytes"
  echo
done
"""
)

# Where py-spy is, where the job runs (the compute nodes, the training image): written out in the playbook.
PY_SPY = Param(
    pattern=rf"{ABS_PATH}|[A-Za-z0-9._+-]{{1,64}}",
    required=False,
    default="py-spy",
    literal=True,
    description="py-spy where the job runs (compute nodes, training image): a path or a command on its PATH",
)
# A Flight Recorder header followed by a JSON document (a rank that did not answer has an empty body).
_FLIGHT_DUMP = re.compile(r"^==> flight-recorder rank=\d+[^\n]*<==\n\{", re.MULTILINE)
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


def stacks_command(job_id: str, nodes: list[str], py_spy: str) -> list[str]:
    """The srun command that dumps the stacks on each of ``nodes`` (argv; values checked by the caller)."""
    return [
        "srun", f"--jobid={job_id}", "--overlap", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
        "--ntasks-per-node=1", "--label", "--kill-on-bad-exit=0", f"--immediate={STEP_START_SECONDS}",
        "bash", "-c", NODE_SCRIPT, "nightshift-stacks", job_id, py_spy, str(DUMP_TIMEOUT_SECONDS),
        str(MAX_DUMP_LINES), str(MAX_PROCESSES_PER_NODE), str(MAX_FLIGHT_BYTES),
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
    description = (
        "Dump a Slurm job's Python stacks (py-spy) and Flight Recorders (debug socket) on each of its nodes"
    )
    params = {
        "job": Param(pattern=SLURM_JOB_ID, description="Slurm job id (1234, 1234_7, 1234+1)"),
        "py_spy": PY_SPY,
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
        recorded = len(_FLIGHT_DUMP.findall(log))
        if not dumped and not recorded:
            return Failed(
                reason=f"job {job_id}: no Python stack or Flight Recorder could be dumped on {', '.join(nodes)} "
                f"(exit {result.exit_code}): {tail(result.output, 800)}",
                command=shlex.join(argv),
            )
        return Ok(
            command=shlex.join(argv),
            output=tail(log),
            exit_code=result.exit_code,
            data={"log": log, "nodes": nodes, "processes": dumped, "flight_recorders": recorded},
        )


ACTIONS = (JobStacks(),)
