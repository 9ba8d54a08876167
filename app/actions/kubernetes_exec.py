"""Kubernetes actions that run a command in a training job's pods (``pods/exec``): the Python stacks of a hung job
(``kubernetes.job_stacks``, the twin of ``slurm.job_stacks``) and the checkpoint request of a planned swap or a
straggler's restart (``kubernetes.request_checkpoint``, the twin of ``slurm.request_checkpoint``).

The pods are the job's running ones (its name's labels: :meth:`app.clients.kube.KubeClient.job_pods`), each in its
default container (the ``kubectl.kubernetes.io/default-container`` annotation, else the first). The commands are
fixed text; every value reaches them as an argument, never as shell code. The execs run in parallel
(:data:`PARALLEL_EXECS` at a time), each bounded. ``pods/exec`` is granted only where the chart's ``rbac.podExec``
is set (docs/kubernetes.md); without it the outcome is a credential error and a person is told.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from app.actions.base import ActionContext, Plan
from app.actions.kubernetes import JOB_KINDS, NAMESPACE, KubernetesAction
from app.actions.stacks import (
    DUMP_FUNCTIONS,
    DUMP_TIMEOUT_SECONDS,
    MAX_DUMP_LINES,
    MAX_PROCESSES_PER_NODE,
    PY_SPY,
)
from app.domain import errors
from app.domain.outcome import Failed, Ok, Outcome, tail
from app.domain.params import K8S_NAME, Param

if TYPE_CHECKING:
    from app.clients.kube import ExecResult, KubeClient

MAX_PODS = 256
PARALLEL_EXECS = 16
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
# The annotation by which a training job announces how it takes a checkpoint request (the progress library's
# contract, progress/src/nightshift_progress/checkpoint_request.py): "file" (a touch of the request file its
# containers name in NIGHTSHIFT_CHECKPOINT_REQUEST_FILE) or a signal its main process (PID 1) handles: USR1, USR2.
CHECKPOINT_REQUEST = "nightshift.io/checkpoint-request"
REQUEST_SIGNALS = ("USR1", "USR2")
REQUEST_TIMEOUT_SECONDS = 30  # a touch or a kill
# Each pod's processes are dumped one after the other (pods in parallel): the bound of one pod's exec.
STACKS_TIMEOUT_SECONDS = 10 + MAX_PROCESSES_PER_NODE * DUMP_TIMEOUT_SECONDS

# Run in each pod as: sh -c POD_SCRIPT nightshift-stacks NODE PY_SPY TIMEOUT MAX_LINES MAX_PROCESSES: every Python
# process of the container (its PID namespace: the pod's, or the container's), its rank from RANK.
POD_SCRIPT = (
    DUMP_FUNCTIONS
    + r"""
node=$1 spy=$2 seconds=$3 lines=$4 most=$5 n=0
for dir in /proc/[0-9]*; do
  pid=${dir#/proc/}
  [ "$pid" = "$$" ] && continue
  python_pid "$pid" || continue
  n=$((n + 1)); [ "$n" -gt "$most" ] && break
  dump_one "$pid" "$(env_of "$pid" RANK)"
done
"""
)
# Signal the container's main process (PID 1) with $1: the shell's own kill, which every image has.
SIGNAL_MAIN = 'kill -s "$1" 1'
# Touch the request file the container names (the progress library polls it), creating its directory.
TOUCH_REQUEST = (
    'f="${NIGHTSHIFT_CHECKPOINT_REQUEST_FILE:?is not set in this container}"; '
    'mkdir -p -- "$(dirname -- "$f")" && touch -- "$f"'
)

JOB = Param(
    pattern=K8S_NAME, description="the training job's name (its pods carry it in their job-name label)"
)


def running_pods(kube: KubeClient, namespace: str, job: str) -> Sequence[Mapping[str, Any]]:
    """The job's Running pods bound to a node, by name, at most :data:`MAX_PODS`."""
    pods = [
        p
        for p in kube.job_pods(namespace, job)
        if (p.get("status") or {}).get("phase") == "Running" and (p.get("spec") or {}).get("nodeName")
    ]
    return sorted(pods, key=lambda p: p["metadata"]["name"])[:MAX_PODS]


def default_container(pod: Mapping[str, Any]) -> str:
    """The container ``kubectl exec`` would pick: the annotated default, else the first."""
    named = str(((pod.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CONTAINER, ""))
    containers = [str(c["name"]) for c in (pod.get("spec") or {}).get("containers") or []]
    return named if named in containers else containers[0]


def exec_in_job(
    kube: KubeClient,
    namespace: str,
    job: str,
    argv_of: Callable[[Mapping[str, Any]], list[str]],
    timeout: float,
) -> list[tuple[str, ExecResult | errors.BackendError]]:
    """Run ``argv_of(pod)`` in the default container of each of the job's running pods, :data:`PARALLEL_EXECS` at a
    time: (pod name, its result or the error that kept it from running), by pod name; [] when none runs. pods/exec
    refused (not granted here) raises CredentialRejected: the step's outcome, not one pod's problem."""
    pods = running_pods(kube, namespace, job)

    def one(pod: Mapping[str, Any]) -> ExecResult | errors.BackendError:
        try:
            return kube.exec(
                namespace, pod["metadata"]["name"], default_container(pod), argv_of(pod), timeout
            )
        except errors.BackendError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=PARALLEL_EXECS, thread_name_prefix="kube-exec") as pool:
        results = [(p["metadata"]["name"], r) for p, r in zip(pods, pool.map(one, pods), strict=True)]
    refused = next((r for _, r in results if isinstance(r, errors.CredentialRejected)), None)
    if refused is not None:
        raise refused
    return results


class JobStacks(KubernetesAction):
    """Dump the Python stacks of every process of a Kubernetes training job's running pods (py-spy in the
    training image), for the diagnosis: the log :mod:`app.domain.diagnosis.stacks` reads, one header a process."""

    name = "kubernetes.job_stacks"
    description = (
        "Dump the Python stacks of a Kubernetes job's processes in its running pods (py-spy, pods/exec)"
    )
    params = {
        "namespace": NAMESPACE,
        "job": JOB,
        "py_spy": PY_SPY,
    }
    read_only = True
    scope_keys = ("namespace",)

    def plan(self, params: Mapping[str, Any]) -> Plan:
        argv = pod_stacks_command("NODE", params["py_spy"])
        return Plan(
            f"dump the Python stacks of job {params['namespace']}/{params['job']}'s processes in each of its "
            "running pods with py-spy",
            f"GET pods of {params['job']}; for each: POST /api/v1/namespaces/{params['namespace']}/pods/POD/exec "
            f"{shlex.join(argv[:2])} ... {shlex.join(argv[2:])}",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        namespace, job = params["namespace"], params["job"]
        results = exec_in_job(
            kube,
            namespace,
            job,
            lambda pod: pod_stacks_command(pod["spec"]["nodeName"], params["py_spy"]),
            STACKS_TIMEOUT_SECONDS,
        )
        if not results:
            return Failed(
                command=command, reason=f"job {namespace}/{job} has no running pod: nothing to dump"
            )
        log = "\n".join(
            r.stdout.rstrip("\n") for _, r in results if not isinstance(r, Exception) and r.stdout
        )
        dumped = log.count("\nProcess ") + log.startswith("Process ")
        problems = [_problem(name, r) for name, r in results if _problem(name, r)]
        if not dumped:
            return Failed(
                command=command,
                reason=f"job {namespace}/{job}: no Python stack could be dumped in {len(results)} pod(s): "
                + tail("; ".join(problems) or log, 800),
            )
        return Ok(
            command=command,
            output=tail(log),
            data={
                "log": log,
                "pods": [name for name, _ in results],
                "processes": dumped,
                "problems": problems,
            },
        )


def pod_stacks_command(node: str, py_spy: str) -> list[str]:
    """The exec's argv: the pod script with its arguments (values checked by the caller)."""
    return ["sh", "-c", POD_SCRIPT, "nightshift-stacks", node, py_spy, str(DUMP_TIMEOUT_SECONDS),
            str(MAX_DUMP_LINES), str(MAX_PROCESSES_PER_NODE)]  # fmt: skip


def _problem(pod: str, result: ExecResult | errors.BackendError) -> str:
    """Why an exec did not run to a zero exit, or ""."""
    if isinstance(result, errors.BackendError):
        return f"{pod}: {result}"
    if result.error:
        return f"{pod}: {result.error}"
    if result.exit_code is None:
        return f"{pod}: did not finish in time"
    if result.exit_code != 0:
        return f"{pod}: exit {result.exit_code}: {tail(result.stderr or result.stdout, 200)}"
    return ""


class RequestCheckpoint(KubernetesAction):
    """Ask a running Kubernetes training job to checkpoint now, the way it announces on its object
    (``nightshift.io/checkpoint-request``): ``file`` touches ``$NIGHTSHIFT_CHECKPOINT_REQUEST_FILE`` in each of its
    running pods; ``USR1``/``USR2`` sends that signal to each pod's main process (PID 1 of its container). A job
    that announces nothing is not asked (a signal's default action would kill a process that does not handle it):
    Failed. Ok only when every running pod was asked; the job runs on either way."""

    name = "kubernetes.request_checkpoint"
    description = "Ask a running Kubernetes job to checkpoint now, as its annotation says (pods/exec)"
    params = {
        "namespace": NAMESPACE,
        "name": JOB,
        "kind": Param(choices=JOB_KINDS, description="Job | PyTorchJob | JobSet | TrainJob"),
    }
    scope_keys = ("namespace",)

    def plan(self, params: Mapping[str, Any]) -> Plan:
        ns, name, kind = params["namespace"], params["name"], params["kind"]
        return Plan(
            f"ask {kind} {ns}/{name} to checkpoint now, as its annotation {CHECKPOINT_REQUEST} says (file: touch "
            "the request file in each running pod; USR1/USR2: signal each pod's main process)",
            f"GET {kind} {ns}/{name}; for each running pod: POST /api/v1/namespaces/{ns}/pods/POD/exec "
            f"sh -c {shlex.quote(TOUCH_REQUEST)} | sh -c {shlex.quote(SIGNAL_MAIN)} nightshift-request <signal>",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        ns, name, kind = params["namespace"], params["name"], params["kind"]
        job = kube.get_workload(kind, ns, name)
        how = ((job.get("metadata") or {}).get("annotations") or {}).get(CHECKPOINT_REQUEST, "")
        if how == "file":
            argv = ["sh", "-c", TOUCH_REQUEST]
        elif how in REQUEST_SIGNALS:
            argv = ["sh", "-c", SIGNAL_MAIN, "nightshift-request", how]
        else:
            return Failed(
                command=command,
                reason=f"{kind} {ns}/{name} announces no checkpoint request ({CHECKPOINT_REQUEST}: file, USR1 or "
                f"USR2; found {how[:40]!r}): not asked, as a process that does not handle the signal is killed by it",
            )
        requested_at = ctx.clock.now().timestamp()  # before the first exec: a rank may answer at once
        results = exec_in_job(kube, ns, name, lambda pod: argv, REQUEST_TIMEOUT_SECONDS)
        if not results:
            return Failed(command=command, reason=f"{kind} {ns}/{name} has no running pod to ask")
        asked = [pod for pod, r in results if not _problem(pod, r)]
        problems = [_problem(pod, r) for pod, r in results if _problem(pod, r)]
        data = {"how": how, "asked": asked, "requested_at": requested_at}
        if problems:
            return Failed(
                command=command,
                reason=f"{kind} {ns}/{name}: {len(problems)} of {len(results)} pod(s) not asked: "
                + tail("; ".join(problems), 800),
                data={**data, "problems": problems},
            )
        return Ok(command=command, output=f"{len(asked)} pod(s) asked ({how}): {', '.join(asked)}", data=data)


ACTIONS = (JobStacks(), RequestCheckpoint())
