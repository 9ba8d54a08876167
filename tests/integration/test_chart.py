"""charts/nightshift: helm lint and template over several values sets, the refusals at template time, the
rendered objects applied to a real kube-apiserver (with the prometheus-operator CRDs' schemas), the rendered
settings, permissions and playbooks loaded by Nightshift itself, deploy/ in sync with the chart, and the pod's
start failing with the missing Secret key named.

helm is 3.8.1 from the npm registry (tests/fixtures/containers.py); the monitoring.coreos.com schemas come from
the PyPI package cloudcoil-models-prometheus-operator (tests/fixtures/monitoring.py). Objects are rendered for
the test apiserver's version (1.20: PodDisruptionBudget as policy/v1beta1).
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel

from app.actions import default_registry
from app.alert_labels import own
from app.config import load_settings
from app.domain.permissions import load_permissions
from app.domain.playbooks import load_playbooks
from rules import gen_prometheusrule
from tests.fixtures.containers import CHART, HELM_TIMEOUT_SECONDS, RenderRefused, rbac_grants, render
from tests.fixtures.kube import KubeAdmin, assert_contains
from tests.fixtures.monitoring import KINDS, crd
from tests.fixtures.procs import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VALUES_SETS = sorted((CHART / "ci").glob("*-values.yaml"))
TEST_KUBE_VERSION = "1.20.2"


def values_args(values: Path | None) -> list[str]:
    return ["-f", str(values)] if values else []


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [doc for doc in docs if doc["kind"] == kind]
    return found


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(doc["kind"] for doc in docs)


def value_set_id(values: Path | None) -> str:
    return values.name.removesuffix("-values.yaml") if values else "defaults"


ALL_VALUES = [None, *VALUES_SETS]


@pytest.mark.parametrize("values", ALL_VALUES, ids=value_set_id)
def test_helm_lint_is_clean(helm: str, values: Path | None) -> None:
    done = subprocess.run(
        [helm, "lint", "--strict", str(CHART), *values_args(values)],
        capture_output=True,
        text=True,
        timeout=HELM_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_values_sets_cover_every_template(helm: str) -> None:
    rendered = {kind for values in ALL_VALUES for kind in kinds(render(helm, *values_args(values)))}
    assert rendered == {
        "ConfigMap", "Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
        "RoleBinding", "PersistentVolumeClaim", "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule",
        "PodMonitor", "AlertmanagerConfig",
    }  # fmt: skip


def test_the_defaults_are_one_advisory_replica_on_sqlite(helm: str) -> None:
    docs = render(helm)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}

    assert kinds(docs) == [
        "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "PersistentVolumeClaim",
        "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount",
    ]  # fmt: skip
    assert (deployment["spec"]["replicas"], deployment["spec"]["strategy"]["type"]) == (1, "Recreate")
    assert container["image"] == "nightshift:0.1.0"
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert (
        volumes["data"]["persistentVolumeClaim"]["claimName"]
        == one(docs, "PersistentVolumeClaim")["metadata"]["name"]
    )
    assert volumes["secret-0"]["secret"] == {
        "secretName": "nightshift-secrets",
        "optional": True,
        "defaultMode": 0o440,
    }
    assert "NIGHTSHIFT_STORE_URL" not in {env["name"] for env in container["env"]}
    assert one(docs, "PodDisruptionBudget")["apiVersion"] == "policy/v1"


def test_replicas_on_postgresql_roll_and_read_the_url_from_the_secret(helm: str) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "postgres-ha-values.yaml"))
    deployment = one(docs, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}

    assert (deployment["spec"]["replicas"], deployment["spec"]["strategy"]["type"]) == (3, "RollingUpdate")
    assert env["NIGHTSHIFT_STORE_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "nightshift-postgres", "key": "url"}
    }
    assert "PersistentVolumeClaim" not in kinds(docs)
    assert container["args"] == ["serve", "--bind", "0.0.0.0:8080", "--workers", "2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "replicas=3"],
            "replicas: 3 needs PostgreSQL: set store.postgresUrlSecret.name to a Secret holding the URL",
        ),
        (["--set", "secrets.webhookToken.name="], "secrets.webhookToken.name: the webhook needs a Secret"),
        (["--set", "secrets.pagerToken.name=x"], "secrets.pagerToken: unknown secret (known: grafanaToken,"),
        (
            ["--set", "secrets.operatorToken.name=ops", "--set", "secrets.operatorToken.key="],
            "secrets.operatorToken.key: required",
        ),
        (
            ["--set", "playbooks.a\\.yaml=x", "--set", "existingPlaybooksConfigMap=mine"],
            "playbooks and existingPlaybooksConfigMap: set one, not both",
        ),
        (["--set", "replicas=two"], "replicas: Invalid type. Expected: integer, given: string"),
        (["--set", "replica=2"], "Additional property replica is not allowed"),
    ],
    ids=[
        "replicas-on-sqlite",
        "no-webhook-secret",
        "unknown-secret",
        "secret-without-key",
        "two-playbook-sources",
        "replicas-not-a-number",
        "misspelt-key",
    ],
)
def test_bad_values_are_refused_at_template_time(helm: str, args: list[str], message: str) -> None:
    with pytest.raises(RenderRefused) as refused:
        render(helm, *args)

    assert message in str(refused.value)
    assert "goroutine" not in str(refused.value)


def test_one_replica_on_sqlite_and_several_on_postgresql_render(helm: str) -> None:
    """The refusal is about SQLite, not about replicas."""
    docs = render(helm, "--set", "replicas=2", "--set", "store.postgresUrlSecret.name=pg")
    assert one(docs, "Deployment")["spec"]["replicas"] == 2


def config_documents(docs: list[dict[str, Any]], tmp_path: Path) -> dict[str, Path]:
    """The rendered ConfigMaps' files written under ``tmp_path`` (config.yaml, permissions.yaml, playbooks)."""
    written: dict[str, Path] = {}
    for doc in docs:
        if doc["kind"] != "ConfigMap":
            continue
        folder = tmp_path / doc["metadata"]["name"]
        folder.mkdir()
        for name, text in doc["data"].items():
            (folder / name).write_text(text)
            written[name] = folder / name
    return written


@pytest.mark.parametrize("values", ALL_VALUES, ids=value_set_id)
def test_nightshift_loads_what_the_chart_renders(helm: str, values: Path | None, tmp_path: Path) -> None:
    docs = render(helm, *values_args(values))
    files = config_documents(docs, tmp_path)
    registry = default_registry()

    settings = load_settings(files["config.yaml"], env={})

    mounts = {
        mount["mountPath"]
        for mount in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert settings.data_dir == "/var/lib/nightshift" and settings.data_dir in mounts
    for path in (settings.webhook.token_file, settings.operator_token_file, settings.grafana.token_file):
        assert path is None or os.path.dirname(path) in mounts, path
    if "permissions.yaml" in files:
        assert settings.permissions_file == "/etc/nightshift/config/permissions.yaml"
        assert load_permissions(files["permissions.yaml"], registry).grants
        assert settings.playbook_paths == ["/etc/nightshift/playbooks"]
        playbooks = [path for name, path in files.items() if name not in ("config.yaml", "permissions.yaml")]
        assert load_playbooks([str(path) for path in playbooks], registry).playbooks
    else:
        assert settings.permissions_file is None  # advisory
        assert settings.playbook_paths == ["/usr/share/nightshift/playbooks"]  # the image's (Dockerfile)


def test_a_missing_secret_key_stops_the_start_with_its_name(helm: str, tmp_path: Path) -> None:
    """The Secret volume is optional, so a Secret or key that is missing leaves its file absent; Nightshift's
    own start then fails naming the setting and the file /var/run/secrets/nightshift/<Secret>/<key>."""
    files = config_documents(render(helm), tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--config", str(files["config.yaml"]),
         "--bind", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        env={**os.environ, "NIGHTSHIFT_DATA_DIR": str(tmp_path / "data")},
    )  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert (
        "webhook.token_file: /var/run/secrets/nightshift/nightshift-secrets/webhook-token: cannot read it "
        "(missing, or not readable by this user)"
    ) in done.stderr
    assert "Traceback" not in done.stderr


def test_deploy_is_the_chart_rendered(helm: str, tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "render-deploy.sh"), str(tmp_path)],
        capture_output=True, text=True, timeout=HELM_TIMEOUT_SECONDS, check=False, env={**os.environ, "HELM": helm},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shipped = sorted(p.name for p in (REPO / "deploy").glob("*.yaml"))

    assert shipped == sorted(p.name for p in tmp_path.glob("*.yaml"))
    _, differ, _ = filecmp.cmpfiles(REPO / "deploy", tmp_path, shipped, shallow=False)
    assert differ == [], "deploy/ differs from the chart: run scripts/render-deploy.sh"


def test_the_versions_agree() -> None:
    """pyproject.toml's version is the chart's appVersion (the image tag) and the Dockerfile's VERSION label."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())

    assert chart["appVersion"] == version
    assert f"ARG VERSION={version}\n" in (REPO / "Dockerfile").read_text()


def test_the_alertmanager_config_routes_to_nightshift_and_continues(helm: str) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "kube-prometheus-stack-values.yaml"), namespace="ops")
    spec = one(docs, "AlertmanagerConfig")["spec"]
    route = spec["route"]
    [receiver] = spec["receivers"]
    [webhook] = receiver["webhookConfigs"]
    shipped = yaml.safe_load((REPO / "alerts" / "alertmanager.yml").read_text())["route"]
    nightshift_route = next((r for r in shipped.get("routes", []) if r["receiver"] == "nightshift"), shipped)

    assert route["continue"] is True, "people must still get the alert"
    assert route["receiver"] == receiver["name"]
    assert webhook["url"] == "http://nightshift.ops.svc:8080/api/v1/alerts"
    assert webhook["sendResolved"] is True
    assert webhook["httpConfig"]["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "nightshift-secrets", "key": "webhook-token"},
    }
    for ours, theirs in (("groupBy", "group_by"), ("groupWait", "group_wait"), ("groupInterval", "group_interval"),
                         ("repeatInterval", "repeat_interval")):  # fmt: skip
        assert route[ours] == nightshift_route.get(theirs, shipped.get(theirs)), ours


def test_the_prometheusrule_holds_the_generated_rules(helm: str) -> None:
    docs = render(helm, "--set", "monitoring.prometheusRule.enabled=true")
    generated = yaml.safe_load(gen_prometheusrule.OUTPUT.read_text())

    assert one(docs, "PrometheusRule")["spec"] == generated
    assert gen_prometheusrule.main(["--check"]) == 0, "run: python -m rules.gen_prometheusrule"


def test_the_runbook_base_is_a_chart_value(helm: str) -> None:
    """monitoring.prometheusRule.runbookBaseUrl replaces the base of every runbook_url, anchors kept; anything
    else in the rules is unchanged (issue 21 item 3)."""
    base = "https://wiki.example/nightshift/runbooks"
    docs = render(
        helm,
        "--set", "monitoring.prometheusRule.enabled=true",
        "--set", f"monitoring.prometheusRule.runbookBaseUrl={base}",
    )  # fmt: skip
    spec = one(docs, "PrometheusRule")["spec"]
    rules = [rule for group in spec["groups"] for rule in group["rules"]]
    assert rules and all(r["annotations"]["runbook_url"] == f"{base}#{r['alert'].lower()}" for r in rules)
    generated = yaml.safe_load(gen_prometheusrule.OUTPUT.read_text())
    for rule in (r for group in generated["groups"] for r in group["rules"]):
        rule["annotations"]["runbook_url"] = f"{base}#{rule['alert'].lower()}"
    assert spec == generated


def unknown_fields(model: BaseModel, where: str = "") -> list[str]:
    """Fields the operator's schema does not know (the models keep them as extras instead of refusing)."""
    found = [f"{where}.{name}" for name in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            if isinstance(item, BaseModel):
                suffix = f"[{index}]" if isinstance(value, list) else ""
                found += unknown_fields(item, f"{where}.{name}{suffix}")
    return found


def test_the_monitoring_objects_match_the_operators_models(helm: str) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "kube-prometheus-stack-values.yaml"))
    monitoring = [doc for doc in docs if doc["apiVersion"].startswith("monitoring.coreos.com/")]

    assert sorted(doc["kind"] for doc in monitoring) == sorted(KINDS)
    for doc in monitoring:
        model, version, _ = KINDS[doc["kind"]]
        assert doc["apiVersion"] == f"monitoring.coreos.com/{version}"
        assert unknown_fields(model.model_validate(doc)) == [], doc["kind"]


@pytest.fixture(scope="module")
def monitoring_crds(kube_admin: KubeAdmin) -> Iterator[KubeAdmin]:
    """The prometheus-operator CRDs with the operator's schemas, installed in the test apiserver."""
    kube_admin.apply_crds([crd(kind) for kind in KINDS])
    yield kube_admin


@pytest.mark.parametrize("values", ALL_VALUES, ids=value_set_id)
def test_the_rendered_objects_are_accepted_as_written(
    helm: str, values: Path | None, monitoring_crds: KubeAdmin
) -> None:
    namespace = monitoring_crds.create_namespace("chart")
    docs = render(
        helm, *values_args(values), release=namespace, namespace=namespace, kube_version=TEST_KUBE_VERSION
    )

    assert one(docs, "PodDisruptionBudget")["apiVersion"] == "policy/v1beta1"  # what a 1.20 server serves
    for doc in docs:
        monitoring_crds.apply(doc)
        meta = doc["metadata"]
        stored = monitoring_crds.get(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace"))
        assert_contains(doc, stored, f"{value_set_id(values)}:{doc['kind']}")


def test_the_schema_check_refuses_and_prunes(monitoring_crds: KubeAdmin) -> None:
    """The installed schemas are in force: a wrong type is refused, a misspelt field is dropped (and then
    caught by the read-back comparison above)."""
    namespace = monitoring_crds.create_namespace("schema")
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": "typo", "namespace": namespace},
        "spec": {"selector": {}, "endpoints": [{"port": "http", "pathh": "/metrics"}]},
    }  # fmt: skip
    monitoring_crds.apply(monitor)
    stored = monitoring_crds.get("monitoring.coreos.com/v1", "ServiceMonitor", "typo", namespace)
    with pytest.raises(AssertionError, match="pathh: dropped by the apiserver"):
        assert_contains(monitor, stored)

    wrong = json.loads(json.dumps(monitor))
    wrong["metadata"]["name"] = "wrong-type"
    wrong["spec"]["endpoints"] = [{"port": "http", "interval": "every minute"}]
    with pytest.raises(ApiException) as refused:
        monitoring_crds.apply(wrong)
    assert refused.value.status == 422
    assert "spec.endpoints.interval" in json.loads(refused.value.body)["message"]


def test_the_settings_are_checked_before_the_server_starts(helm: str) -> None:
    """An init container runs `nightshift check-config` with the server's image, config and mounts, so bad
    settings stop the pod with their file:line before `serve` starts (docs/deploy.md)."""
    pod = one(render(helm), "Deployment")["spec"]["template"]["spec"]
    (check,) = pod["initContainers"]
    (server,) = pod["containers"]
    assert check["args"] == ["check-config"] and check["image"] == server["image"]
    assert check["volumeMounts"] == server["volumeMounts"]
    assert {"name": "NIGHTSHIFT_CONFIG", "value": "/etc/nightshift/config/config.yaml"} in check["env"]


KPS_ALERTS = REPO / "tests" / "data" / "kubernetes" / "kube-prometheus-stack-alerts.txt"


def kube_prometheus_stack_alerts() -> list[str]:
    lines = KPS_ALERTS.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def test_the_alertmanager_config_selects_exactly_the_shipped_alerts(helm: str) -> None:
    """By default the route matches the shipped alerts (generated from rules/) and none of kube-prometheus-stack's
    own (Watchdog, KubeNodeNotReady...): an alert no playbook or route knows would only be noise at Nightshift."""
    docs = render(helm, "-f", str(CHART / "ci" / "kube-prometheus-stack-values.yaml"), namespace="ops")
    [matcher] = one(docs, "AlertmanagerConfig")["spec"]["route"]["matchers"]
    assert (matcher["name"], matcher["matchType"]) == ("alertname", "=~")
    selects = re.compile(f"(?:{matcher['value']})")  # Alertmanager anchors a matcher's regex at both ends
    files = sorted((REPO / "rules").glob("*.yml"))
    shipped = gen_prometheusrule.routed_names(files)
    assert len(shipped) >= 18
    assert [name for name in shipped if not selects.fullmatch(name)] == []
    nightshifts = [name for name in gen_prometheusrule.alert_names(files) if own(name)]
    assert nightshifts and [name for name in nightshifts if selects.fullmatch(name)] == []  # people only
    theirs = kube_prometheus_stack_alerts()
    assert "Watchdog" in theirs and "KubeNodeNotReady" in theirs
    assert [name for name in theirs if selects.fullmatch(name)] == []


def test_the_dashboards_ship_as_sidecar_configmaps_equal_to_grafana_dashboards(helm: str) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "kube-prometheus-stack-values.yaml"), namespace="ops")
    maps = {
        key: value
        for doc in docs
        if doc["kind"] == "ConfigMap" and doc["metadata"]["labels"].get("grafana_dashboard") == "1"
        for key, value in doc["data"].items()
    }
    sources = {path.name: path for path in sorted((REPO / "grafana" / "dashboards").glob("*.json"))}
    assert sorted(maps) == sorted(sources)
    for name, path in sources.items():
        assert json.loads(maps[name]) == json.loads(path.read_text()), name
        assert filecmp.cmp(path, CHART / "files" / "dashboards" / name, shallow=False), (
            f"copy {name} to the chart"
        )


def test_the_schedulers_value_reaches_the_settings(helm: str, tmp_path: Path) -> None:
    """Kubernetes alone by default (no Slurm playbook is loaded in a cluster); both when the value says so."""
    for args, expected in (
        ([], ["kubernetes"]),
        (["--set", "settings.schedulers={slurm,kubernetes}"], ["slurm", "kubernetes"]),
    ):
        folder = tmp_path / "-".join(expected)
        folder.mkdir()
        files = config_documents(render(helm, *args), folder)
        assert load_settings(files["config.yaml"], env={}).schedulers == expected


def test_the_rendered_rbac_is_exactly_the_documented_table(helm: str) -> None:
    """Every rule the chart renders is one of files/rbac.yaml's, bound in its group's scope and no wider (and
    each of them is rendered); docs/kubernetes.md's table is that file's. Whatever the template does, a rule
    broader than the table fails here."""
    namespaces = {"cluster": [""], "training": ["ml", "research"], "exec": ["ml", "research"],
                  "validation": ["gpu-checks"]}  # fmt: skip
    docs = render(
        helm, "--set", "rbac.trainingNamespaces={ml,research}", "--set", "rbac.validationNamespace=gpu-checks",
        "--set", "rbac.podExec=true",
    )  # fmt: skip
    groups = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())["groups"]
    documented = {
        (verb, api_group, resource, namespace)
        for name, group in groups.items()
        for namespace in namespaces[name]
        for rule in group["rules"]
        for api_group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    rendered = rbac_grants(docs)

    assert sorted(set(rendered) - documented) == [], "rendered but not documented (or bound wider)"
    assert sorted(documented - set(rendered)) == [], "documented but not rendered"
    assert not [g for g in rendered if "*" in g], "no wildcard"
    cluster_wide = {(verb, resource) for verb, _, resource, namespace in rendered if namespace == ""}
    assert not {("create", "pods"), ("create", "jobs")} & cluster_wide
    assert {verb for verb, _, _, ns in rendered if ns == ""} <= {"get", "list", "patch"}
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "rbac_table.py"), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_default_chart_acts_in_no_namespace_until_told(helm: str) -> None:
    """rbac.trainingNamespaces empty: reads and cordons only; no RoleBinding of the training role anywhere; no
    pods/exec unless rbac.podExec."""
    rendered = rbac_grants(render(helm, "--set", "rbac.trainingNamespaces={ml}"))
    assert not [g for g in rendered if g[2] == "pods/exec"]  # rbac.podExec is off
    rendered = rbac_grants(render(helm))
    assert {ns for *_, ns in rendered} == {"", "nightshift"}
    assert {(v, r) for v, _, r, ns in rendered if ns == "nightshift"} == {
        ("create", "pods"), ("get", "pods"), ("delete", "pods"), ("get", "pods/log"),
    }  # fmt: skip
