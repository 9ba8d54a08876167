"""``kubernetes.checkpoint_rollback``: the Kubernetes twin of ``checkpoint.rollback``: the checkpoint the training
framework resumes from is set aside and the previous one made current, by short-lived Jobs beside the training job
that mount its checkpoint volume (the only place a namespaced volume claim can be mounted).

The training job's pod template names the volume: the container's ``volumeMounts`` entry whose ``mountPath`` holds
``dir`` (the checkpoint directory as the training container sees it), and that volume of the template. Two Jobs,
each run to completion and deleted (propagation Background, which takes its pod), with the training container's
image (it has the GNU userland: ``sh``, ``realpath``, ``find -printf``, ``base64``, ``mv -n -T``) and its user:

1. **read**: ``dir`` and ``checkpoint.allowed_roots`` resolved (``realpath``) and the directory listed as the Slurm
   action lists it (:data:`app.domain.checkpoint_layouts.ENTRY_FORMAT`, the DCP metadata files, the tracker files), each
   part base64 in the pod's log (:func:`parse_report`);
2. Nightshift decides, with the same pure logic as on Slurm (:func:`app.domain.checkpoint_layouts.plan_rollback`) and
   the same root rule (:func:`app.actions.checkpoint.below`);
3. **apply**: the tracker written beside itself and renamed over it, then the current checkpoint moved into
   ``nightshift-quarantine/`` with ``mv -n -T`` (never overwrites).

Each Job: ``backoffLimit: 0``, ``activeDeadlineSeconds`` = the wait's bound, no ServiceAccount token, the restricted
securityContext save the user (no privilege escalation, every capability dropped, seccomp RuntimeDefault; non-root
whenever the training pods declare a non-root user, whose files these are). Waits are bounded (``timeout``), polled
on the context's clock; a Job is deleted whatever happened. Bounds: the log read is 1 MiB
(:data:`app.clients.kube.LOG_LIMIT_BYTES`): a directory of more than about 20,000 entries is refused as cut.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.actions.base import ActionContext, Plan
from app.actions.checkpoint import below, path_problem
from app.actions.kubernetes import JOB_KINDS, NAMESPACE, OWNER, KubernetesAction, _stamp, container_exit_code
from app.domain import errors
from app.domain.checkpoint_layouts import (
    DCP_FORMAT,
    DCP_METADATA,
    ENTRY_FORMAT,
    MAX_TRACKER_BYTES,
    QUARANTINE_DIR,
    TRACKERS,
    LayoutRefused,
    Listing,
    parse_dcp_dirs,
    parse_entries,
    plan_rollback,
)
from app.domain.job_phase import JobPhase, finished_phase
from app.domain.outcome import Failed, Ok, Outcome, tail
from app.domain.params import ABS_PATH, K8S_NAME, Param
from app.domain.states import LedgerKind

if TYPE_CHECKING:
    from app.clients.kube import KubeClient

COMPONENT = "checkpoint-rollback"  # app.kubernetes.io/component of the Jobs
ROLLS_BACK = "nightshift.io/rolls-back"  # annotation: the training job a Job works for
MIN_TIMEOUT, MAX_TIMEOUT = 30, 1800
POLL_SECONDS = 2.0
LOG_LINES = 5000

# sh -c READ_SCRIPT read DIR DCP_METADATA MAX_TRACKER_BYTES ENTRY_FORMAT DCP_FORMAT TRACKER... -- ROOT...: one line
# per fact, each value base64 (names may hold any byte). Constant text: every value is an argument.
READ_SCRIPT = r"""
set -u
enc() { base64 | tr -d '\n'; }
dir=$1 dcp=$2 max=$3 entry_format=$4 dcp_format=$5; shift 5
trackers=""; while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do trackers="$trackers $1"; shift; done; shift
resolved=$(realpath -e -- "$dir") || { echo "error $(printf 'cannot resolve %s' "$dir" | enc)"; exit 3; }
echo "resolved $(printf '%s' "$resolved" | enc)"
for root in "$@"; do echo "root $(realpath -m -- "$root" | tr -d '\n' | enc)"; done
echo "entries $(find "$resolved" -mindepth 1 -maxdepth 1 -printf "$entry_format" | enc)"
echo "dcp $(find "$resolved" -mindepth 2 -maxdepth 2 -type f -name "$dcp" -printf "$dcp_format" | enc)"
for t in $trackers; do
  [ -f "$resolved/$t" ] && [ ! -L "$resolved/$t" ] || continue
  echo "tracker $(printf '%s' "$t" | enc) $(head -c "$max" -- "$resolved/$t" | enc)"
done
echo "end"
"""
# sh -c APPLY_SCRIPT apply DIR TRACKER CONTENT CURRENT TARGET (TRACKER "": none): the tracker first, written beside
# itself and renamed over it, so it always names a checkpoint that exists; then the move, never overwriting.
APPLY_SCRIPT = r"""
set -eu
dir=$1 tracker=$2 content=$3 current=$4 target=$5
if [ -n "$tracker" ]; then
  printf '%s' "$content" > "$dir/$tracker.nightshift-tmp"
  mv -f -T -- "$dir/$tracker.nightshift-tmp" "$dir/$tracker"
fi
mkdir -p -- "$(dirname -- "$dir/$target")"
LC_ALL=C mv -n -T -v -- "$dir/$current" "$dir/$target"
"""


@dataclass(frozen=True)
class DirectoryReport:
    """What the read Job saw: ``dir`` resolved, the allowed roots resolved, the directory's listing."""

    resolved: str
    roots: tuple[str, ...]
    listing: Listing


@dataclass(frozen=True)
class Mount:
    """Where the training job keeps ``dir``: the volume (as its template declares it), its mount path, the
    container's image, and the user its pods run as."""

    volume: Mapping[str, Any]
    mount_path: str
    sub_path: str
    image: str
    run_as: Mapping[str, Any]
    pull_secrets: Sequence[Mapping[str, Any]]


def parse_report(text: str) -> DirectoryReport:
    """The read Job's log. Raises LayoutRefused when it says why it could not read, or was cut."""
    fields: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        fields.setdefault(key, []).append(rest)
    decode = lambda value: base64.b64decode(value.encode(), validate=True).decode("utf-8", "replace")  # noqa: E731
    try:
        if "error" in fields:
            raise LayoutRefused(decode(fields["error"][0]))
        if "end" not in fields or len(fields.get("resolved", [])) != 1:
            raise LayoutRefused("the listing is incomplete (cut at the log's 1 MiB, or the read failed)")
        trackers = {}
        for item in fields.get("tracker", []):
            name, _, content = item.partition(" ")
            trackers[decode(name)] = decode(content)
        listing = Listing(
            parse_entries(decode(fields.get("entries", [""])[0])),
            parse_dcp_dirs(decode(fields.get("dcp", [""])[0])),
            trackers,
        )
        return DirectoryReport(
            decode(fields["resolved"][0]), tuple(decode(r) for r in fields.get("root", [])), listing
        )
    except ValueError as exc:  # not base64: not our script's output
        raise LayoutRefused(f"unreadable listing: {exc}") from None


def pod_templates(kind: str, job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod templates of a training job (a TrainJob's are in its TrainingRuntime: none here)."""
    spec = job.get("spec") or {}
    if kind == "PyTorchJob":
        return [r.get("template") or {} for r in (spec.get("pytorchReplicaSpecs") or {}).values()]
    if kind == "JobSet":
        return [
            ((j.get("template") or {}).get("spec") or {}).get("template") or {}
            for j in spec.get("replicatedJobs") or []
        ]
    if kind == "Job":
        return [spec.get("template") or {}]
    return []


def mount_of(directory: str, templates: Sequence[Mapping[str, Any]]) -> Mount | None:
    """The volume a container of the templates mounts at ``directory`` or at a parent of it (the deepest mount
    wins), with that container's image and user; None when none does."""
    best: tuple[int, Mount] | None = None
    for template in templates:
        pod = template.get("spec") or {}
        volumes = {v.get("name"): v for v in pod.get("volumes") or []}
        for container in pod.get("containers") or []:
            for mount in container.get("volumeMounts") or []:
                path = str(mount.get("mountPath", "")).rstrip("/") or "/"
                inside = directory == path or directory.startswith(path.rstrip("/") + "/")
                if not inside or mount.get("name") not in volumes or (best and best[0] >= len(path)):
                    continue
                run_as = {
                    k: v
                    for k, v in {
                        **(pod.get("securityContext") or {}),
                        **(container.get("securityContext") or {}),
                    }.items()
                    if k in ("runAsUser", "runAsGroup", "fsGroup")
                }
                best = (
                    len(path),
                    Mount(
                        volumes[mount["name"]],
                        path,
                        str(mount.get("subPath", "")),
                        str(container.get("image", "")),
                        run_as,
                        pod.get("imagePullSecrets") or [],
                    ),
                )
    return best[1] if best else None


def rollback_job(
    name: str, namespace: str, owner: str, mount: Mount, argv: list[str], deadline: int
) -> dict[str, Any]:
    """A Job that runs ``argv`` once in the training image, the checkpoint volume mounted where the training
    containers mount it, as their user, restricted otherwise."""
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    pod_security.update({k: v for k, v in mount.run_as.items() if k in ("runAsGroup", "fsGroup")})
    uid = mount.run_as.get("runAsUser")
    if isinstance(uid, int) and uid > 0:
        pod_security.update(runAsUser=uid, runAsNonRoot=True)
    volume_mount = {"name": "checkpoints", "mountPath": mount.mount_path}
    if mount.sub_path:
        volume_mount["subPath"] = mount.sub_path
    labels = {"app.kubernetes.io/managed-by": OWNER, "app.kubernetes.io/component": COMPONENT}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {ROLLS_BACK: owner},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": 600,  # the TTL controller's backstop, should we not delete it ourselves
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security,
                    **({"imagePullSecrets": list(mount.pull_secrets)} if mount.pull_secrets else {}),
                    "containers": [
                        {
                            "name": "rollback",
                            "image": mount.image,
                            "command": argv,
                            "volumeMounts": [volume_mount],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                    "volumes": [{**dict(mount.volume), "name": "checkpoints"}],
                },
            },
        },
    }


class CheckpointRollback(KubernetesAction):
    """Roll a Kubernetes training job's checkpoint directory back one checkpoint, by Jobs mounting its volume."""

    name = "kubernetes.checkpoint_rollback"
    description = (
        "Set aside the checkpoint a Kubernetes job resumes from, by Jobs that mount its checkpoint volume"
    )
    params = {
        "namespace": NAMESPACE,
        "name": Param(pattern=K8S_NAME, description="the training job's name"),
        "kind": Param(
            choices=JOB_KINDS, description="Job | PyTorchJob | JobSet (a TrainJob's templates are elsewhere)"
        ),
        "dir": Param(
            pattern=ABS_PATH,
            max_length=1024,
            description="the checkpoint directory, as the training containers see it",
        ),
        "timeout": Param(
            kind="integer",
            required=False,
            default=300,
            description=f"each Job's bound, {MIN_TIMEOUT}..{MAX_TIMEOUT} s",
        ),
    }
    scope_keys = ("namespace",)

    def __init__(self, poll_seconds: float = POLL_SECONDS):
        self.poll_seconds = poll_seconds

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        params = super().validate(raw)
        if problem := path_problem(params["dir"]):
            raise errors.ParamError(self.name, "dir", f"{params['dir']!r} {problem}")
        if not MIN_TIMEOUT <= params["timeout"] <= MAX_TIMEOUT:
            raise errors.ParamError(self.name, "timeout", f"must be between {MIN_TIMEOUT} and {MAX_TIMEOUT}")
        return params

    def plan(self, params: Mapping[str, Any]) -> Plan:
        ns, name, kind, directory = params["namespace"], params["name"], params["kind"], params["dir"]
        return Plan(
            f"roll {directory} of {kind} {ns}/{name} back one checkpoint (DeepSpeed, Megatron, Hugging Face or DCP "
            f"layout) with Jobs in {ns} that mount its checkpoint volume: list it, point the tracker at the previous "
            f"checkpoint, move the current one into {QUARANTINE_DIR}/",
            f"GET {kind} {ns}/{name} (its volume at {directory}); POST Job nightshift-rollback-read-* "
            "(realpath, find, head | base64); GET its log; DELETE it; POST Job nightshift-rollback-apply-* "
            "(tracker write-then-rename; mv -n -T -v); GET its log; DELETE it",
        )

    def act(self, params: Mapping[str, Any], kube: KubeClient, ctx: ActionContext, command: str) -> Outcome:
        ns, name, kind, directory = params["namespace"], params["name"], params["kind"], params["dir"]
        roots = list(ctx.settings.checkpoint.allowed_roots)
        if not roots:
            return Failed(
                command=command, reason="checkpoint.allowed_roots is empty: no directory may be rolled back"
            )
        job = kube.get_workload(kind, ns, name)
        mount = mount_of(directory, pod_templates(kind, job))
        if mount is None:
            where = "its TrainingRuntime" if kind == "TrainJob" else "its pod templates"
            return Failed(command=command, reason=f"no container of {kind} {ns}/{name} mounts a volume holding "
                          f"{directory} (in {where})")  # fmt: skip
        stamp = ctx.clock.now()
        base = hashlib.sha256(f"{ns}/{name}/{directory}/{_stamp(stamp)}".encode()).hexdigest()[:10]
        read_argv = ["sh", "-c", READ_SCRIPT, "read", directory, DCP_METADATA, str(MAX_TRACKER_BYTES),
                     ENTRY_FORMAT, DCP_FORMAT, *TRACKERS, "--", *roots]  # fmt: skip
        code, log = self._run(kube, ctx, rollback_job(f"nightshift-rollback-read-{base}", ns, f"{kind}/{name}",
                                                      mount, read_argv, params["timeout"]))  # fmt: skip
        try:
            report = parse_report(log)
            if not below(report.resolved, report.roots):
                raise LayoutRefused(
                    f"{directory} resolves to {report.resolved}, not strictly below an allowed root "
                    f"({', '.join(report.roots)})"
                )
            rollback = plan_rollback(report.listing, stamp.strftime("%Y%m%dT%H%M%SZ"))
        except LayoutRefused as exc:
            return Failed(command=command, reason=f"{directory}: {exc}", output=tail(log), exit_code=code)
        apply_argv = ["sh", "-c", APPLY_SCRIPT, "apply", report.resolved, rollback.tracker or "",
                      rollback.tracker_content or "", rollback.current, rollback.quarantined]  # fmt: skip
        code, log = self._run(kube, ctx, rollback_job(f"nightshift-rollback-apply-{base}", ns, f"{kind}/{name}",
                                                      mount, apply_argv, params["timeout"]))  # fmt: skip
        current, target = f"{report.resolved}/{rollback.current}", f"{report.resolved}/{rollback.quarantined}"
        if code != 0 or "renamed" not in log:
            return Failed(
                command=command,
                reason=f"{current} not moved to {target} (exit {code})"
                + (f"; {rollback.tracker} may already name {rollback.previous}" if rollback.tracker else ""),
                output=tail(log),
                exit_code=code,
            )
        return Ok(
            command=command,
            output=tail(f"{log}{rollback.layout} resumes from: {rollback.previous}"),
            exit_code=0,
            data={
                "layout": str(rollback.layout),
                "quarantined": current,
                "to": target,
                "previous": f"{report.resolved}/{rollback.previous}",
                "tracker": rollback.tracker,
            },
        )

    def _run(
        self, kube: KubeClient, ctx: ActionContext, manifest: Mapping[str, Any]
    ) -> tuple[int | None, str]:
        """Create the Job, wait (bounded) until it has finished, read its pod's exit code and log, delete it
        whatever happened. (None, why) when it did not finish in time."""
        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        created = kube.create_workload("Job", ns, manifest)
        ctx.record(LedgerKind.ROLLBACK_JOB, f"Job {ns}/{name} created", {"argv": manifest["spec"]["template"]["spec"][
            "containers"][0]["command"][3:]})  # fmt: skip
        try:
            deadline = (
                manifest["spec"]["activeDeadlineSeconds"] + 30
            )  # its own deadline, and the status write
            start = ctx.clock.now()
            finished = None
            while finished is None and (ctx.clock.now() - start).total_seconds() < deadline:
                ctx.clock.sleep(self.poll_seconds)
                try:
                    finished = finished_phase("Job", kube.get_workload("Job", ns, name))
                except errors.BackendError as exc:
                    ctx.record(LedgerKind.POLL_FAILED, f"Job {ns}/{name}: poll failed: {exc}", {})
            if finished is None:
                return None, f"Job {ns}/{name} did not finish within {deadline}s"
            pods = kube.pods_matching(ns, f"controller-uid={created['metadata']['uid']}")
            if not pods:
                return None, f"Job {ns}/{name} finished ({finished[1]}) but has no pod to read"
            pod = pods[0]
            log = kube.pod_logs(ns, pod["metadata"]["name"], None, LOG_LINES)
            code = container_exit_code(pod)
            ctx.record(
                LedgerKind.ROLLBACK_JOB,
                f"Job {ns}/{name}: {finished[1]}, exit {code}",
                {"output": tail(log, 2000)},
            )
            return (0 if finished[0] is JobPhase.COMPLETED and code in (0, None) else code), log
        finally:
            try:
                kube.delete_workload("Job", ns, name)
            except errors.BackendError as exc:  # its TTL (ttlSecondsAfterFinished) removes it later
                ctx.record(LedgerKind.ROLLBACK_JOB, f"Job {ns}/{name} not deleted: {exc}", {})


ACTIONS = (CheckpointRollback(),)
