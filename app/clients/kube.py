"""Kubernetes through the official client, with its errors translated once into :mod:`app.domain.errors`.

Contract:
  * every request carries ``_request_timeout`` (``kubernetes.request_timeout_seconds``, total per request);
  * objects come back as the server's JSON (plain dicts, camelCase keys), never as client models, so a field
    this client version does not know survives a read-modify-write;
  * read-modify-write sends ``metadata.resourceVersion`` in the patch (optimistic lock) and retries a 409 up
    to :data:`CONFLICT_ATTEMPTS` times with a fresh read;
  * HTTP 401/403 → :class:`~app.domain.errors.CredentialRejected` (with the RBAC reason), 404 → ``NotFound``,
    409 → ``Conflict``, 429 → ``RateLimited`` (``Retry-After`` or 10 s; for an eviction: a
    PodDisruptionBudget), 5xx and other statuses → ``BackendError``; no connection → ``Unavailable``; a read
    timeout (or a dropped connection) on a mutating call → ``OutcomeUnknown``: the server may have applied it.
Configuration is built into a private :class:`kubernetes.client.Configuration`: the library's global default
is never touched, so several clients (tests, several clusters) coexist.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
import websocket
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from app.config import Settings
from app.domain import errors
from app.domain.outcome import tail

DEFAULT_RETRY_AFTER_SECONDS = 10.0
CONFLICT_ATTEMPTS = 5
# Bound what a log request may pull into memory (and into the ledger).
LOG_LIMIT_BYTES = 1 << 20
MERGE_PATCH = "application/merge-patch+json"

# Workload kinds by the names playbooks use → (group, version, plural). They are reached through the generic
# /apis/<group>/<version>/namespaces/<ns>/<plural> path, so every kind travels as raw JSON.
WORKLOADS: dict[str, tuple[str, str, str]] = {
    "Job": ("batch", "v1", "jobs"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}

Json = dict[str, Any]
# pods/exec: the channel protocol every kubelet since 1.4 speaks (v5 adds only a stdin close we do not need); its
# channels: 1 stdout, 2 stderr, 3 the status (a metav1.Status: Success, or Failure with the exit code as a cause).
EXEC_PROTOCOL = "v4.channel.k8s.io"
STDOUT, STDERR, STATUS = 1, 2, 3


@dataclass(frozen=True)
class ExecResult:
    """What a command run in a container said: its output (each stream cut at :data:`LOG_LIMIT_BYTES`), its exit
    code (None when it had not finished within the timeout: it may still run), and the kubelet's reason when it
    could not run it at all (``error``)."""

    stdout: str
    stderr: str
    exit_code: int | None
    error: str = ""


# Labels that name a pod's training job: Kubeflow training operator (PyTorchJob...), batch/v1 Job, JobSet.
JOB_NAME_LABELS = (
    "training.kubeflow.org/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",  # the Job controller's only one before Kubernetes 1.27
    "jobset.sigs.k8s.io/jobset-name",
)


class KubeClient:
    """One API connection (its own ``ApiClient``) and the calls Nightshift's actions make."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        request_timeout: float = 10.0,
        eviction_api_version: str | None = None,
    ):
        self._api = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._timeout = request_timeout
        self._eviction_api_version = eviction_api_version

    @classmethod
    def from_settings(cls, settings: Settings) -> KubeClient:
        """Kubeconfig ``kubernetes.kubeconfig`` (and ``context``) when set; otherwise the in-cluster
        ServiceAccount when running in a pod, else the default kubeconfig (``$KUBECONFIG`` or
        ``~/.kube/config``).

        Credentials that cannot be loaded raise :class:`~app.domain.errors.CredentialRejected`: the backend is
        unusable until an operator fixes them, which is what ``credential_error`` tells them.
        """
        kube = settings.kubernetes
        configuration = k8s.Configuration()
        try:
            if kube.kubeconfig is None:
                try:
                    k8s_config.load_incluster_config(client_configuration=configuration)
                except ConfigException:
                    k8s_config.load_kube_config(
                        context=kube.context, client_configuration=configuration, persist_config=False
                    )
            else:
                k8s_config.load_kube_config(
                    config_file=kube.kubeconfig,
                    context=kube.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (ConfigException, OSError, ValueError) as exc:
            raise errors.CredentialRejected(f"kubernetes: cannot load credentials: {exc}") from None
        # Retry only what cannot have reached the server (connection setup); a read timeout surfaces at once
        # so a mutating call is never sent twice behind our back.
        configuration.retries = urllib3.Retry(total=2, connect=2, read=0, status=0, redirect=0, other=0)
        return cls(
            k8s.ApiClient(configuration),
            request_timeout=kube.request_timeout_seconds,
            eviction_api_version=kube.eviction_api_version,
        )

    def close(self) -> None:
        self._api.close()

    # -- health ----------------------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise unless our credentials work: a one-item node list, which the deploy/ ClusterRole grants."""
        self._request("list nodes", self._core.list_node, limit=1)

    # -- nodes -----------------------------------------------------------------------------------------------

    def get_node(self, node: str) -> Json:
        return self._json(f"get node {node}", self._core.read_node, node)

    def node_names(self, label_selector: str, limit: int = 5000) -> list[str]:
        """The names of the nodes matching ``label_selector`` (a node pool), at most ``limit``."""
        listing = self._json(
            f"list nodes {label_selector}", self._core.list_node, label_selector=label_selector, limit=limit
        )
        return [item["metadata"]["name"] for item in listing.get("items") or []]

    def nodes_topology(self, max_nodes: int, page: int) -> dict[str, Json]:
        """Every node's labels and InternalIP addresses (``{name: {"labels": {...}, "addresses": [...]}}``),
        listed ``page`` nodes a request; more than ``max_nodes`` is a :class:`~app.domain.errors.BackendError`."""
        found: dict[str, Json] = {}
        token: str | None = None
        while True:
            paging: dict[str, Any] = {"limit": page, **({"_continue": token} if token else {})}
            listing = self._json("list nodes", self._core.list_node, **paging)
            for item in listing.get("items") or []:
                addresses = (item.get("status") or {}).get("addresses") or []
                found[item["metadata"]["name"]] = {
                    "labels": item["metadata"].get("labels") or {},
                    "addresses": [a["address"] for a in addresses if a.get("type") == "InternalIP"],
                }
            if len(found) > max_nodes:
                raise errors.BackendError(f"list nodes: more than {max_nodes} nodes")
            token = (listing.get("metadata") or {}).get("continue")
            if not token:
                return found

    def cordon(self, node: str, owner_annotation: Mapping[str, str]) -> bool:
        """Mark ``node`` unschedulable and set ``owner_annotation``, atomically with the read.

        Returns False, changing nothing, when the node is already unschedulable (whoever did it).
        """

        def change(current: Json) -> Json | None:
            if current.get("spec", {}).get("unschedulable"):
                return None
            return {"metadata": {"annotations": dict(owner_annotation)}, "spec": {"unschedulable": True}}

        return self._update_node(node, change)

    def uncordon(
        self, node: str, only_if: Mapping[str, str] | None = None, drop_annotations: Collection[str] = ()
    ) -> bool:
        """Clear ``spec.unschedulable`` and remove ``drop_annotations``, atomically with the read.

        With ``only_if``, only when the node carries every one of those annotations with those values; returns
        False, changing nothing, when it does not (or when there is nothing to change).
        """

        def change(current: Json) -> Json | None:
            annotations = current.get("metadata", {}).get("annotations") or {}
            if any(annotations.get(key) != value for key, value in (only_if or {}).items()):
                return None
            present = [key for key in drop_annotations if key in annotations]
            if not current.get("spec", {}).get("unschedulable") and not present:
                return None
            return {"metadata": {"annotations": dict.fromkeys(present)}, "spec": {"unschedulable": False}}

        return self._update_node(node, change)

    def taint(self, node: str, key: str, value: str, effect: str) -> bool:
        """Add the taint, replacing any taint with the same key. Returns False when it was already there.

        ``spec.taints`` has no merge strategy, so the whole list is written, guarded by the read's
        resourceVersion.
        """
        wanted = {"key": key, "effect": effect, **({"value": value} if value else {})}

        def change(current: Json) -> Json | None:
            taints = current.get("spec", {}).get("taints") or []
            same_key = [t for t in taints if t.get("key") == key]
            if len(same_key) == 1 and _same_taint(same_key[0], wanted):
                return None
            return {"spec": {"taints": [*(t for t in taints if t.get("key") != key), wanted]}}

        return self._update_node(node, change)

    def untaint(self, node: str, key: str) -> bool:
        """Remove every taint with ``key``. Returns False when there was none."""

        def change(current: Json) -> Json | None:
            taints = current.get("spec", {}).get("taints") or []
            kept = [t for t in taints if t.get("key") != key]
            return None if len(kept) == len(taints) else {"spec": {"taints": kept}}

        return self._update_node(node, change)

    def _update_node(self, node: str, change: Callable[[Json], Json | None]) -> bool:
        return _read_modify_write(
            f"patch node {node}",
            lambda: self.get_node(node),
            lambda patch: self._request(
                f"patch node {node}", self._core.patch_node, node, patch, mutating=True
            ),
            change,
        )

    # -- pods ------------------------------------------------------------------------------------------------

    def list_pods_on_node(self, node: str) -> list[Json]:
        """Every pod bound to ``node``, in all namespaces."""
        listing = self._json(
            f"list pods on node {node}",
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )
        return listing.get("items") or []

    def job_pods(self, namespace: str, job: str) -> list[Json]:
        """The pods of training job ``job`` in ``namespace``: those labelled with its name by the training
        operator (PyTorchJob), the Job controller or JobSet (:data:`JOB_NAME_LABELS`), at most 1,000."""
        pods: dict[str, Json] = {}
        for label in JOB_NAME_LABELS:
            for pod in self.pods_matching(namespace, f"{label}={job}"):
                pods[pod["metadata"]["name"]] = pod
        return list(pods.values())

    def pods_matching(self, namespace: str, label_selector: str, limit: int = 1000) -> list[Json]:
        """The pods of ``namespace`` that ``label_selector`` selects, at most ``limit``."""
        listing = self._json(
            f"list pods {namespace} {label_selector}",
            self._core.list_namespaced_pod,
            namespace,
            label_selector=label_selector,
            limit=limit,
        )
        return listing.get("items") or []

    def evict(self, namespace: str, pod: str, grace_seconds: int) -> None:
        """Evict through the Eviction API, which honours PodDisruptionBudgets: a 429 (RateLimited) means a
        budget forbids it now. The body's apiVersion is ``kubernetes.eviction_api_version``, or omitted so the
        server picks (policy/v1beta1 before 1.22, policy/v1 after)."""
        version = self._eviction_api_version
        body = k8s.V1Eviction(
            api_version=version,
            kind="Eviction" if version else None,
            metadata=k8s.V1ObjectMeta(name=pod, namespace=namespace),
            delete_options=k8s.V1DeleteOptions(grace_period_seconds=grace_seconds),
        )
        self._request(
            f"evict pod {namespace}/{pod}",
            self._core.create_namespaced_pod_eviction,
            pod,
            namespace,
            body,
            mutating=True,
        )

    def delete_pod(self, namespace: str, pod: str, grace_seconds: int) -> None:
        """Delete directly (bypasses PodDisruptionBudgets)."""
        self._request(
            f"delete pod {namespace}/{pod}",
            self._core.delete_namespaced_pod,
            pod,
            namespace,
            grace_period_seconds=grace_seconds,
            mutating=True,
        )

    def get_pod(self, namespace: str, pod: str) -> Json:
        return self._json(f"get pod {namespace}/{pod}", self._core.read_namespaced_pod, pod, namespace)

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> Json:
        name = manifest["metadata"]["name"]
        return self._json(
            f"create pod {namespace}/{name}",
            self._core.create_namespaced_pod,
            namespace,
            dict(manifest),
            mutating=True,
        )

    def pod_logs(self, namespace: str, pod: str, container: str | None, tail_lines: int) -> str:
        """The last ``tail_lines`` lines of a container's log (at most :data:`LOG_LIMIT_BYTES`), decoded
        leniently."""
        data = self._request(
            f"read logs of pod {namespace}/{pod}",
            self._core.read_namespaced_pod_log,
            pod,
            namespace,
            container=container,
            tail_lines=tail_lines,
            limit_bytes=LOG_LIMIT_BYTES,
        )
        return data.decode("utf-8", errors="replace")

    def exec(
        self, namespace: str, pod: str, container: str, argv: Sequence[str], timeout: float
    ) -> ExecResult:
        """Run ``argv`` in ``container`` of ``pod`` (``pods/exec``, a WebSocket through the apiserver to the
        kubelet), no stdin, no tty; wait at most ``timeout`` seconds in all (connection included). The argv
        travels as query parameters, never through a shell. A refused upgrade raises like any other call (403:
        CredentialRejected, 404: NotFound...); no connection: Unavailable."""
        what = f"exec in pod {namespace}/{pod} [{container}]"
        config = self._api.configuration
        query = [("container", container), ("stdout", "true"), ("stderr", "true")]
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec"
        url = config.host.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + path + "?"
        url += urlencode([*query, *(("command", arg) for arg in argv)])
        # The same credentials as every other call (a bearer token: kubeconfig or the in-cluster ServiceAccount's).
        header = [f"{a['key']}: {a['value']}" for a in config.auth_settings().values() if a["in"] == "header"]
        deadline = time.monotonic() + timeout
        try:
            ws = websocket.create_connection(
                url,
                timeout=min(timeout, self._timeout),
                header=header,
                subprotocols=[EXEC_PROTOCOL],
                sslopt=_ssl_options(config),
                enable_multithread=False,
            )
        except websocket.WebSocketBadStatusException as exc:
            body = (exc.resp_body or b"").decode("utf-8", errors="replace")
            raise _api_error(
                what, ApiException(status=exc.status_code, reason=str(exc.status_message)), body
            ) from None
        except (OSError, websocket.WebSocketException) as exc:
            raise errors.Unavailable(f"{what}: cannot reach the API server: {exc}") from None
        streams = {STDOUT: bytearray(), STDERR: bytearray(), STATUS: bytearray()}
        try:
            while (left := deadline - time.monotonic()) > 0:
                ws.settimeout(left)
                try:
                    opcode, data = ws.recv_data()
                except websocket.WebSocketTimeoutException:
                    break
                except websocket.WebSocketConnectionClosedException:
                    return _exec_result(streams, closed=True)
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    return _exec_result(streams, closed=True)
                if data and data[0] in streams and len(streams[data[0]]) < LOG_LIMIT_BYTES:
                    streams[data[0]] += data[1 : 1 + LOG_LIMIT_BYTES - len(streams[data[0]])]
            return _exec_result(streams, closed=False)
        except (OSError, websocket.WebSocketException) as exc:
            # The command may have run: the stream broke before its status came.
            raise errors.OutcomeUnknown(f"{what}: the stream broke: {exc}") from None
        finally:
            ws.close(timeout=1)

    # -- workloads (Job, PyTorchJob, JobSet) -----------------------------------------------------------------

    def get_workload(self, kind: str, namespace: str, name: str) -> Json:
        group, version, plural = WORKLOADS[kind]
        return self._json(
            f"get {kind} {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
        )

    def patch_workload(self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]) -> Json:
        """JSON merge patch (custom resources have no strategic merge); ``metadata.resourceVersion`` in
        ``patch`` makes it conditional (409 when the object changed)."""
        group, version, plural = WORKLOADS[kind]
        return self._json(
            f"patch {kind} {namespace}/{name}",
            self._custom.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            dict(patch),
            _content_type=MERGE_PATCH,
            mutating=True,
        )

    def update_workload(
        self, kind: str, namespace: str, name: str, change: Callable[[Json], Json | None]
    ) -> bool:
        """Read-modify-write with ``change`` (a merge patch, or None when there is nothing to do), retried on
        409: controllers write status all the time. Returns whether it patched."""
        return _read_modify_write(
            f"patch {kind} {namespace}/{name}",
            lambda: self.get_workload(kind, namespace, name),
            lambda patch: self.patch_workload(kind, namespace, name, patch),
            change,
        )

    def delete_workload(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> None:
        """Delete with propagation Background (the object goes at once; the garbage collector removes its
        pods). With ``uid``, only that incarnation (409 when the name now belongs to another object)."""
        group, version, plural = WORKLOADS[kind]
        options = k8s.V1DeleteOptions(
            propagation_policy="Background", preconditions=k8s.V1Preconditions(uid=uid) if uid else None
        )
        self._request(
            f"delete {kind} {namespace}/{name}",
            self._custom.delete_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            body=options,
            mutating=True,
        )

    def create_workload(self, kind: str, namespace: str, manifest: Mapping[str, Any]) -> Json:
        group, version, plural = WORKLOADS[kind]
        name = manifest.get("metadata", {}).get("name", "?")
        return self._json(
            f"create {kind} {namespace}/{name}",
            self._custom.create_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            dict(manifest),
            mutating=True,
        )

    # -- transport -------------------------------------------------------------------------------------------

    def _json(
        self, what: str, call: Callable[..., Any], *args: Any, mutating: bool = False, **kwargs: Any
    ) -> Json:
        data = self._request(what, call, *args, mutating=mutating, **kwargs)
        try:
            return json.loads(data)
        except ValueError:
            raise errors.BackendError(
                f"{what}: response is not JSON", output=tail(data.decode(errors="replace"))
            ) from None

    def _request(
        self, what: str, call: Callable[..., Any], *args: Any, mutating: bool = False, **kwargs: Any
    ) -> bytes:
        """Run one API call with our timeout; return the raw body, or raise an :mod:`app.domain.errors` type."""
        try:
            response = call(*args, _request_timeout=self._timeout, _preload_content=False, **kwargs)
            try:
                return response.data
            finally:
                response.release_conn()
        except ApiException as exc:
            raise _api_error(what, exc) from None
        except urllib3.exceptions.HTTPError as exc:
            raise _transport_error(what, exc, mutating=mutating) from None


def _read_modify_write(
    what: str, read: Callable[[], Json], write: Callable[[Json], Any], change: Callable[[Json], Json | None]
) -> bool:
    """Read, compute a patch with ``change`` (None: nothing to do), write it with the read resourceVersion as
    a precondition; on 409 start over, at most :data:`CONFLICT_ATTEMPTS` times. Returns whether it wrote."""
    last: errors.Conflict | None = None
    for _ in range(CONFLICT_ATTEMPTS):
        current = read()
        patch = change(current)
        if patch is None:
            return False
        patch.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
        try:
            write(patch)
        except errors.Conflict as exc:
            last = exc
            continue
        return True
    raise errors.Conflict(f"{what}: still conflicting after {CONFLICT_ATTEMPTS} attempts: {last}")


def _same_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all((a.get(k) or "") == (b.get(k) or "") for k in ("key", "value", "effect"))


def _ssl_options(config: k8s.Configuration) -> dict[str, Any]:
    """websocket-client's TLS options from the client's configuration: the same CA, client certificate and
    server name as every other call."""
    options: dict[str, Any] = {"cert_reqs": ssl.CERT_REQUIRED if config.verify_ssl else ssl.CERT_NONE}
    if config.verify_ssl and config.ssl_ca_cert:
        options["ca_certs"] = config.ssl_ca_cert
    if config.cert_file:
        options["certfile"] = config.cert_file
    if config.key_file:
        options["keyfile"] = config.key_file
    if config.tls_server_name:
        options["server_hostname"] = config.tls_server_name
    if config.assert_hostname is not None:
        options["check_hostname"] = config.assert_hostname
    return options


def _exec_result(streams: Mapping[int, bytearray], *, closed: bool) -> ExecResult:
    """The exec's result from its channels. The status channel's Status: Success (0), Failure with an ExitCode
    cause (that code), or Failure without one (the kubelet could not run the command: ``error``)."""
    out, err = (streams[c].decode("utf-8", errors="replace") for c in (STDOUT, STDERR))
    raw = streams[STATUS].decode("utf-8", errors="replace")
    if not closed or not raw:
        return ExecResult(out, err, None, "" if not closed else "the stream closed without a status")
    try:
        status = json.loads(raw)
    except ValueError:
        return ExecResult(out, err, None, f"unreadable status: {raw[:200]}")
    if status.get("status") == "Success":
        return ExecResult(out, err, 0)
    causes = (status.get("details") or {}).get("causes") or []
    code = next((c.get("message") for c in causes if c.get("reason") == "ExitCode"), None)
    if code is not None and str(code).isdigit():
        return ExecResult(out, err, int(code))
    return ExecResult(out, err, None, str(status.get("message") or raw[:200]))


def _api_error(what: str, exc: ApiException, body: str | None = None) -> errors.BackendError:
    """The :mod:`app.domain.errors` type for an HTTP error; the message carries the server's Status message (for a
    403, the RBAC reason: which user cannot do which verb on which resource)."""
    status = exc.status or 0
    if body is None:
        body = exc.body if isinstance(exc.body, str) else ""
    detail = _status_message(body) or exc.reason or "no details"
    if status == 0:
        # The client raises status 0 for TLS failures: nothing reached the API.
        return errors.Unavailable(f"{what}: {detail}")
    message = f"{what}: HTTP {status}: {detail}"
    if status in (401, 403):
        return errors.CredentialRejected(message)
    if status == 404:
        return errors.NotFound(message)
    if status == 409:
        return errors.Conflict(message)
    if status == 429:
        return errors.RateLimited(message, retry_after=_retry_after(exc.headers, body))
    return errors.BackendError(message, output=tail(body))


# Failures before the request could have been sent: nothing happened on the server.
_NOT_SENT = (
    urllib3.exceptions.NewConnectionError,
    urllib3.exceptions.ConnectTimeoutError,
    urllib3.exceptions.SSLError,
    urllib3.exceptions.ProxyError,
)


def _transport_error(what: str, exc: urllib3.exceptions.HTTPError, *, mutating: bool) -> errors.BackendError:
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason else exc
    if isinstance(reason, _NOT_SENT):
        return errors.Unavailable(f"{what}: cannot reach the API server: {reason}")
    if mutating:
        # The request was sent; the server may have applied it.
        return errors.OutcomeUnknown(
            f"{what}: no answer from the API server (it may have applied it): {reason}"
        )
    return errors.Unavailable(f"{what}: no answer from the API server: {reason}")


def _status_message(body: str) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        return body.strip()[:500]
    return str(status.get("message") or "") if isinstance(status, dict) else ""


def _retry_after(headers: Mapping[str, str] | None, body: str) -> float:
    """Seconds to wait: the ``Retry-After`` header, else the Status ``details.retryAfterSeconds``, else 10."""
    header = (headers or {}).get("Retry-After")
    if header and header.strip().isdigit():
        return float(header.strip())
    try:
        seconds = json.loads(body).get("details", {}).get("retryAfterSeconds")
    except (ValueError, AttributeError):
        seconds = None
    return float(seconds) if isinstance(seconds, int) and seconds > 0 else DEFAULT_RETRY_AFTER_SECONDS
