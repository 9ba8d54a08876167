"""Settings: a YAML file plus ``NIGHTSHIFT_*`` environment overrides. The only module that reads the environment.

Secrets are never values in the file: settings name files (``*_file``) and :func:`read_secret` reads them when a
client is built, so a secret never lands in a log, the ledger or ``repr(settings)``.

Environment overrides: ``NIGHTSHIFT_STORE_URL=...`` sets a top-level field, ``NIGHTSHIFT_SLURM__HOST=...`` a field of a
section (double underscore). ``NIGHTSHIFT_CONFIG`` names the YAML file.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.domain import schedulers as scheduling
from app.domain.config_documents import Document, read_documents
from app.domain.errors import ConfigError
from app.domain.fleet import FleetSettings

ENV_PREFIX = "NIGHTSHIFT_"
# Settings naming a local file or directory: written relative in a settings file, they mean relative to that file.
PATH_SUFFIXES = ("_file", "_dir", "_paths")
PATH_NAMES = frozenset({"kubeconfig"})


def shipped_playbooks() -> str:
    """The playbooks that come with Nightshift: a source checkout's (an editable install's too), else the copy
    ``pip install`` puts under ``<prefix>/share/nightshift/playbooks`` (pyproject data-files)."""
    checkout = Path(__file__).resolve().parents[1] / "playbooks"
    return str(checkout if checkout.is_dir() else Path(sys.prefix) / "share" / "nightshift" / "playbooks")


def require_positive(section: str, settings: object, names: tuple[str, ...]) -> None:
    """ConfigError naming ``section.name`` for the first of ``names`` that is not a positive number."""
    for name in names:
        if getattr(settings, name) <= 0:
            raise ConfigError(f"{section}.{name}: must be positive, got {getattr(settings, name)!r}")


@dataclass
class WebhookSettings:
    """Authentication and limits of ``POST /api/v1/alerts``."""

    token_file: str | None = None  # bearer token (Alertmanager http_config.authorization.credentials_file)
    basic_user: str | None = None
    basic_password_file: str | None = None
    auth_disabled: bool = False  # must be set explicitly to accept unauthenticated webhooks
    # The token shipped in examples/webhook.token is public: refused at start unless this is set (`make run` only).
    allow_example_token: bool = False
    max_body_bytes: int = 1_048_576
    max_alerts_per_payload: int = 1000
    # Alerts queued and not yet ingested past which a notification of repeats is answered 503 (Alertmanager retries
    # it); one carrying an alert the store has not seen is still taken, up to twice this (app/engine/inbox.py).
    max_inbox_alerts: int = 50_000
    # Failed authentications per client address: a burst, refilled per minute; then 429 until one is back.
    # Authenticated deliveries are never limited (docs/reliability.md). 0 disables the limit.
    auth_failure_burst: int = 10
    auth_failures_per_minute: float = 6.0


@dataclass
class AccessSettings:
    """Who may read the JSON API and the UI pages; acting always needs the operator token (docs/security.md)."""

    viewer_token_file: str | None = None  # bearer token, and UI login, that may read but not act
    anonymous_read: bool = False  # reads without credentials: set explicitly, like webhook.auth_disabled
    # A user header set by an authenticating proxy (oauth2-proxy: X-Auth-Request-User or X-Forwarded-User),
    # trusted only from the proxy's own addresses or networks; such a user may read.
    proxy_user_header: str | None = None
    proxy_addresses: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if bool(self.proxy_user_header) != bool(self.proxy_addresses):
            raise ConfigError("access: proxy_user_header and proxy_addresses must be set together")


@dataclass
class HttpSettings:
    """Bounds of every HTTP request under ``nightshift serve`` (the buffering worker, app/serving.py)."""

    read_timeout_seconds: float = 10.0  # the whole request (head and body) must arrive within this
    max_header_bytes: int = 32_768  # request line and headers together

    def __post_init__(self) -> None:
        require_positive("http", self, ("read_timeout_seconds", "max_header_bytes"))


@dataclass
class GuardSettings:
    """Defaults of the guard chain; playbooks set budget, cooldown and recheck themselves."""

    kill_switch: bool = False
    blast_radius_max_nodes: int = 3  # distinct nodes taken out (drain, cordon, reboot) within the window
    blast_radius_window_seconds: int = 3600
    # ... and at most this share of the node's Slurm partition or Kubernetes node pool (always at least one node).
    blast_radius_max_share: float = 0.25
    # The Kubernetes node label whose value names a node's pool (its peers carry the same value).
    node_pool_label: str = "node.kubernetes.io/instance-type"
    default_backoff_seconds: int = 600
    defer_seconds: int = 30  # how long a deferred incident waits before the chain runs again
    # Per training job, whatever the fault class: at most this many recoveries within the window, then a person.
    job_recoveries_max: int = 5
    job_recoveries_window_seconds: int = 86400

    def __post_init__(self) -> None:
        if not 0 < self.blast_radius_max_share <= 1:
            raise ConfigError(
                f"guards.blast_radius_max_share: in (0, 1], got {self.blast_radius_max_share!r}"
            )


@dataclass
class PrometheusSettings:
    url: str | None = None
    bearer_token_file: str | None = None
    timeout_seconds: float = 5.0


@dataclass
class GrafanaSettings:
    url: str | None = None
    token_file: str | None = None  # service-account token
    dashboard_uid: str | None = None  # None: organisation annotations, shown by tag queries
    timeout_seconds: float = 5.0


@dataclass
class NotifySettings:
    """Where the engine sends incident summaries (open/close); playbook steps may notify elsewhere."""

    webhook_url: str | None = None
    webhook_url_file: str | None = None  # Slack webhook URLs are secrets
    smtp_host: str | None = None
    smtp_port: int = 25
    smtp_starttls: bool = False
    smtp_user: str | None = None
    smtp_password_file: str | None = None
    email_from: str = "nightshift@localhost"
    email_to: list[str] = field(default_factory=list)
    # PagerDuty Events v2 (the paging channel): pages only when a person is needed (app/domain/paging.py).
    pagerduty_routing_key_file: str | None = None  # the service integration key (32 characters), a secret
    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue"
    timeout_seconds: float = 10.0


@dataclass
class SlurmSettings:
    """SSH access to a Slurm login/controller node."""

    host: str | None = None
    port: int = 22
    # A non-root account (docs/slurm.md); root works but is not recommended. With sudo, a non-root account runs
    # the commands that change Slurm or read a job's log through `sudo -n` (deploy/slurm/sudoers allows exactly
    # those); ignored for root.
    user: str = "nightshift"
    sudo: bool = True
    key_file: str | None = None
    use_agent: bool = False
    known_hosts_file: str | None = None  # default ~/.ssh/known_hosts; unknown host keys are always rejected
    connect_timeout_seconds: float = 10.0
    command_timeout_seconds: float = 60.0
    login_shell: bool = True  # run commands under `bash -lc` so the login environment (SLURM_CONF...) applies
    # Where a command runs ON a node (the repair's validation): this host, "{node}" replaced by the node's name;
    # same port, user and keys as above.
    node_ssh_host: str = "{node}"
    # GET /api/v1/sd/training answers from a cache this old at most (one SSH round trip per window and process).
    discovery_cache_seconds: float = 5.0


@dataclass
class KubernetesSettings:
    kubeconfig: str | None = None  # None: in-cluster config, else the default kubeconfig
    context: str | None = None
    request_timeout_seconds: float = 10.0
    eviction_api_version: str | None = None  # None: let the server pick (works on 1.20 and >= 1.22)


@dataclass
class RepairSettings:
    """The node repair lifecycle: take out, repair, validate, return to service or hold (docs/node-repair.md)."""

    validation_command: str = "dcgmi diag -r 2"  # run on the node; exit 0 = healthy
    validation_timeout_seconds: int = 900  # a validation still running after this has failed
    # How long a node may take to come back from its repair (a reboot) and be validated before it is held.
    return_timeout_seconds: int = 1800
    poll_seconds: int = 15  # how often to look again while a node reboots or a validation pod runs
    # A node repaired this many times within the window is held for a person instead of repaired again.
    lemon_repairs: int = 3
    lemon_window_seconds: int = 7 * 86400
    # Kubernetes: the validation runs in a pod pinned to the node, with this image, in this namespace.
    validation_image: str = "nvcr.io/nvidia/cloud-native/dcgm:3.3.5-1-ubuntu22.04"
    validation_namespace: str = "nightshift"
    # The GPUs it requests: "all" (the node's allocatable count of validation_gpu_resource) or a number.
    validation_gpus: str = "all"
    validation_gpu_resource: str = "nvidia.com/gpu"
    validation_runtime_class: str | None = None  # runtimeClassName (e.g. nvidia); None: the cluster's default
    # The user it runs as: None keeps the image's (root in NVIDIA's DCGM image: parts of dcgmi diag need root);
    # a non-root uid also sets runAsNonRoot, so the pod passes a restricted Pod Security namespace.
    validation_run_as_user: int | None = None

    def __post_init__(self) -> None:
        require_positive(
            "repair",
            self,
            (
                "validation_timeout_seconds",
                "return_timeout_seconds",
                "poll_seconds",
                "lemon_window_seconds",
            ),
        )
        if self.lemon_repairs < 1:
            raise ConfigError(f"repair.lemon_repairs: must be >= 1, got {self.lemon_repairs!r}")
        gpus = str(self.validation_gpus).strip()
        if gpus != "all" and not (gpus.isdigit() and int(gpus) > 0):
            raise ConfigError(
                f"repair.validation_gpus: 'all' or a positive number, got {self.validation_gpus!r}"
            )
        self.validation_gpus = gpus


@dataclass
class CheckpointSettings:
    allowed_roots: list[str] = field(default_factory=list)


@dataclass
class DiagnosisSettings:
    """How sure app/domain/diagnosis must be before it names a fault."""

    # Below this confidence the verdict is `unknown` (or `benign`), with what was seen in the summary.
    confidence_floor: float = 0.35

    def __post_init__(self) -> None:
        if not 0 <= self.confidence_floor <= 1:
            raise ConfigError(f"diagnosis.confidence_floor: in [0, 1], got {self.confidence_floor!r}")


@dataclass
class EpisodeSettings:
    """How alerts of one training job become one failure episode (one job incident), and its culprit nodes."""

    # Alerts naming the same job within this window form one incident, which waits the window out before acting
    # unless a culprit node is already known (a node-scoped alert such as an Xid on a node of the job).
    correlation_seconds: int = 45
    # More culprits than this, or than this share of the job's nodes, and none is excluded: a person decides
    # (a fault that seems to be everywhere is rarely in the nodes).
    max_culprits: int = 2
    max_culprit_share: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.correlation_seconds <= 3600:
            raise ConfigError(f"episodes.correlation_seconds: 0..3600, got {self.correlation_seconds!r}")
        if self.max_culprits < 0:
            raise ConfigError(f"episodes.max_culprits: must be >= 0, got {self.max_culprits!r}")
        if not 0 < self.max_culprit_share <= 1:
            raise ConfigError(f"episodes.max_culprit_share: in (0, 1], got {self.max_culprit_share!r}")


@dataclass
class WorkerSettings:
    poll_seconds: float = 1.0
    lease_seconds: int = 120
    # Alerts ingested from the inbox per transaction (several notifications of one lane when they fit): bounds
    # how long the worker holds SQLite's one write lock, which the webhook needs to answer (about 0.15 ms an alert
    # on 2 cores, bench/README.md "Storms"), against the cost of a transaction, paid once a batch.
    inbox_batch_alerts: int = 64
    step_retry_limit: int = 5
    # An incident whose processing raises this many times in a row goes to a person, the error in its ledger.
    max_tick_errors: int = 5

    def __post_init__(self) -> None:
        require_positive(
            "worker", self, ("poll_seconds", "lease_seconds", "inbox_batch_alerts", "max_tick_errors")
        )


@dataclass
class StoreSettings:
    """Bounds on every wait for the store (docs/reliability.md, "Waits and timeouts")."""

    # A write waits this long for another writer's lock (SQLite: the writer lock and busy handler; PostgreSQL:
    # lock_timeout and the connection pool), then fails with 503 on the webhook, which Alertmanager retries.
    lock_timeout_seconds: float = 5.0
    statement_timeout_seconds: float = 30.0  # PostgreSQL statement_timeout: no query runs longer

    def __post_init__(self) -> None:
        require_positive("store", self, ("lock_timeout_seconds", "statement_timeout_seconds"))


@dataclass
class RetentionSettings:
    """What the worker prunes from the store, and when (docs/reliability.md, "Retention"). Never an open incident,
    an open or held node repair, or a row one of them references."""

    enabled: bool = True
    # Closed incidents (with their alerts' links, attempts, steps and ledger), settled node repairs and the ledger
    # rows of no incident, this many days after they closed: at least every window the guards read back.
    incidents_days: int = 400
    # Alert instances not notified for this many days, set-aside notifications and the ledger's per-alert rows
    # (longer than Alertmanager's repeat_interval: a repeat of a forgotten instance would be a new alert).
    alerts_days: int = 30
    interval_seconds: int = 3600  # how often a pass starts (one worker at a time)
    batch_rows: int = 500  # rows of one kind deleted per transaction (an incident's own rows go with it)
    # Set: each batch is appended to <export_dir>/pruned-<UTC date>.jsonl (one {"table", "row"} object a line)
    # before it is deleted; a failed write deletes nothing.
    export_dir: str | None = None

    def __post_init__(self) -> None:
        for name, low, high in RETENTION_BOUNDS:
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"retention.{name}: {low}..{high}, got {value!r}")


ADVICE_WINDOW_SECONDS = (
    30 * 86400
)  # the job failures the checkpoint advice counts (app/engine/checkpoint_facts.py)
# Documented bounds of the retention settings (docs/reliability.md): at least the checkpoint advice's 30 days of
# incidents, at least a day of alerts (Alertmanager repeats a firing alert every few hours).
RETENTION_BOUNDS = (
    ("incidents_days", 30, 36_500),
    ("alerts_days", 1, 36_500),
    ("interval_seconds", 60, 86_400),
    ("batch_rows", 1, 10_000),
)


@dataclass
class Settings:
    """Everything configurable. Build with :func:`load_settings`; tests build it directly."""

    data_dir: str = "var"
    store_url: str | None = None  # default: SQLite (WAL) in data_dir
    playbook_paths: list[str] = field(
        default_factory=lambda: [shipped_playbooks()]
    )  # default: the shipped ones
    permissions_file: str | None = None  # None: nothing whitelisted, advisory mode
    operator_token_file: str | None = None  # protects pause/resume/approve
    external_url: str = "http://127.0.0.1:8080"
    embedded_worker: bool = True  # `nightshift serve` runs a worker thread in each gunicorn worker
    log_level: str = "INFO"
    log_format: str = "text"  # or "json": one object a line for log shippers (app/logging_setup.py)
    # The schedulers this deployment acts on (slurm, kubernetes): playbooks for any other are never loaded.
    schedulers: list[str] = field(default_factory=lambda: list(scheduling.NAMES))
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    access: AccessSettings = field(default_factory=AccessSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    guards: GuardSettings = field(default_factory=GuardSettings)
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    grafana: GrafanaSettings = field(default_factory=GrafanaSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    diagnosis: DiagnosisSettings = field(default_factory=DiagnosisSettings)
    repair: RepairSettings = field(default_factory=RepairSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    episodes: EpisodeSettings = field(default_factory=EpisodeSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)

    def __post_init__(self) -> None:
        level = str(self.log_level).upper()
        if level not in LOG_LEVELS:
            raise ConfigError(f"log_level: {self.log_level!r} is not a level{_did_you_mean(level, LOG_LEVELS)} "
                              f"(one of {', '.join(LOG_LEVELS)})")  # fmt: skip
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"log_format: {self.log_format!r}{_did_you_mean(self.log_format, LOG_FORMATS)} "
                f"(one of {', '.join(LOG_FORMATS)})"
            )
        check_ranges(self)
        known = scheduling.NAMES
        bad = [s for s in self.schedulers if s not in known]
        if bad or not self.schedulers or len(set(self.schedulers)) != len(self.schedulers):
            raise ConfigError(
                f"schedulers: one or both of {', '.join(known)}, each once; got {self.schedulers!r}"
            )
        self.check_retention(self.history_windows())

    def history_windows(self) -> list[tuple[str, float]]:
        """``(setting, seconds)`` of every window the guards, the lemon rule and the checkpoint advice read back
        through closed history (app/domain/retention.py adds each playbook's)."""
        return [
            ("guards.blast_radius_window_seconds", self.guards.blast_radius_window_seconds),
            ("guards.job_recoveries_window_seconds", self.guards.job_recoveries_window_seconds),
            ("repair.lemon_window_seconds", self.repair.lemon_window_seconds),
            ("the checkpoint advice's window (30 days)", ADVICE_WINDOW_SECONDS),
        ]

    def check_retention(self, windows: Iterable[tuple[str, float]]) -> None:
        """ConfigError naming the first of ``windows`` longer than ``retention.incidents_days`` keeps closed
        history (nothing to check when retention is off)."""
        if not self.retention.enabled:
            return
        days = self.retention.incidents_days
        for where, seconds in windows:
            if seconds > days * 86400:
                raise ConfigError(
                    f"{where}: reads back {seconds / 86400:g} days, more than retention.incidents_days keeps "
                    f"({days}); raise retention.incidents_days or shorten the window"
                )

    @property
    def resolved_store_url(self) -> str:
        if self.store_url:
            return self.store_url
        return f"sqlite:///{Path(self.data_dir).resolve() / 'nightshift.db'}"


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
# Numbers that must be above 0 (0 would mean "never" or "at once" where that makes no sense); every other number
# of the settings must be at least 0. Ports are 1..65535. Sections check their own finer bounds too.
POSITIVE = frozenset(
    {
        "guards.defer_seconds",
        "guards.blast_radius_window_seconds",
        "guards.job_recoveries_window_seconds",
        "prometheus.timeout_seconds",
        "grafana.timeout_seconds",
        "notify.timeout_seconds",
        "slurm.connect_timeout_seconds",
        "slurm.command_timeout_seconds",
        "kubernetes.request_timeout_seconds",
        "webhook.max_body_bytes",
        "webhook.max_alerts_per_payload",
        "webhook.max_inbox_alerts",
    }
)
PORTS = frozenset({"slurm.port", "notify.smtp_port"})


def check_ranges(settings: Settings) -> None:
    """ConfigError naming the first number of ``settings`` out of its range (see :data:`POSITIVE`)."""
    for section in dataclasses.fields(settings):
        value = getattr(settings, section.name)
        if not dataclasses.is_dataclass(value):
            continue
        for item in dataclasses.fields(value):
            number = getattr(value, item.name)
            if isinstance(number, bool) or not isinstance(number, int | float):
                continue
            name = f"{section.name}.{item.name}"
            if name in PORTS and not 1 <= number <= 65535:
                raise ConfigError(f"{name}: a port is 1..65535, got {number!r}")
            if name in POSITIVE and number <= 0:
                raise ConfigError(f"{name}: must be positive, got {number!r}")
            if number < 0:
                raise ConfigError(f"{name}: must be at least 0, got {number!r}")


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def local_files(settings: Settings) -> list[tuple[str, str]]:
    """``(dotted.name, path)`` of every local file the settings name (``*_file`` and the kubeconfig), set ones
    only: what must be readable before the server starts."""
    found = []
    for section in (settings, *(getattr(settings, f.name) for f in dataclasses.fields(settings))):
        if not dataclasses.is_dataclass(section):
            continue
        prefix = (
            ""
            if section is settings
            else next(
                f"{f.name}." for f in dataclasses.fields(settings) if getattr(settings, f.name) is section
            )
        )
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, str) and value and (f.name.endswith("_file") or f.name in PATH_NAMES):
                found.append((prefix + f.name, value))
    return found


def read_secret(path: str | None, what: str) -> str | None:
    """The stripped content of a secret file, or None when no file is configured."""
    if not path:
        return None
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read secret file {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(f"{what}: secret file {path} is empty")
    return value


def load_settings(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Settings from ``path`` (or ``$NIGHTSHIFT_CONFIG``), then environment overrides."""
    env = os.environ if env is None else env
    path = path or env.get(f"{ENV_PREFIX}CONFIG")
    data: dict[str, Any] = {}
    document: Document | None = None
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
        documents, errors = read_documents(text, str(path))
        if errors:
            raise ConfigError("\n".join(errors))
        if len(documents) > 1:
            raise ConfigError(f"{path}:{documents[1].line}: one YAML document expected, found several")
        document = documents[0] if documents else None
        if document is not None and not isinstance(document.data, dict):
            raise ConfigError(f"{path}:{document.line}: settings must be a mapping")
        data = _resolve_paths(document.data if document else {}, Path(path).resolve().parent)
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key == f"{ENV_PREFIX}CONFIG":
            continue
        parts = key[len(ENV_PREFIX) :].lower().split("__")
        target = data
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    try:
        return _build(Settings, data, where="")
    except ConfigError as exc:
        raise ConfigError(_located(str(exc), path, document)) from None


_DOTTED = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*):")


def _located(message: str, path: Any, document: Document | None) -> str:
    """``file:line: message`` for a message about a dotted setting written in the file; as it is otherwise (a
    value from the environment, or no file)."""
    match = _DOTTED.match(message)
    if not path or document is None or match is None:
        return message
    key = tuple(match.group(1).split("."))
    for end in range(len(key), 0, -1):
        if key[:end] in document.lines:
            return f"{path}:{document.lines[key[:end]]}: {message}"
    return f"{path}: {message}"


def _is_path(key: str) -> bool:
    return key in PATH_NAMES or key.endswith(PATH_SUFFIXES)


def _resolve_paths(data: Any, base: Path) -> Any:
    """``data`` with every relative local path (:data:`PATH_SUFFIXES`) made absolute against ``base``, the
    settings file's directory: the same file means the same files whatever the current directory."""
    if not isinstance(data, dict):
        return data

    def resolve(value: Any) -> Any:
        if isinstance(value, str) and value:
            return os.path.normpath(base / Path(value).expanduser())
        return value

    out: dict[Any, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            value = _resolve_paths(value, base)
        elif isinstance(key, str) and _is_path(key):
            value = [resolve(item) for item in value] if isinstance(value, list) else resolve(value)
        out[key] = value
    return out


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        key = str(unknown[0])
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"{_join(where, key)}: unknown setting ({hint}known{' in ' + where if where else ''}: "
            f"{', '.join(sorted(known))})"
        )
    kwargs = {name: _coerce(hints[name], value, _join(where, name)) for name, value in data.items()}
    return cls(**kwargs)


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if value is None:
            return None
        inner = next(a for a in args if a is not type(None))
        return _coerce(inner, value, where)
    origin = typing.get_origin(hint)
    if origin is list:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list")
        return [_coerce(args[0], item, where) for item in value]
    if hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected a boolean, got {value!r}")
    if hint in (int, float):
        number: Any = None
        if not isinstance(value, bool):
            try:
                number = float(value) if hint is float or isinstance(value, float) else int(value)
            except (TypeError, ValueError):
                number = None
        if hint is int and isinstance(number, float):
            number = int(number) if number.is_integer() else None  # 1.9 is not 1
        if number is None or number != number or number in (float("inf"), float("-inf")):
            word = "an integer" if hint is int else "a number"
            raise ConfigError(f"{where}: expected {word}, got {value!r}") from None
        return number
    if hint is str:
        if isinstance(value, dict | list):
            raise ConfigError(f"{where}: expected a string")
        return str(value)
    return value
