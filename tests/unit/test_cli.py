"""The CLI as users run it: lint, explain, export, replay (subprocesses of the installed entry point)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.fixtures.procs import nightshift_cli as nightshift
from tests.payloads import alert, body, xid
from tests.worlds import PLAYBOOK

ROOT = Path(__file__).parents[2]


def test_lint_accepts_the_shipped_playbooks():
    result = nightshift("lint", "playbooks/", "--permissions", "examples/permissions.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    shipped = sum(path.read_text().count("kind: Playbook") for path in (ROOT / "playbooks").glob("*.yaml"))
    assert result.stdout.splitlines()[-1].startswith(f"ok: {shipped} playbook(s)")


def shipped_by_scheduler() -> dict[str, int]:
    """How many shipped playbooks target each scheduler (target.scheduler, read from the YAML itself)."""
    counts: dict[str, int] = {}
    for path in (ROOT / "playbooks").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Playbook":
                scheduler = doc["target"].get("scheduler", "none")
                counts[scheduler] = counts.get(scheduler, 0) + 1
    return counts


def test_lint_counts_only_the_playbooks_a_deployment_of_those_schedulers_loads():
    counts = shipped_by_scheduler()
    result = nightshift("lint", "playbooks/", "--schedulers", "kubernetes")
    assert result.returncode == 0, result.stdout + result.stderr
    loaded = counts["kubernetes"] + counts.get("none", 0)
    assert result.stdout.splitlines()[-1].startswith(
        f"ok: {loaded} playbook(s) for kubernetes ({counts['slurm']} for other schedulers checked, not loaded)"
    )
    refused = nightshift("lint", "playbooks/", "--schedulers", "pbs")
    assert refused.returncode == 2 and "one or both of slurm, kubernetes" in refused.stderr


def test_check_config_counts_the_playbooks_of_its_schedulers_and_refuses_a_bad_one_at_its_line(tmp_path):
    counts = shipped_by_scheduler()
    settings = tmp_path / "settings.yaml"
    settings.write_text("webhook: {auth_disabled: true}\nschedulers: [slurm]\n")
    result = nightshift("check-config", "-c", str(settings), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)["summary"]
    loaded = counts["slurm"] + counts.get("none", 0)
    [line] = [x for x in summary if x.startswith("playbooks:")]
    assert line.startswith(f"playbooks: {loaded} for slurm from ")
    assert line.endswith(f"({counts['kubernetes']} for other schedulers not loaded)")
    assert "kubernetes: not acted on (schedulers)" in summary

    settings.write_text("webhook: {auth_disabled: true}\nschedulers: [slurm, pbs]\n")
    refused = nightshift("check-config", "-c", str(settings))
    assert refused.returncode == 2
    assert f"{settings}:2: schedulers: one or both of slurm, kubernetes" in refused.stderr


def test_the_shipped_playbooks_pass_strict_lint():
    result = nightshift("lint", "--strict", "playbooks/")
    assert result.returncode == 0, result.stdout + result.stderr
    assert ": warning: " not in result.stdout


def test_lint_warns_at_the_line_of_a_label_the_matched_alert_never_carries(tmp_path):
    """A reboot reason naming {{ labels.gpu }} for DcgmExporterDown, which never carries it (rules/tests): a warning
    at that line; --strict makes it a failure (exit 1). (The shipped gpu-link-fault-slurm did this once.)"""
    text = (ROOT / "playbooks" / "node-health.yaml").read_text()
    bad = tmp_path / "node-health.yaml"
    bad.write_text(
        text.replace(
            'reason: "{{ annotations.summary }}"', 'reason: "{{ labels.alertname }} gpu {{ labels.gpu }}"'
        )
    )
    result = nightshift("lint", str(bad))
    (warning,) = [line for line in result.stdout.splitlines() if ": warning: " in line]
    path, line, _ = warning.split(":", 2)
    assert path == str(bad) and "{{ labels.gpu }}" in warning and "DcgmExporterDown" in warning
    assert "labels.gpu" in bad.read_text().splitlines()[int(line) - 1]
    assert result.returncode == 0
    assert nightshift("lint", "--strict", str(bad)).returncode == 1


def test_lint_of_an_empty_directory_is_an_error(tmp_path):
    result = nightshift("lint", str(tmp_path))
    assert result.returncode == 1 and "no playbook found" in result.stdout


def test_lint_refuses_a_null_node_repair(tmp_path):
    text = (ROOT / "playbooks" / "node-health.yaml").read_text().split("---")[0]
    bad = tmp_path / "pb.yaml"
    bad.write_text(text[: text.index("node_repair:")] + "node_repair:\n")
    result = nightshift("lint", str(bad))
    assert result.returncode == 1
    (line,) = [x for x in result.stdout.splitlines() if "node_repair" in x]
    assert "is null" in line and "node_repair: {}" in line
    assert bad.read_text().splitlines()[int(line.split(":")[1]) - 1] == "node_repair:"


def test_lint_reports_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        PLAYBOOK.replace("action: fake.drain", "action: slurm.no_such_action").replace("fake.", "slurm.")
    )
    result = nightshift("lint", str(bad))
    assert result.returncode == 1
    reports = [line for line in result.stdout.splitlines() if "slurm.no_such_action" in line]
    assert len(reports) == 1 and reports[0].startswith(f"{bad}:") and "unknown action" in reports[0]
    line = int(reports[0].split(":")[1])
    assert "action: slurm.no_such_action" in bad.read_text().splitlines()[line - 1]


def test_explain_shows_an_advisory_plan_and_touches_nothing(tmp_path):
    payload = tmp_path / "xid.json"
    payload.write_bytes(body(alert(xid())))
    settings = tmp_path / "settings.yaml"
    settings.write_text(
        yaml.safe_dump({"data_dir": str(tmp_path / "var"), "playbook_paths": [str(ROOT / "playbooks")]})
    )
    result = nightshift("explain", str(payload), "--config", str(settings))
    assert result.returncode == 0, result.stderr
    assert "guard permission: stop: no remediation step is whitelisted" in result.stdout
    assert "[would_run]" in result.stdout and "=> advisory" in result.stdout
    assert not (tmp_path / "var").exists()


def test_explain_every_shipped_example_payload(tmp_path):
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"playbook_paths": [str(ROOT / "playbooks")]}))
    examples = sorted((ROOT / "alerts" / "examples").glob("*.json"))
    assert examples, "alerts/examples/ holds captured payloads"
    for example in examples:
        result = nightshift("explain", str(example), "--config", str(settings), "--json")
        assert result.returncode == 0, f"{example}: {result.stderr}"
        report = json.loads(result.stdout)
        assert len(report["alerts"]) >= 1 and all("episodes" in a for a in report["alerts"])


def test_explain_rejects_a_bad_payload_with_the_reason(tmp_path):
    payload = tmp_path / "bad.json"
    payload.write_text('{"version": "4", "alerts": [')
    result = nightshift("explain", str(payload))
    assert result.returncode != 0 and "invalid JSON" in result.stderr


def test_export_and_replay(tmp_path):
    from app import build_engine
    from app.config import Settings
    from app.domain.alertmanager import parse_notification

    settings = Settings(data_dir=str(tmp_path / "var"), playbook_paths=[str(ROOT / "playbooks")])
    engine = build_engine(settings)
    engine.ingest(parse_notification(body(alert(xid()))))
    config = tmp_path / "settings.yaml"
    config.write_text(
        yaml.safe_dump({"data_dir": str(tmp_path / "var"), "playbook_paths": [str(ROOT / "playbooks")]})
    )
    exported = nightshift("export", "--config", str(config))
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert rows[0]["kind"] == "alert_received" and rows[0]["data"]["labels"]["xid"] == "79"
    replayed = nightshift("replay", "1", "--config", str(config))
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["opened"] == []  # the open incident already holds it
    assert "already belongs to incident #1" in report["note"]
    engine.run_until_idle()  # the incident closes (advisory)
    closed = json.loads(nightshift("replay", "1", "--config", str(config)).stdout)
    assert (
        closed["opened"] == [] and "closed advisory" in closed["note"] and "not a new fault" in closed["note"]
    )
    missing = nightshift("replay", "999", "--config", str(config))
    assert missing.returncode != 0 and "alert 999 not found" in missing.stderr


def test_docs_action_table_matches_the_registry():
    from app.cli import actions_table

    assert actions_table() in (ROOT / "docs" / "playbooks.md").read_text()
    listed = nightshift("actions")
    assert listed.returncode == 0 and "`slurm.drain_node`" in listed.stdout


def test_version():
    result = nightshift("--version")
    assert result.returncode == 0 and result.stdout.startswith("nightshift ")


def test_init_writes_settings_that_check_and_distinct_tokens(tmp_path):
    target = tmp_path / "ns"
    result = nightshift("init", str(target), "--prometheus", "http://prometheus:9090")
    assert result.returncode == 0, result.stdout + result.stderr
    tokens = [(target / f"{name}.token").read_text() for name in ("webhook", "viewer", "operator")]
    assert len(set(tokens)) == 3 and all(len(t.strip()) >= 40 for t in tokens)
    assert all(
        (target / f"{name}.token").stat().st_mode & 0o077 == 0 for name in ("webhook", "viewer", "operator")
    )
    checked = nightshift("check-config", "-c", str(target / "settings.yaml"), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    summary = json.loads(checked.stdout)["summary"]
    assert summary[0].startswith("mode: advisory") and "prometheus: http://prometheus:9090" in summary
    assert "reads: with viewer token, operator token" in summary
    again = nightshift("init", str(target))
    assert again.returncode == 2 and "--force" in again.stderr
    assert [(target / f"{n}.token").read_text() for n in ("webhook", "viewer", "operator")] == tokens


def test_check_config_refuses_an_unreadable_file_with_exit_2(tmp_path):
    settings = tmp_path / "settings.yaml"
    settings.write_text("webhook: {token_file: missing.token}\n")
    result = nightshift("check-config", "-c", str(settings))
    assert result.returncode == 2 and f"webhook.token_file: {tmp_path / 'missing.token'}" in result.stderr


def test_explain_takes_many_payloads_and_playbooks_and_exits_1_when_a_person_is_needed(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(body(alert(xid(node="node1", job="4242")), alert(xid(node="node2", job="4242")),
                         alert(xid(node="node3", job="4242"))))  # fmt: skip  # 3 culprits > max_culprits 2
    good = ROOT / "alerts" / "examples" / "gpu-xid-79.json"
    fine = nightshift("explain", "--playbooks", "playbooks/gpu-xid.yaml", str(good))
    assert fine.returncode == 0 and "gpu-xid-node-fault-slurm" in fine.stdout
    both = nightshift("explain", "--playbooks", "playbooks/gpu-xid.yaml", "--json", str(good), str(bad))
    assert both.returncode == 1, both.stdout + both.stderr
    reports = json.loads(both.stdout)
    assert len(reports) == 2 and "needs_human" in reports[1]["episodes"][0]["job_plan"]["outcome"]


SECRET = "a-secret-of-our-own-0123456789"
REFUSED_BY_SERVE = {
    "the operator token file is the webhook's": (
        "webhook: {token_file: webhook.token}\noperator_token_file: webhook.token\n",
        "operator_token_file and webhook.token_file (or webhook.basic_password_file) must differ",
    ),
    "the operator token equals the webhook's": (
        "webhook: {token_file: webhook.token}\noperator_token_file: copy.token\n",
        "must differ",
    ),
    "the public example token": (
        f"webhook: {{token_file: {ROOT / 'examples' / 'webhook.token'}}}\n",
        "example token",
    ),
    "no webhook authentication": ("data_dir: var\n", "webhook: no authentication configured"),
    "an unreadable SSH key": (
        "webhook: {token_file: webhook.token}\nslurm: {host: login1, key_file: missing.key}\n",
        "slurm.key_file:",
    ),
    "retention shorter than a playbook's budget window": (
        "webhook: {token_file: webhook.token}\nplaybook_paths: [long.yaml]\nretention: {incidents_days: 30}\n",
        "budget.window: reads back 40 days",
    ),
}


def test_check_config_refuses_exactly_what_serve_refuses(tmp_path):
    """Issue 22's caveat: check-config passed a settings file serve refused (one token file for the webhook and
    the operator). Both run app.preflight; each case fails both with the same message, a good file passes both."""
    from app import create_app
    from app.config import load_settings
    from app.domain.errors import ConfigError

    (tmp_path / "webhook.token").write_text(SECRET)
    (tmp_path / "copy.token").write_text(SECRET)
    xid_playbooks = (ROOT / "playbooks" / "gpu-xid.yaml").read_text()
    (tmp_path / "long.yaml").write_text(xid_playbooks.replace("window: 24h", "window: 40d", 1))
    for case, (text, message) in REFUSED_BY_SERVE.items():
        config = tmp_path / "settings.yaml"
        config.write_text(text)
        checked = nightshift("check-config", "-c", str(config))
        assert checked.returncode == 2 and message in checked.stderr, (case, checked.stderr)
        try:
            create_app(load_settings(config, env={}))
        except ConfigError as exc:
            assert message in str(exc) and str(exc) in checked.stderr, case
        else:
            raise AssertionError(f"serve started with {case}")
    config.write_text("data_dir: var\nwebhook: {token_file: webhook.token}\n")
    assert nightshift("check-config", "-c", str(config)).returncode == 0
    create_app(load_settings(config, env={})).extensions["nightshift"].store.dispose()


def test_lint_and_actions_print_json(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        PLAYBOOK.replace("action: fake.drain", "action: slurm.no_such_action").replace("fake.", "slurm.")
    )
    linted = nightshift("lint", "--json", str(bad))
    assert linted.returncode == 1
    report = json.loads(linted.stdout)
    assert report["ok"] is False and report["playbooks"] == 0
    messages = {(p["file"], p["line"]): p["message"] for p in report["problems"]}
    assert all(file == str(bad) and isinstance(line, int) for file, line in messages)
    assert any("unknown action 'slurm.no_such_action'" in message for message in messages.values())
    shipped = json.loads(nightshift("lint", "--json", "--strict", "playbooks/").stdout)
    assert (
        shipped["ok"] is True
        and shipped["problems"] == shipped["warnings"] == []
        and shipped["playbooks"] > 0
    )
    listed = json.loads(nightshift("actions", "--json").stdout)
    drain = next(a for a in listed if a["name"] == "slurm.drain_node")
    assert (
        drain["kind"] == "changes state"
        and {"name": "node", "required": True, "default": None} in drain["params"]
    )


def test_serve_and_check_config_say_plainly_that_there_is_no_settings_file(tmp_path):
    for command in ("check-config", "serve"):
        result = nightshift(command, cwd=tmp_path)
        assert (
            result.returncode == 2
            and "no settings file: pass -c FILE or set NIGHTSHIFT_CONFIG" in result.stderr
        )
        assert "webhook" not in result.stderr  # not what the defaults lack


def test_check_config_json_reports_problems_as_data(tmp_path):
    config = tmp_path / "settings.yaml"
    config.write_text("webhook: {token_file: t}\nguards:\n  blast_radius_max_nodes: -1\n")
    (tmp_path / "t").write_text("a-token-of-our-own-0123456789")
    result = nightshift("check-config", "--json", "-c", str(config))
    assert result.returncode == 2
    (problem,) = json.loads(result.stdout)["problems"]
    assert problem["file"] == str(config) and problem["line"] == 3
    assert "blast_radius_max_nodes" in problem["message"]
    none = nightshift("check-config", "--json", cwd=tmp_path)
    assert none.returncode == 2 and "no settings file" in json.loads(none.stdout)["problems"][0]["message"]
