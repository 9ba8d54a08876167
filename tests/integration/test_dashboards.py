"""Grafana dashboards and provisioning: schema sanity, and every panel query and template variable returns data
from a real Prometheus scraping the simulated exporter and trainer."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from app.metrics import Metrics
from sim.cluster import REPO_ROOT
from tests.fixtures.procs import wait_until
from tests.fixtures.prometheus import PrometheusServer, launch_prometheus
from tests.fixtures.sim import launch_sim_cluster

pytestmark = pytest.mark.integration

GRAFANA = REPO_ROOT / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
# Grafana's built-in variables, at values a fresh Prometheus with 1 s scrapes can answer.
BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
SELF_METRICS = "nightshift_"
# The series a metric family serves besides its own name (prometheus_client: counters, histograms).
SAMPLE_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def queries(*, own: bool) -> list[tuple[str, str, str, str]]:
    """(dashboard file, panel title, refId, expr) of every panel target on Nightshift's own metrics (``own``), or
    of every other one (the simulator's, which a Prometheus over the simulated cluster answers)."""
    return [
        (path.name, panel["title"], target["refId"], target["expr"])
        for path in DASHBOARDS
        for panel in load(path)["panels"]
        for target in panel["targets"]
        if (SELF_METRICS in target["expr"]) == own
    ]


def substitute(expr: str, variables: list[str]) -> str:
    """Grafana's interpolation for a test: built-ins to fixed windows, template variables to "all" (.*)."""
    for builtin, value in BUILTINS.items():
        expr = expr.replace(builtin, value)
    for name in variables:
        expr = re.sub(rf"\$(?:{name}\b|\{{{name}\}})", ".*", expr)
    assert "$" not in expr, f"uninterpolated variable in {expr}"
    return expr


def variables_of(dashboard_file: str) -> list[dict[str, Any]]:
    return load(GRAFANA / "dashboards" / dashboard_file)["templating"]["list"]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """Prometheus scraping two simulated nodes and one training job on node1."""
    cluster = launch_sim_cluster(tmp_path_factory.mktemp("sim"), nodes=("node1", "node2"), gpus=2)
    try:
        trainer = cluster.start_trainer("llama-7b", "node1", slurm_job_id="4242", checkpoint_every=10)
        server = launch_prometheus(
            tmp_path_factory.mktemp("prometheus"), [*cluster.targets, trainer.target], scrape_self=False
        )
        try:
            yield server
        finally:
            server.stop()
    finally:
        cluster.close()


def instant(server: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    response = requests.get(f"{server.url}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def test_provisioning_points_dashboards_at_the_prometheus_uid() -> None:
    (datasource,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())[
        "datasources"
    ]
    assert (datasource["type"], datasource["uid"], datasource["access"]) == (
        "prometheus",
        "prometheus",
        "proxy",
    )
    (provider,) = yaml.safe_load((GRAFANA / "provisioning/dashboards/nightshift.yaml").read_text())[
        "providers"
    ]
    assert provider["type"] == "file" and provider["options"]["path"]
    assert [p.name for p in DASHBOARDS] == [
        "fleet-gpu-health.json",
        "job-progress.json",
        "remediation-timeline.json",
    ]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_schema(path: Path) -> None:
    board = load(path)
    assert "id" not in board and 8 <= len(board["uid"]) <= 40 and board["title"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"] and all(t["datasource"] == DATASOURCE for t in panel["targets"]), panel[
            "title"
        ]
    for variable in board["templating"]["list"]:
        assert (
            variable["datasource"] == DATASOURCE and variable["includeAll"] and variable["allValue"] == ".*"
        )
    tag_queries = [a for a in board["annotations"]["list"] if a.get("target", {}).get("type") == "tags"]
    assert [q["target"]["tags"] for q in tag_queries] == [["nightshift"]], "the remediation annotation query"


def test_remediation_timeline_shows_incident_outcomes() -> None:
    exprs = [
        t["expr"]
        for p in load(GRAFANA / "dashboards/remediation-timeline.json")["panels"]
        for t in p["targets"]
    ]
    assert any("nightshift_incidents_total" in expr for expr in exprs)


@pytest.mark.parametrize(("dashboard", "panel", "ref", "expr"), queries(own=False), ids=lambda v: str(v)[:60])
def test_panel_query_returns_data(
    prometheus: PrometheusServer, dashboard: str, panel: str, ref: str, expr: str
) -> None:
    query = substitute(expr, [v["name"] for v in variables_of(dashboard)])
    result = wait_until(lambda: instant(prometheus, query), 30, f"data for {dashboard} / {panel} / {ref}")
    assert result


@pytest.mark.parametrize(("dashboard", "panel", "ref", "expr"), queries(own=True), ids=lambda v: str(v)[:60])
def test_panel_on_nightshift_s_own_metrics_names_series_it_exports(
    dashboard: str, panel: str, ref: str, expr: str
) -> None:
    """The simulator has no Nightshift; the app's registry says which series its /metrics serves."""
    families = list(Metrics().registry.collect())
    exported = {f.name for f in families} | {f.name + s for f in families for s in SAMPLE_SUFFIXES}
    named = set(re.findall(rf"\b{SELF_METRICS}\w+", expr))
    assert named and named <= exported, (dashboard, panel, sorted(named - exported))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_template_variables_resolve(prometheus: PrometheusServer, path: Path) -> None:
    for variable in load(path)["templating"]["list"]:
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        query = "group by ({1}) ({0})".format(*match.groups())
        result = wait_until(lambda q=query: instant(prometheus, q), 30, variable["name"])
        label = match.group(2)
        assert all(series["metric"].get(label) for series in result)
