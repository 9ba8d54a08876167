"""``nightshift``: init | check-config | serve | worker | lint | explain | diagnose | replay | export | actions |
inbox | fleet (README.md, "CLI"; exit codes: 0 fine, 1 problems found or a verdict needing a person, 2 usage or
settings)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from app.domain import schedulers as scheduling
from app.domain.errors import ConfigError, NightshiftError, PayloadError
from app.domain.states import StepStatus

if TYPE_CHECKING:  # the store is imported by the commands that open it
    from app.store.rows import AlertRow

config_option = click.option(
    "--config",
    "-c",
    "config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Settings YAML (default: $NIGHTSHIFT_CONFIG).",
)


def _settings(config: str | None):
    from app.config import load_settings

    settings = load_settings(config)
    from app.logging_setup import configure_logging

    configure_logging(settings.log_format, settings.log_level)
    return settings


# Settings the environment gives besides a file: with none of these and no file, a start runs on defaults alone.
_NOT_SETTINGS = {"NIGHTSHIFT_CONFIG", "NIGHTSHIFT_LOG_LEVEL"}


def _settings_file(config: str | None) -> None:
    """serve, worker and check-config need settings: a file (-c or $NIGHTSHIFT_CONFIG), or at least NIGHTSHIFT_*
    overrides; without either, say so plainly rather than what the defaults lack."""
    if config or os.environ.get("NIGHTSHIFT_CONFIG"):
        return
    if any(key.startswith("NIGHTSHIFT_") and key not in _NOT_SETTINGS for key in os.environ):
        return
    raise ConfigError(
        "no settings file: pass -c FILE or set NIGHTSHIFT_CONFIG "
        "(`nightshift init` writes one, nightshift-config/settings.yaml; every key: examples/settings.yaml)"
    )


def _log_startup(settings: Any, engine: Any) -> None:
    """The startup summary (app/domain/startup.py), one INFO line each."""
    from app.domain.startup import startup_summary

    log = logging.getLogger("app.domain.startup")
    playbooks = engine.deps.playbooks
    for line in startup_summary(settings, len(playbooks), engine.deps.permissions, len(playbooks.excluded)):
        log.info("%s", line)
    if settings.retention.enabled and engine.deps.store.auto_vacuum() == "none":
        log.info(
            "store: created with auto_vacuum=NONE: retention's freed pages are reused but the file never shrinks "
            "(docs/reliability.md, Retention, says how to switch)"
        )


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("NIGHTSHIFT_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        # Without standalone mode click returns the code of a raised Exit instead of exiting.
        code = cli(standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except NightshiftError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if isinstance(code, int):
        sys.exit(code)


@click.group()
@click.version_option(package_name="nightshift", message="nightshift %(version)s")
def cli() -> None:
    """Nightshift keeps multi-day GPU training jobs alive: Alertmanager webhooks to guarded, audited remediation."""


@cli.command()
@config_option
@click.option("--bind", default="127.0.0.1:8080", show_default=True)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="gunicorn worker processes [default: 1 on SQLite, whose writes serialise anyway; 2 on PostgreSQL]",
)
@click.option("--threads", default=8, show_default=True, help="threads per gunicorn worker")
def serve(config: str | None, bind: str, workers: int | None, threads: int) -> None:
    """Run the webhook, API and UI under gunicorn, with a worker thread in each gunicorn worker."""
    from gunicorn.app.base import BaseApplication

    _settings_file(config)
    settings = _settings(config)
    if workers is None:
        workers = 1 if settings.resolved_store_url.startswith("sqlite") else 2
    metrics_dir = Path(settings.data_dir) / "prometheus-multiproc"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir.resolve())
    from app import create_app, gunicorn_conf

    checked = create_app(settings)  # fail fast in the master on bad settings, playbooks or store
    _log_startup(settings, checked.extensions["nightshift"].engine)

    class Server(BaseApplication):
        def load_config(self) -> None:
            options = {
                "bind": bind,
                "workers": workers,
                "threads": threads,
                "worker_class": gunicorn_conf.worker_class,  # gthread behind a front buffer
                "timeout": 60,
                "graceful_timeout": 30,
                "accesslog": "-",
                "post_worker_init": gunicorn_conf.post_worker_init,
                "worker_exit": gunicorn_conf.worker_exit,
                "child_exit": gunicorn_conf.child_exit,
                "logger_class": gunicorn_conf.logger_class,
            }
            if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 27: one socket per host otherwise
                options["control_socket_disable"] = True
            for key, value in options.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            return create_app(settings)

    Server().run()


INIT_SETTINGS = """\
# Written by `nightshift init`. Every key: examples/settings.yaml. Relative paths are relative to this file.
data_dir: var                        # the SQLite store, next to this file
webhook: {{token_file: webhook.token}}   # Alertmanager sends this token (http_config.authorization)
access: {{viewer_token_file: viewer.token}}   # reads: the API and the UI (Authorization: Bearer ...)
operator_token_file: operator.token  # acting by hand: pause, resume, approve, release
permissions_file: null               # advisory: nothing is granted, every change is recorded as "would run"
prometheus: {{url: {prometheus}}}{prometheus_note}
slurm: {{host: {slurm_host}}}{slurm_note}
"""
TOKENS = ("webhook", "viewer", "operator")


@cli.command()
@click.argument("directory", default="nightshift-config", type=click.Path(file_okay=False))
@click.option(
    "--prometheus", "prometheus_url", default=None, help="Prometheus URL (re-checks, verification)."
)
@click.option("--slurm-host", default=None, help="The Slurm login host Nightshift reaches over SSH.")
@click.option("--force", is_flag=True, help="Overwrite an existing settings file and tokens.")
def init(directory: str, prometheus_url: str | None, slurm_host: str | None, force: bool) -> None:
    """Write DIRECTORY/settings.yaml (advisory) with three distinct random tokens beside it (webhook, viewer,
    operator; mode 0600), check it loads, and print how to start and read it."""
    import secrets

    from app.config import load_settings

    root = Path(directory)
    files = [root / "settings.yaml", *(root / f"{name}.token" for name in TOKENS)]
    existing = [str(path) for path in files if path.exists()]
    if existing and not force:
        raise click.UsageError(f"{', '.join(existing)} already exist(s); --force overwrites")
    root.mkdir(parents=True, exist_ok=True)
    for name in TOKENS:
        path = root / f"{name}.token"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
    (root / "settings.yaml").write_text(
        INIT_SETTINGS.format(
            prometheus=json.dumps(prometheus_url) if prometheus_url else "null",
            prometheus_note="" if prometheus_url else "   # unset: no live re-check or verification",
            slurm_host=json.dumps(slurm_host) if slurm_host else "null",
            slurm_note="" if slurm_host else "           # unset: Slurm actions cannot run (docs/slurm.md)",
        )
    )
    load_settings(root / "settings.yaml", env={})
    config = root / "settings.yaml"
    click.echo(f"wrote {', '.join(map(str, files))}")
    click.echo("next:")
    click.echo(f"  nightshift check-config -c {config}")
    click.echo(f"  nightshift serve -c {config}")
    click.echo(
        f'  curl -H "Authorization: Bearer $(cat {root}/viewer.token)" localhost:8080/api/v1/incidents'
    )
    click.echo(
        f'  curl -X POST -H "Authorization: Bearer $(cat {root}/webhook.token)" -H "Content-Type: application/json" '
        "--data @alerts/examples/gpu-xid-79.json localhost:8080/api/v1/alerts"
    )


@cli.command("check-config")
@config_option
@click.option(
    "--json", "as_json", is_flag=True, help="The summary, or the problems (file, line, message), as JSON."
)
def check_config(config: str | None, as_json: bool) -> None:
    """Run the checks `serve` runs before it opens the store (app/preflight.py: settings, every file they name,
    tokens, playbooks, permissions), touching no store, network or cluster; print what is configured. Exit 0:
    `serve` would start with them; 2: it would not (the reason, file:line where there is one). The Helm chart
    runs it before the server starts."""
    from app.config import load_settings
    from app.domain.startup import startup_summary
    from app.preflight import preflight

    try:
        _settings_file(config)
        settings = load_settings(config)
        checked = preflight(settings)
    except NightshiftError as exc:
        if not as_json:
            raise
        errors = getattr(exc, "errors", None) or str(exc).splitlines()
        click.echo(json.dumps({"ok": False, "problems": [located(line) for line in errors]}, indent=2))
        raise click.exceptions.Exit(2) from None
    playbooks = checked.playbooks
    summary = startup_summary(settings, len(playbooks), checked.permissions, len(playbooks.excluded))
    if as_json:
        click.echo(json.dumps({"ok": True, "summary": summary}, indent=2))
    else:
        click.echo(
            "\n".join([*summary, f"ok: {config or os.environ.get('NIGHTSHIFT_CONFIG') or 'defaults'}"])
        )


@cli.command()
@config_option
def worker(config: str | None) -> None:
    """Run only the incident worker (no HTTP), e.g. as a separate deployment."""
    from app import build_engine
    from app.worker import run_worker

    _settings_file(config)
    settings = _settings(config)
    engine = build_engine(settings)
    _log_startup(settings, engine)
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()
        engine.wakeup.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    engine.wakeup.listen()  # a webhook on this host wakes it as soon as it accepts a notification
    try:
        run_worker(engine, stop, settings.worker.poll_seconds, kind="process")
    finally:
        engine.wakeup.close()


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--permissions",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Also check a permissions file.",
)
@click.option("--strict", is_flag=True, help="Warnings are problems too (exit 1).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: the counts, and each problem and warning as data.",
)
@click.option(
    "--schedulers",
    default=",".join(scheduling.NAMES),
    show_default=True,
    help="The deployment's setting `schedulers`, comma-separated: playbooks for others are checked, not counted.",
)
def lint(
    paths: tuple[str, ...], permissions: str | None, strict: bool, as_json: bool, schedulers: str
) -> None:
    """Check playbook files; print file:line: message for every problem and warning.

    Every playbook is checked; the count is of those a deployment acting on ``--schedulers`` loads.
    Exit 0: no problem (warnings allowed unless --strict); 1: problems found; 2: usage."""
    from app.actions import default_registry
    from app.alert_labels import alert_labels
    from app.domain.permissions import load_permissions
    from app.domain.playbook_warnings import warnings
    from app.domain.playbooks import PlaybookError, load_playbooks

    chosen = [name.strip() for name in schedulers.split(",") if name.strip()]
    if not chosen or not set(chosen) <= set(scheduling.NAMES):
        raise click.BadParameter(
            f"one or both of {', '.join(scheduling.NAMES)}, got {schedulers!r}", param_hint="--schedulers"
        )
    registry = default_registry()
    problems: list[str] = []
    found: list[str] = []
    count = set_aside = 0
    try:
        loaded = load_playbooks(list(paths), registry, chosen)
        count, set_aside = len(loaded), len(loaded.excluded)
        found = warnings([*loaded.playbooks, *loaded.excluded], alert_labels())
        if not count + set_aside:
            problems.append(f"{', '.join(paths)}: no playbook found (*.yaml or *.yml files)")
    except PlaybookError as exc:
        problems.extend(exc.errors)
    if permissions:
        try:
            load_permissions(permissions, registry)
        except ConfigError as exc:
            problems.extend(getattr(exc, "errors", [str(exc)]))
    failed = bool(problems or (strict and found))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": not failed,
                    "playbooks": count,
                    "schedulers": chosen,
                    "other_schedulers": set_aside,
                    "problems": [located(line) for line in problems],
                    "warnings": [located(line) for line in found],
                },
                indent=2,
            )
        )
        if failed:
            raise click.exceptions.Exit(1)
        return
    for line in [*found, *problems]:
        click.echo(line)
    if failed:
        raise click.exceptions.Exit(1)
    click.echo(
        f"ok: {count} playbook(s) for {', '.join(chosen)}"
        + (f" ({set_aside} for other schedulers checked, not loaded)" if set_aside else "")
        + (f", {len(found)} warning(s)" if found else "")
    )


_LOCATED = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): (?:warning: )?(?P<message>.*)$", re.S)


def located(text: str) -> dict[str, Any]:
    """A ``file:line: message`` line as data; ``file`` and ``line`` None when the text names no line."""
    match = _LOCATED.match(text)
    if match is None:
        return {"file": None, "line": None, "message": text}
    return {"file": match["file"], "line": int(match["line"]), "message": match["message"]}


def _action_kind(action: Any) -> str:
    return (
        "read-only"
        if action.read_only
        else "return-to-service"
        if action.return_to_service
        else "changes state"
    )


def actions_table() -> str:
    """The registry as a Markdown table (docs/playbooks.md embeds it; a test keeps the two equal)."""
    from app.actions import default_registry

    rows = ["| action | parameters (? = optional) | kind | what it does |", "|---|---|---|---|"]
    for action in default_registry():
        params = ", ".join(
            name + ("" if spec.required and spec.default is None else "?")
            for name, spec in action.params.items()
        )
        rows.append(f"| `{action.name}` | {params} | {_action_kind(action)} | {action.description} |")
    return "\n".join(rows)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="A JSON list: each action's name, parameters and kind.")
def actions(as_json: bool) -> None:
    """List the registered actions, their parameters and whether they need a grant (read-only ones do not)."""
    from app.actions import default_registry

    if not as_json:
        click.echo(actions_table())
        return
    listed = [
        {
            "name": action.name,
            "kind": _action_kind(action),
            "description": action.description,
            "params": [
                {"name": name, "required": spec.required and spec.default is None, "default": spec.default}
                for name, spec in action.params.items()
            ],
        }
        for action in default_registry()
    ]
    click.echo(json.dumps(listed, indent=2, default=str))


@cli.command()
@config_option
@click.argument("payloads", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--playbooks",
    "playbook_paths",
    multiple=True,
    type=click.Path(exists=True),
    help="Playbook files or directories instead of the settings' playbook_paths (repeatable).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (a list, one report a payload)."
)
def explain(
    config: str | None, payloads: tuple[str, ...], playbook_paths: tuple[str, ...], as_json: bool
) -> None:
    """Show the playbook, guard verdicts and steps each payload would get, decided as the worker decides. Writes
    nothing and runs no step; reads the job's state and the node's partition/pool from the scheduler when one is
    configured (so ``when: job_phase=...`` branches as the worker's do); no store (an empty history).

    Exit 0; 1 when a plan's verdict needs a person (needs_human); 2 on a bad payload or settings."""
    from app import build_engine
    from app.actions import default_registry
    from app.domain.alertmanager import parse_notification
    from app.domain.playbooks import load_playbooks
    from app.store import Store

    settings = _settings(config)
    registry = default_registry()
    notifications = []
    for payload in payloads:
        try:
            notifications.append(parse_notification(Path(payload).read_bytes()))
        except PayloadError as exc:
            raise click.UsageError(f"{payload}: {exc}") from None
    engine = build_engine(
        settings,
        store=Store.unread(),
        registry=registry,
        playbooks=load_playbooks(
            list(playbook_paths) or settings.playbook_paths, registry, settings.schedulers
        ),
    )
    reports = [engine.explain(notification) for notification in notifications]
    if as_json:
        click.echo(json.dumps(reports if len(reports) > 1 else reports[0], indent=2, default=str))
    else:
        for payload, report in zip(payloads, reports, strict=True):
            if len(reports) > 1:
                click.echo(f"== {payload}")
            _print_explained(report)
    if any(_needs_a_person(report) for report in reports):
        raise click.exceptions.Exit(1)


def _needs_a_person(report: dict[str, Any]) -> bool:
    for episode in report.get("episodes", []):
        plans = [episode.get("job_plan") or episode.get("plan") or {}, *episode.get("node_plans", [])]
        if any(str(plan.get("outcome", "")).startswith("needs_human") for plan in plans):
            return True
    return False


def _print_explained(report: dict[str, Any]) -> None:
    for entry in report["alerts"]:
        labels = entry["alert"]
        click.echo(
            f"alert {labels.get('alertname')} [{entry['status']}] "
            + " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
        )
        for key in entry["episodes"]:
            click.echo(f"  joins {key}")
        for error in entry["errors"]:
            click.echo(f"  invalid: {error}")
        if entry.get("job_lookup"):
            click.echo(f"  job from the API: {entry['job_lookup']}")
        for note in entry.get("not_loaded", []):
            click.echo(f"  {note}")
        if entry.get("note"):
            click.echo(f"  {entry['note']}")
    for ep in report["episodes"]:
        click.echo(
            f"episode {ep['episode']} ({ep['kind']}): {len(ep['alerts'])} alert(s): {', '.join(ep['alerts'])}"
        )
        click.echo(f"  playbook {ep['playbook']} ({_relative(ep['source'])})")
        click.echo(f"    target: {json.dumps(ep['target'], sort_keys=True)}")
        d = ep["diagnosis"]
        click.echo(f"    diagnosis: {d['category']} ({d['confidence']:.2f}) {d['summary']}")
        click.echo(f"    culprits: {', '.join(ep['culprits']) or 'none named'}")
        _print_steps("    collect: ", ep["collect"])
        plan = ep["job_plan"]
        if plan is not None:
            if plan["correlation"]:
                click.echo(f"    correlation: {plan['correlation']}")
            if plan["scheduler"]:
                click.echo(f"    scheduler: {plan['scheduler']}")
            if plan["exclusion_note"]:
                click.echo(f"    excludes {', '.join(plan['excluded'])}: {plan['exclusion_note']}")
            for verdict in plan["guards"]:
                click.echo(f"    guard {verdict['guard']}: {verdict['decision']}: {verdict['reason']}")
            if plan["recheck"]:
                click.echo(f"    recheck (live, before acting): {plan['recheck']}")
            _print_steps("    ", plan["steps"])
            if plan["verify"]:
                click.echo(f"    verify: {plan['verify']}")
            click.echo(f"    => {plan['outcome']}")
        for node_plan in ep["node_plans"]:
            click.echo(f"  node {node_plan['node']} (repair by {node_plan['playbook']})")
            _print_steps("    ", node_plan["steps"])
            for verdict in node_plan.get("guards", ()):
                click.echo(f"    guard {verdict['guard']}: {verdict['decision']}: {verdict['reason']}")
            if node_plan.get("recheck"):
                click.echo(f"    recheck (live, before taking it out): {node_plan['recheck']}")
            click.echo(f"    => {node_plan['outcome']}")


def _relative(source: str) -> str:
    """``path:line`` with the path relative to the current directory when it lies under it (shorter, and the same
    on every machine for a checkout's own playbooks)."""
    path, _, line = source.rpartition(":")
    shown = os.path.relpath(path) if path and os.path.isabs(path) else path
    return f"{shown if shown and not shown.startswith('..') else path}:{line}"


def _print_steps(indent: str, steps: list[dict[str, Any]]) -> None:
    for step in steps:
        detail = step["command"] or step["reason"]
        click.echo(f"{indent}step {step['name']} [{step['status']}] {step['summary']}")
        for line in detail.splitlines():
            click.echo(f"{indent}  {line}")
        if step["status"] == StepStatus.WOULD_RUN and step["reason"]:
            click.echo(f"{indent}  not run: {step['reason']}")


@cli.command()
@config_option
@click.argument("alert_id", type=int)
def replay(config: str | None, alert_id: int) -> None:
    """Re-feed a stored alert (by its id in the store) into the engine as a fresh notification; prints the incidents
    it opened, joined and closed, and when none, why (a `note`)."""
    from app import build_engine
    from app.domain.alertmanager import Alert, Notification
    from app.store import records

    engine = build_engine(_settings(config))
    with engine.deps.store.transaction() as conn:
        row = records.get_alert(conn, alert_id)
    if row is None:
        raise click.ClickException(f"alert {alert_id} not found")
    alert = Alert(
        status=row.status,
        labels=row.labels,
        annotations=row.annotations,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        generator_url=row.generator_url,
        fingerprint=row.fingerprint,
    )
    notification = Notification(
        receiver=row.receiver,
        status=row.status,
        alerts=(alert,),
        group_labels={},
        common_labels={},
        common_annotations={},
        external_url="",
        version="4",
        group_key=f"replay:{alert_id}",
        truncated_alerts=0,
    )
    result = engine.ingest(notification)
    report: dict[str, Any] = {"opened": result.opened, "attached": result.attached, "closed": result.closed}
    if not (result.opened or result.attached or result.closed):
        report["note"] = _why_nothing(engine, alert_id, row)
    click.echo(json.dumps(report))


def _why_nothing(engine: Any, alert_id: int, row: AlertRow) -> str:
    """Why replaying alert ``alert_id`` opened, joined and closed nothing, from the store."""
    from app.store import records

    with engine.deps.store.transaction() as conn:
        incidents = records.incidents_for_alert(conn, alert_id)
    if incidents:
        told = ", ".join(
            f"#{i.id} ({i.playbook}): "
            + (f"open, {i.state}" if i.open_key else f"closed {i.outcome} at {i.closed_at:%Y-%m-%d %H:%M:%S}")
            for i in incidents
        )
        return (
            f"alert {alert_id} already belongs to incident {told}; a repeat of an alert whose incident has closed "
            "is not a new fault, and one whose incident is open is already in it"
        )
    if row.status == "resolved":
        return f"alert {alert_id} is resolved: a resolved alert opens nothing"
    if not engine.deps.playbooks.match(row.labels):
        return f"alert {alert_id}: no loaded playbook matches its labels (nightshift explain says more)"
    return f"alert {alert_id}: its playbooks opened nothing (the ledger says why; nightshift explain shows the plan)"


@cli.command()
@config_option
@click.option("--after-id", default=0, show_default=True, help="Only ledger rows after this id.")
@click.option(
    "--prunable",
    is_flag=True,
    help="Instead of the ledger: every row, of every table, that a retention pass would delete now.",
)
def export(config: str | None, after_id: int, prunable: bool) -> None:
    """Write the ledger as JSON lines to stdout; with --prunable, what retention would delete now, one
    {"table": ..., "row": {...}} object a line (docs/reliability.md, "Retention"). Reads only."""
    from app import build_engine
    from app.domain.retention import cutoffs
    from app.store import records, retention

    settings = _settings(config)
    engine = build_engine(settings)
    with engine.deps.store.read() as conn:
        if prunable:
            cut = cutoffs(settings.retention, engine.deps.clock.now())
            for found in retention.prunable(conn, cut, settings.retention.batch_rows):
                for line in retention.jsonl(found):
                    click.echo(line)
            return
        for row in records.iter_ledger(conn, after_id=after_id):
            click.echo(json.dumps(row.as_dict(), default=str, sort_keys=True))


@cli.command()
@config_option
@click.option(
    "--retry", is_flag=True, help="Queue the set-aside notifications again, from where they stopped."
)
def inbox(config: str | None, retry: bool) -> None:
    """Notifications waiting for the worker, and those set aside because their ingestion failed."""
    from app import build_engine
    from app.engine import transitions
    from app.store import records

    engine = build_engine(_settings(config))
    if retry:
        with engine.deps.store.transaction() as conn:
            count = transitions.inbox_retried(conn, engine.deps.clock.now())
        click.echo(f"{count} notification(s) queued again")
        return
    with engine.deps.store.read() as conn:
        stats = records.inbox_stats(conn)
        failed = records.failed_inbox(conn)
    click.echo(json.dumps({**stats, "set_aside": failed}, default=str, indent=2))


@cli.group(invoke_without_command=True)
@config_option
@click.option(
    "--limit", default=100, show_default=True, help="Job incidents listed per fleet incident (1..1000)."
)
@click.pass_context
def fleet(ctx: click.Context, config: str | None, limit: int) -> None:
    """Fleet incidents (one shared cause for many jobs), as JSON; `fleet release KEY` releases one."""
    ctx.obj = config
    if ctx.invoked_subcommand is None:
        from app import build_engine

        if not 1 <= limit <= 1000:
            raise click.BadParameter("1..1000", param_hint="--limit")
        engine = build_engine(_settings(config))
        click.echo(json.dumps(engine.fleet.fleet_incidents(limit), default=str, indent=2))


@fleet.command("release")
@click.argument("key")
@click.option("--by", required=True, help="Who says the cause is over (ledgered).")
@click.option("--note", default="", help="What was checked or fixed (ledgered).")
@click.pass_obj
def fleet_release(config: str | None, key: str, by: str, note: str) -> None:
    """Release fleet incident KEY (e.g. storage_io, switch:leaf1): its held jobs restart after their jitter."""
    from app import build_engine
    from app.web import plain_text

    engine = build_engine(_settings(config))
    try:
        record = engine.fleet.release(key, by=plain_text(by, 100) or "operator", note=plain_text(note, 500))
    except (LookupError, ValueError) as exc:
        raise click.ClickException(str(exc.args[0] if exc.args else exc)) from None
    click.echo(
        f"fleet incident {key} released by {record.cleared_by.removeprefix('operator ')}: "
        f"{len(record.incidents)} held job(s) restart within {engine.deps.settings.fleet.release_jitter_seconds}s"
    )


@cli.command()
@config_option
@click.argument("logfiles", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--label", "-l", "labels", multiple=True, metavar="K=V", help="An alert label (repeatable).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the diagnosis as JSON (as the ledger stores it)."
)
def diagnose(config: str | None, logfiles: tuple[str, ...], labels: tuple[str, ...], as_json: bool) -> None:
    """Diagnose log files (job output, dmesg, py-spy dumps; read in the order given) as an incident would be.

    Exit 0: benign (a healthy run, or one stopped on purpose: nothing to act on); 1: a fault, or too little
    evidence to name one (`unknown`: a person looks); 2: usage or settings."""
    from app.domain.diagnosis import for_settings, render
    from app.logfiles import label_pairs, read_tails

    try:
        label_map = label_pairs(labels)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--label") from None
    result = for_settings(_settings(config))(label_map, read_tails(logfiles))
    click.echo(json.dumps(result.as_dict(), indent=2) if as_json else render(result))
    if result.category != "benign":
        raise click.exceptions.Exit(1)


if __name__ == "__main__":
    main()
