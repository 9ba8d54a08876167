"""Kubernetes actions: cordon/uncordon/taint nodes, evict/delete pods, restart training jobs, read pod logs.

Every API call goes through :class:`app.clients.kube.KubeClient` (``ctx.clients.kube``); its errors become
outcomes here with :func:`app.domain.outcome.outcome_from_error`. Ownership is recorded on the objects themselves
(annotations under ``nightshift.io/``), so a later step, another replica or a human can see what Nightshift
did and undo only that.
What "restart" means for each job kind is documented in docs/kubernetes.md.
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from app.actions.base import Action, ActionContext, Plan
from app.actions.slurm import VALIDATION_PARAMS, check_validation
from app.domain import errors
from app.domain.job_phase import JobPhase, finished_phase
from app.domain.outcome import Ambiguous, Failed, Ok, Outcome, Retry, outcome_from_error, tail
from app.domain.params import (
    K8S_KEY,
    K8S_LABEL_VALUE,
    K8S_NAME,
    K8S_NAMESPACE,
    K8S_NODE_LIST,
    K8S_NODE_NAME,
    NODE_LIST_CHARS,
    Param,
)
from app.domain.schedulers import OUR_MARK
from app.domain.states import LedgerKind

if TYPE_CHECKING:
    from app.clients.kube import KubeClient
    from app.config import RepairSettings

OWNER = OUR_MARK  # the value of our ownership annotations
CORDONED_BY = "nightshift.io/cordoned-by"
CORDONED_AT = "nightshift.io/cordoned-at"
SUSPENDED_BY = "nightshift.io/suspended-by"
RESTARTED_AT = "nightshift.io/restarted-at"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
JOB_KINDS = ("Job", "PyTorchJob", "JobSet", "TrainJob")
HOSTNAME_LABEL = (
    "kubernetes.io/hostname"  # the well-known node label a NotIn affinity keeps pods off nodes by
)
# Where each suspendable kind keeps its suspend flag.
SUSPEND_PATHS: dict[str, tuple[str, ...]] = {
    "PyTorchJob": ("spec", "runPolicy", "suspend"),
    "JobSet": ("spec", "suspend"),
    "TrainJob": ("spec", "suspend"),
}
# Labels the apiserver derives from a Job's uid and name when it generates the selector; a recreated Job must
# not carry the old ones, or validation rejects the selector as "not auto-generated".
GENERATED_JOB_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)
MAX_LOG_LINES = 5000
VALIDATION_COMPONENT = "node-validation"  # app.kubernetes.io/component of the validation pods
VALIDATES = "nightshift.io/validates-node"

NODE = Param(pattern=K8S_NODE_NAME, description="Kubernetes node name (DNS-1123 subdomain)")
NAMESPACE = Param(pattern=K8S_NAMESPACE, description="namespace")
POD = Param(pattern=K8S_NAME, description="pod name")
GRACE = Param(
    kind="integer", required=False, default=30, description="termination grace period, seconds (>= 0)"
)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesAction(Action):
    """Runs :meth:`act` with the Kubernetes client; a backend error becomes the outcome its type implies."""

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        for name, spec in self.params.items():
            if spec.kind == "integer" and name in params and params[name] < 0:
                raise errors.ParamError(self.name, name, f"must be >= 0, got {params[name]}")
        return params

    def run(self, params: Mapping[str, Any], ctx: ActionContext) -> Outcome:
        command = self.plan(params).command
        try:
            return self.act(params, ctx.clients.kube, ctx, command)
        except errors.BackendError as exc:
            return outcome_from_error(exc, command=command)

    @abstractmethod
    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        """Do the work; raise :mod:`app.domain.errors` backend errors, return anything else as an outcome."""


class CordonNode(KubernetesAction):
    name = "kubernetes.cordon_node"
    description = (
        "Mark a node unschedulable and record that Nightshift did it (annotation nightshift.io/cordoned-by)."
    )
    params = {"node": NODE}
    scope_keys = ("node",)
    takes_out = True

    def plan(self, params: Mapping[str, Any]) -> Plan:
        node = params["node"]
        return Plan(
            summary=f"cordon node {node} (unless already cordoned) and annotate {CORDONED_BY}={OWNER}",
            command=f"PATCH /api/v1/nodes/{node} spec.unschedulable=true "
            f"metadata.annotations.{CORDONED_BY}={OWNER}",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        node = params["node"]
        changed = kube.cordon(node, {CORDONED_BY: OWNER, CORDONED_AT: _stamp(ctx.clock.now())})
        if changed:
            owner = OWNER
            message = f"node {node} cordoned"
        else:
            owner = (kube.get_node(node)["metadata"].get("annotations") or {}).get(CORDONED_BY) or "unknown"
            message = f"node {node} was already cordoned (by {owner}); left as it was"
        # What still runs there: the next steps (evict, restart) act on it.
        pods = sorted(
            f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in kube.list_pods_on_node(node)
        )
        return Ok(
            command=command,
            output=f"{message}; {len(pods)} pod(s) on it",
            data={"node": node, "changed": changed, "cordoned_by": owner, "pods": pods},
        )


class UncordonNode(KubernetesAction):
    name = "kubernetes.uncordon_node"
    description = (
        "Make a node schedulable again, only if Nightshift cordoned it; removes the ownership annotations."
    )
    params = {"node": NODE}
    scope_keys = ("node",)
    return_to_service = True

    def plan(self, params: Mapping[str, Any]) -> Plan:
        node = params["node"]
        return Plan(
            summary=f"uncordon node {node} if it carries {CORDONED_BY}={OWNER}",
            command=f"PATCH /api/v1/nodes/{node} spec.unschedulable=false (if {CORDONED_BY}={OWNER})",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        node = params["node"]
        if kube.uncordon(node, only_if={CORDONED_BY: OWNER}, drop_annotations=(CORDONED_BY, CORDONED_AT)):
            return Ok(command=command, output=f"node {node} uncordoned", data={"node": node, "changed": True})
        # Not ours (someone else cordoned it, or nobody): whoever did it decides when it comes back.
        return Ok(
            command=command,
            output=f"node {node} not uncordoned: it does not carry {CORDONED_BY}={OWNER}",
            data={"node": node, "changed": False},
        )


class TaintNode(KubernetesAction):
    name = "kubernetes.taint_node"
    description = "Add a taint to a node, replacing any taint with the same key."
    params = {
        "node": NODE,
        "key": Param(pattern=K8S_KEY, description="taint key, e.g. nightshift.io/gpu-fault"),
        "value": Param(pattern=K8S_LABEL_VALUE, required=False, default="", description="taint value"),
        "effect": Param(choices=TAINT_EFFECTS, description="NoSchedule | PreferNoSchedule | NoExecute"),
    }
    scope_keys = ("node",)

    def plan(self, params: Mapping[str, Any]) -> Plan:
        taint = f"{params['key']}={params['value']}:{params['effect']}"
        return Plan(
            summary=f"taint node {params['node']} with {taint}",
            command=f"PATCH /api/v1/nodes/{params['node']} spec.taints += {taint} "
            f"(replacing key {params['key']})",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        changed = kube.taint(params["node"], params["key"], params["value"], params["effect"])
        state = "tainted" if changed else "already carried the taint"
        return Ok(
            command=command,
            output=f"node {params['node']} {state} {params['key']}={params['value']}:{params['effect']}",
            data={"node": params["node"], "changed": changed},
        )


class EvictPod(KubernetesAction):
    name = "kubernetes.evict_pod"
    description = (
        "Evict a pod through the Eviction API (honours PodDisruptionBudgets: refused now means retry later)."
    )
    params = {"namespace": NAMESPACE, "pod": POD, "grace_seconds": GRACE}
    scope_keys = ("namespace",)

    def plan(self, params: Mapping[str, Any]) -> Plan:
        ns, pod = params["namespace"], params["pod"]
        return Plan(
            summary=f"evict pod {ns}/{pod} (grace {params['grace_seconds']}s)",
            command=f"POST /api/v1/namespaces/{ns}/pods/{pod}/eviction "
            f"gracePeriodSeconds={params['grace_seconds']}",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        # A 429 (PodDisruptionBudget) is RateLimited, which outcome_from_error turns into Retry(after=...).
        kube.evict(params["namespace"], params["pod"], params["grace_seconds"])
        return Ok(command=command, output=f"pod {params['namespace']}/{params['pod']} evicted")


class DeletePod(KubernetesAction):
    name = "kubernetes.delete_pod"
    description = "Delete a pod directly (bypasses PodDisruptionBudgets)."
    params = {"namespace": NAMESPACE, "pod": POD, "grace_seconds": GRACE}
    scope_keys = ("namespace",)

    def plan(self, params: Mapping[str, Any]) -> Plan:
        ns, pod = params["namespace"], params["pod"]
        return Plan(
            summary=f"delete pod {ns}/{pod} (grace {params['grace_seconds']}s)",
            command=f"DELETE /api/v1/namespaces/{ns}/pods/{pod}?gracePeriodSeconds={params['grace_seconds']}",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        kube.delete_pod(params["namespace"], params["pod"], params["grace_seconds"])
        return Ok(command=command, output=f"pod {params['namespace']}/{params['pod']} deleted")


class PodLogs(KubernetesAction):
    name = "kubernetes.pod_logs"
    description = "Read the last lines of a pod's container log (through the apiserver)."
    params = {
        "namespace": NAMESPACE,
        "pod": POD,
        "container": Param(pattern=K8S_NAME, required=False, description="container (default: the only one)"),
        "lines": Param(
            kind="integer", required=False, default=200, description=f"lines, at most {MAX_LOG_LINES}"
        ),
    }
    read_only = True
    scope_keys = ("namespace",)

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        if params["lines"] > MAX_LOG_LINES:
            raise errors.ParamError(self.name, "lines", f"at most {MAX_LOG_LINES}, got {params['lines']}")
        return params

    def plan(self, params: Mapping[str, Any]) -> Plan:
        ns, pod, container = params["namespace"], params["pod"], params.get("container")
        query = f"tailLines={params['lines']}" + (f"&container={container}" if container else "")
        return Plan(
            summary=f"read the last {params['lines']} log lines of {ns}/{pod}"
            + (f" [{container}]" if container else ""),
            command=f"GET /api/v1/namespaces/{ns}/pods/{pod}/log?{query}",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        text = kube.pod_logs(params["namespace"], params["pod"], params.get("container"), params["lines"])
        return Ok(command=command, output=tail(text), data={"log": text})


class RestartJob(KubernetesAction):
    """Restart a whole training job. Job: delete (propagation Background) and recreate from its own spec.
    PyTorchJob / JobSet / TrainJob: suspend, wait until the operator reports ``Suspended`` (it has deleted the
    pods), then resume (it creates them again). A job whose status says it failed (its finished condition,
    :data:`app.domain.job_phase.FINISHED_CONDITIONS`) is recreated like a Job whatever its kind: its operator acts on
    no suspend once it has finished. A job that succeeded is not restarted.

    The suspend is recorded with ``nightshift.io/suspended-by``, so a run interrupted between suspend and
    resume is completed by the next run instead of being mistaken for someone else's suspension. A TrainJob's pod
    templates live in its TrainingRuntime, out of reach of an exclusion: its culprits must be cordoned.
    """

    name = "kubernetes.restart_job"
    description = "Restart a Job, PyTorchJob or JobSet (all its pods are recreated); see docs/kubernetes.md."
    params = {
        "namespace": NAMESPACE,
        "name": Param(pattern=K8S_NAME, description="job name"),
        "kind": Param(choices=JOB_KINDS, description="Job | PyTorchJob | JobSet | TrainJob"),
        "exclude_nodes": Param(
            pattern=K8S_NODE_LIST,
            max_length=NODE_LIST_CHARS,
            required=False,
            description="nodes its pods must not run on, comma-separated (a required node affinity NotIn)",
        ),
        "return_nodes": Param(
            pattern=K8S_NODE_LIST,
            max_length=NODE_LIST_CHARS,
            required=False,
            description="nodes Nightshift kept its pods off that are back in service: dropped from the NotIn "
            '("{{ incident.returned }}"; never a node someone else excluded)',
        ),
    }
    scope_keys = ("namespace",)

    def __init__(self, operator_timeout_seconds: float = 60.0, poll_seconds: float = 1.0):
        # How long the operator may take to act on a suspend (or the Job to disappear) before we stop waiting.
        self.operator_timeout_seconds = operator_timeout_seconds
        self.poll_seconds = poll_seconds

    def plan(self, params: Mapping[str, Any]) -> Plan:
        ns, name, kind = params["namespace"], params["name"], params["kind"]
        nodes, returned = _node_list(params), _node_list(params, "return_nodes")
        off = f", its pods kept off {', '.join(nodes)} (node affinity NotIn)" if nodes else ""
        off += f", let back on {', '.join(returned)}" if returned else ""
        recreate = f"DELETE {kind} {ns}/{name} (uid precondition); POST {kind} {ns}/{name} from its spec"
        if kind == "Job":
            return Plan(
                summary=f"restart Job {ns}/{name}: delete it (propagation Background) and recreate it "
                f"from its spec{off}",
                command=recreate,
            )
        field = ".".join(SUSPEND_PATHS[kind][1:])
        return Plan(
            summary=f"restart {kind} {ns}/{name}: set {field}=true, wait for the operator to suspend it, "
            f"then set {field}=false{off}; if it has failed, recreate it from its spec instead",
            command=f"PATCH {kind} {ns}/{name} {field}=true (merge patch, resourceVersion precondition); "
            f"wait for condition Suspended=True; PATCH {field}=false | if failed: {recreate}",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        nodes = _node_list(params)
        kind, ns, name = params["kind"], params["namespace"], params["name"]
        current = kube.get_workload(kind, ns, name)
        finished = finished_phase(kind, current)
        if finished is not None and finished[0] is JobPhase.COMPLETED:
            return Failed(
                command=command, reason=f"{kind} {ns}/{name} has finished ({finished[1]}): not restarted"
            )
        if kind == "TrainJob" and nodes:
            uncordoned = [n for n in nodes if not (kube.get_node(n).get("spec") or {}).get("unschedulable")]
            if uncordoned:
                return Failed(
                    command=command,
                    reason=f"TrainJob {ns}/{name}: its pod templates are in its TrainingRuntime, so only a cordon "
                    f"keeps its pods off a node, and {', '.join(uncordoned)} is not cordoned: not restarted",
                )
        before = set(not_in_values(kind, current["spec"]))
        change = Exclusion(
            tuple(nodes),
            tuple(n for n in _node_list(params, "return_nodes") if n in before and n not in nodes),
            tuple(n for n in nodes if n not in before) if kind != "TrainJob" else (),
        )
        if kind == "Job" or finished is not None:
            if finished is not None:
                ctx.record(
                    LedgerKind.JOB_RECREATED,
                    f"{kind} {ns}/{name} has {finished[1]}: recreated, not resumed",
                    {},
                )
            outcome = self._recreate(kind, current, kube, ctx, command, change)
        else:
            outcome = self._suspend_and_resume(kind, ns, name, kube, ctx, command, change)
        if isinstance(
            outcome, Ok
        ):  # what Nightshift added (not there before: ours) and dropped (app/domain/exclusions.py)
            added, dropped = list(change.added), list(change.dropped)
            return replace(outcome, data={**outcome.data, "added": added, "dropped": dropped})
        return outcome

    def _suspend_and_resume(
        self,
        kind: str,
        ns: str,
        name: str,
        kube: KubeClient,
        ctx: ActionContext,
        command: str,
        change: Exclusion,
    ) -> Outcome:
        path = SUSPEND_PATHS[kind]
        restarted_at = _stamp(ctx.clock.now())
        seen: list[Mapping[str, Any]] = []

        def suspend(current: Mapping[str, Any]) -> dict[str, Any] | None:
            seen.append(current)
            if _suspended(current, path):
                return None
            annotations = {SUSPENDED_BY: OWNER, RESTARTED_AT: restarted_at}
            patch = {"metadata": {"annotations": annotations}, **_nested_patch(path, True)}
            if change.nodes or change.dropped:  # the pods the operator creates on resume: off these nodes
                patch["spec"] = {
                    **patch.get("spec", {}),
                    **excluded_templates(kind, current["spec"], change.nodes, change.dropped),
                }
            return patch

        if kube.update_workload(kind, ns, name, suspend):
            ctx.record(
                LedgerKind.JOB_SUSPENDED, f"{kind} {ns}/{name} suspended", {"restarted_at": restarted_at}
            )
        elif (seen[-1]["metadata"].get("annotations") or {}).get(SUSPENDED_BY) != OWNER:
            return Failed(
                command=command,
                reason=f"{kind} {ns}/{name} is suspended by someone else; restarting would resume it",
            )
        else:
            ctx.record(
                LedgerKind.JOB_RESUMED,
                f"{kind} {ns}/{name} was left suspended by an earlier run; completing it",
                {},
            )
        acknowledged = self._wait(ctx, lambda: _condition(kube.get_workload(kind, ns, name), "Suspended"))
        # Resume whatever happened: never leave a job suspended behind us.
        try:
            kube.patch_workload(
                kind,
                ns,
                name,
                {"metadata": {"annotations": {SUSPENDED_BY: None}}, **_nested_patch(path, False)},
            )
        except errors.BackendError as exc:
            return _stranded(
                exc,
                command,
                f"{kind} {ns}/{name} is left SUSPENDED: resume failed ({exc}); "
                "running this action again resumes it",
            )
        if not acknowledged:
            return Ambiguous(
                command=command,
                reason=f"{kind} {ns}/{name}: the operator did not report Suspended within "
                f"{self.operator_timeout_seconds:g}s (is it running?); resumed, pods may not have been "
                "recreated",
            )
        return Ok(command=command, output=f"{kind} {ns}/{name} suspended and resumed: its pods are recreated")

    def _recreate(
        self,
        kind: str,
        job: Mapping[str, Any],
        kube: KubeClient,
        ctx: ActionContext,
        command: str,
        change: Exclusion,
    ) -> Outcome:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        owner = next((o for o in job["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
        if owner is not None:
            return Failed(
                command=command,
                reason=f"{kind} {ns}/{name} is managed by {owner['kind']} {owner['name']}: restart that instead",
            )
        manifest = fresh_manifest(job, _stamp(ctx.clock.now()))
        if change.nodes or change.dropped:
            manifest["spec"].update(excluded_templates(kind, manifest["spec"], change.nodes, change.dropped))
        old_uid = job["metadata"]["uid"]
        kube.delete_workload(kind, ns, name, uid=old_uid)
        ctx.record(LedgerKind.JOB_DELETED, f"{kind} {ns}/{name} deleted", {"uid": old_uid})
        # From here on the job exists only in `manifest`: a failure hands it to a human to create again.
        try:
            if not self._wait(ctx, lambda: _gone(kube, kind, ns, name, old_uid)):
                raise errors.BackendError(
                    f"{kind} {ns}/{name} still exists {self.operator_timeout_seconds:g}s after delete"
                )
            created = kube.create_workload(kind, ns, manifest)
        except errors.BackendError as exc:
            reason = (
                f"{kind} {ns}/{name} was deleted but not recreated ({exc}); its manifest is in the output"
            )
            return _stranded(exc, command, reason, output=json.dumps(manifest, indent=1))
        return Ok(
            command=command,
            output=f"{kind} {ns}/{name} recreated",
            data={"previous_uid": old_uid, "uid": created["metadata"]["uid"]},
        )

    def _wait(self, ctx: ActionContext, done: Callable[[], bool]) -> bool:
        """Poll ``done()`` every ``poll_seconds`` until true, or false once ``operator_timeout_seconds`` have
        passed on the context's clock. A failed poll counts as "not yet": the caller must reach its clean-up
        step either way."""
        start = ctx.clock.now()
        while True:
            try:
                if done():
                    return True
            except errors.BackendError as exc:
                ctx.record(LedgerKind.POLL_FAILED, f"poll failed: {exc}", {})
            if (ctx.clock.now() - start).total_seconds() >= self.operator_timeout_seconds:
                return False
            ctx.clock.sleep(self.poll_seconds)


class ValidateNode(KubernetesAction):
    """Validate a node with a short-lived pod pinned to it (``spec.nodeName``: no scheduler, so a cordon does not
    stop it) running the validation command; the pod's exit code is the verdict. While pods that use the node's
    GPUs still run there (a cordon evicts nothing), it waits (Retry), as the Slurm validation waits for the node's
    jobs: its pod would not be admitted.

    Level-triggered, one look per run: the first run creates the pod (``repair.validation_namespace``, image
    ``repair.validation_image``, ``activeDeadlineSeconds`` = the timeout) and answers Retry; later runs answer
    Retry while it runs, and once it has finished read its log, delete it and answer Ok (exit 0) or Failed. A pod
    past its deadline, or still not finished ``timeout_seconds`` after creation, has failed. ``run`` (the repair's
    id) names the pod, so a verdict is never read from an earlier validation's pod.
    """

    name = "kubernetes.validate_node"
    description = "Validate a Kubernetes node with a pod pinned to it running the validation command"
    params = {
        "node": NODE,
        **VALIDATION_PARAMS,
    }
    scope_keys = ("node",)

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        check_validation(self.name, params)
        validation_pod_name(params["node"], params["run"])
        return params

    def plan(self, params: Mapping[str, Any]) -> Plan:
        node, pod = params["node"], validation_pod_name(params["node"], params["run"])
        command = params.get("command") or "<repair.validation_command>"
        return Plan(
            summary=f"validate node {node}: run `{command}` in pod {pod} pinned to it, exit 0 = healthy",
            command=f"POST /api/v1/namespaces/<repair.validation_namespace>/pods {pod} spec.nodeName={node} "
            f"command={command}; poll its phase; DELETE it",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        cfg = ctx.settings.repair
        node, namespace = params["node"], cfg.validation_namespace
        pod_name = validation_pod_name(node, params["run"])
        argv = (params.get("command") or cfg.validation_command).split()
        timeout = params.get("timeout_seconds") or cfg.validation_timeout_seconds
        try:
            pod = kube.get_pod(namespace, pod_name)
        except errors.NotFound:
            holding = gpu_holders(kube.list_pods_on_node(node), cfg.validation_gpu_resource)
            if holding:
                # As on Slurm, validation waits for the node's jobs (a cordon evicts nothing): the repair's
                # return_timeout_seconds bounds the wait, then the node is held.
                return Retry(
                    command=command,
                    reason=f"node {node} still runs {len(holding)} pod(s) using its GPUs "
                    f"({', '.join(holding[:5])}): validation waits",
                    after=cfg.poll_seconds,
                )
            gpus = validation_gpus(cfg.validation_gpus, cfg.validation_gpu_resource, kube.get_node(node))
            if gpus == 0:
                return Failed(
                    command=command,
                    reason=f"node {node} advertises no allocatable {cfg.validation_gpu_resource}: counts as failed "
                    "(its GPUs or their device plugin are gone)",
                    data={"node": node, "verdict": "fail"},
                )
            manifest = validation_pod(namespace, pod_name, node, argv, timeout, gpus, cfg)
            kube.create_pod(namespace, manifest)
            ctx.record(
                LedgerKind.VALIDATION_POD,
                f"pod {namespace}/{pod_name} created on {node} ({gpus} {cfg.validation_gpu_resource})",
                {"argv": argv, "gpus": gpus},
            )
            return Retry(command=command, reason=f"validation pod {pod_name} started", after=cfg.poll_seconds)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase not in ("Succeeded", "Failed"):
            created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
            if (ctx.clock.now() - created).total_seconds() < timeout:
                return Retry(
                    command=command, reason=f"validation pod {pod_name} is {phase}", after=cfg.poll_seconds
                )
        try:
            log = kube.pod_logs(namespace, pod_name, None, 200) if phase != "Pending" else ""
        except errors.BackendError as exc:
            log = f"(no log: {exc})"
        kube.delete_pod(namespace, pod_name, 0)
        exit_code = container_exit_code(pod)
        data = {
            "node": node,
            "pod": pod_name,
            "phase": phase,
            "exit_code": exit_code,
            "output": tail(log),
        }
        if phase == "Succeeded":
            return Ok(command=command, output=tail(log), exit_code=0, data={**data, "verdict": "pass"})
        status = pod.get("status") or {}
        if phase not in ("Succeeded", "Failed") or status.get("reason") == "DeadlineExceeded":
            reason = f"validation on {node} timed out after {timeout}s ({phase}): counts as failed"
        else:
            reason = f"validation pod {pod_name} failed on {node}: exit code {exit_code}"
        return Failed(
            command=command,
            reason=reason,
            output=tail(log),
            exit_code=exit_code,
            data={**data, "verdict": "fail"},
        )


def validation_pod_name(node: str, run: int) -> str:
    """``nightshift-validate-<node>-<run>``; a ParamError when that is no valid pod name."""
    name = f"nightshift-validate-{node}-{run}"
    if len(name) > 253 or not re.fullmatch(K8S_NAME, name):
        raise errors.ParamError(
            "kubernetes.validate_node", "node", f"{node!r} makes no valid pod name ({name!r})"
        )
    return name


def gpu_holders(pods: Sequence[Mapping[str, Any]], resource: str) -> list[str]:
    """``namespace/name`` of the pods that have not finished and ask for ``resource`` (limits or requests of any
    container): what keeps a validation pod that wants the node's GPUs from being admitted."""
    holders = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in (pod.get("spec") or {}).get("containers") or []:
            asked = container.get("resources") or {}
            if any(
                str((asked.get(kind) or {}).get(resource, "0")) not in ("0", "")
                for kind in ("limits", "requests")
            ):
                holders.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
                break
    return sorted(holders)


def validation_gpus(wanted: str, resource: str, node: Mapping[str, Any]) -> int:
    """How many GPUs the validation pod requests: ``wanted`` ("all": the node's allocatable ``resource``)."""
    if wanted != "all":
        return int(wanted)
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    value = str(allocatable.get(resource, "0"))
    return int(value) if value.isdigit() else 0


def validation_pod(
    namespace: str, name: str, node: str, argv: list[str], timeout: int, gpus: int, cfg: RepairSettings
) -> dict[str, Any]:
    """The pod that validates ``node``: pinned to it, tolerating every taint (ours included), never restarted,
    requesting ``gpus`` of ``cfg.validation_gpu_resource`` (the device plugin hands it those GPUs and no other),
    in ``cfg.validation_runtime_class``, with the restricted securityContext save the user: no privilege
    escalation, every capability dropped, seccomp RuntimeDefault; non-root only with
    ``cfg.validation_run_as_user`` (parts of ``dcgmi diag`` need root)."""
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    container_security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    if cfg.validation_run_as_user:
        pod_security.update(runAsNonRoot=True, runAsUser=cfg.validation_run_as_user)
    spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": timeout,
        "tolerations": [{"operator": "Exists"}],
        "automountServiceAccountToken": False,
        "securityContext": pod_security,
        "containers": [
            {
                "name": "validate",
                "image": cfg.validation_image,
                "command": argv,
                "resources": {"limits": {cfg.validation_gpu_resource: str(gpus)}},
                "securityContext": container_security,
            }
        ],
    }
    if cfg.validation_runtime_class:
        spec["runtimeClassName"] = cfg.validation_runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": OWNER,
                "app.kubernetes.io/component": VALIDATION_COMPONENT,
            },
            "annotations": {VALIDATES: node},
        },
        "spec": spec,
    }


def container_exit_code(pod: Mapping[str, Any]) -> int | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated is not None:
            return int(terminated.get("exitCode", -1))
    return None


def _stranded(exc: errors.BackendError, command: str, reason: str, output: str = "") -> Outcome:
    """A failure after the first write of a two-step change: never a Retry (a blind re-run would find the
    object half-changed). Ambiguous when the second write may have happened, else Failed: both go to a
    human."""
    result = Ambiguous if isinstance(exc, errors.OutcomeUnknown) else Failed
    return result(command=command, reason=reason, output=output)


def _node_list(params: Mapping[str, Any], key: str = "exclude_nodes") -> list[str]:
    return [node for node in (params.get(key) or "").split(",") if node]


@dataclass(frozen=True)
class Exclusion:
    """What a restart changes in the job's NotIn: ``nodes`` kept off, ``dropped`` let back on (ours, back in
    service, and on the list), ``added`` the kept-off nodes that were not on the list (ours from now on)."""

    nodes: tuple[str, ...]
    dropped: tuple[str, ...]
    added: tuple[str, ...]


def _templates(kind: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod specs of a training job's pod templates (none for a TrainJob: its TrainingRuntime holds them)."""
    if kind == "TrainJob":
        return []
    if kind == "PyTorchJob":
        return [
            replica.setdefault("template", {}).setdefault("spec", {})
            for replica in (spec.get("pytorchReplicaSpecs") or {}).values()
        ]
    if kind == "JobSet":
        return [
            job.setdefault("template", {})
            .setdefault("spec", {})
            .setdefault("template", {})
            .setdefault("spec", {})
            for job in spec.get("replicatedJobs") or []
        ]
    return [spec.setdefault("template", {}).setdefault("spec", {})]


def not_in_values(kind: str, job_spec: Mapping[str, Any]) -> list[str]:
    """The nodes the job's first pod template keeps its pods off (its hostname NotIn), as they are now."""
    spec: dict[str, Any] = json.loads(json.dumps(job_spec))
    for pod_spec in _templates(kind, spec)[:1]:
        required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        for term in required.get("nodeSelectorTerms") or []:
            for e in term.get("matchExpressions") or []:
                if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn":
                    return list(e.get("values") or [])
    return []


def excluded_templates(
    kind: str, job_spec: Mapping[str, Any], nodes: Sequence[str], returned: Sequence[str] = ()
) -> dict[str, Any]:
    """The parts of a training job's ``spec`` holding pod templates, each template's pods kept off ``nodes`` and let
    back on ``returned``: a ``kubernetes.io/hostname NotIn`` expression in every required node-selector term (terms
    are ORed, so each needs it), merged with one such expression already there (and gone once it would be empty).
    Returned whole, for a merge patch."""
    spec: dict[str, Any] = json.loads(json.dumps(job_spec))
    if kind == "TrainJob":
        return {}  # its pod templates live in the TrainingRuntime: the culprits' cordon keeps the pods off them
    for pod_spec in _templates(kind, spec):
        _exclude(pod_spec, nodes, returned)
    if kind == "PyTorchJob":
        return {"pytorchReplicaSpecs": spec.get("pytorchReplicaSpecs") or {}}
    if kind == "JobSet":
        return {"replicatedJobs": spec.get("replicatedJobs") or []}
    return {"template": spec["template"]}


def _exclude(pod_spec: dict[str, Any], nodes: Sequence[str], returned: Sequence[str] = ()) -> None:
    affinity = pod_spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        expressions = term.setdefault("matchExpressions", [])
        ours = next(
            (e for e in expressions if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn"), None
        )
        values = sorted((set(ours.get("values") or []) if ours else set()) - set(returned) | set(nodes))
        if ours is None and values:
            expressions.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": values})
        elif ours is not None and values:
            ours["values"] = values
        elif ours is not None:
            expressions.remove(ours)  # an empty NotIn is invalid: nothing left to keep the pods off
        if not expressions:
            term.pop("matchExpressions")
    terms = [t for t in terms if t]
    if terms:
        required["nodeSelectorTerms"] = terms
        return
    node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution")  # no term left: no requirement
    if not node_affinity:
        affinity.pop("nodeAffinity")
    if not affinity:
        pod_spec.pop("affinity")


def fresh_manifest(job: Mapping[str, Any], restarted_at: str) -> dict[str, Any]:
    """The create body for a new incarnation of ``job`` (any training kind): same name, labels, annotations and
    spec; none of the server-owned fields (uid, resourceVersion, status...) and, for a batch/v1 Job whose selector
    is not manual, none of the uid-derived selector and labels, which the apiserver generates afresh."""
    meta = job["metadata"]
    spec = json.loads(json.dumps(job["spec"]))
    labels = dict(meta.get("labels") or {})
    if job.get("kind", "Job") == "Job" and not spec.get("manualSelector"):
        spec.pop("selector", None)
        template_labels = spec.get("template", {}).get("metadata", {}).get("labels") or {}
        for key in GENERATED_JOB_LABELS:
            template_labels.pop(key, None)
            labels.pop(key, None)
    annotations = {**(meta.get("annotations") or {}), RESTARTED_AT: restarted_at}
    # Non-controller owners (garbage-collection parents) still own the new incarnation.
    owners = {"ownerReferences": meta["ownerReferences"]} if meta.get("ownerReferences") else {}
    return {
        "apiVersion": job.get("apiVersion", "batch/v1"),
        "kind": job.get("kind", "Job"),
        "metadata": {
            **owners,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def _gone(kube: KubeClient, kind: str, ns: str, name: str, uid: str) -> bool:
    try:
        return kube.get_workload(kind, ns, name)["metadata"]["uid"] != uid
    except errors.NotFound:
        return True


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _suspended(obj: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value is True


def _nested_patch(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    patch: Any = value
    for key in reversed(path):
        patch = {key: patch}
    return patch


ACTIONS: tuple[Action, ...] = (
    CordonNode(),
    UncordonNode(),
    TaintNode(),
    EvictPod(),
    DeletePod(),
    RestartJob(),
    PodLogs(),
    ValidateNode(),
)
