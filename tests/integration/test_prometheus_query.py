"""PrometheusClient and prometheus.query against a real Prometheus (started by tests/fixtures/prometheus.py)
scraping a small exporter served by this module, then reloaded with a recording rule."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.actions.base import ActionContext
from app.actions.prometheus import PrometheusQuery
from app.clients import Clients
from app.clients.prometheus import PrometheusClient
from app.config import PrometheusSettings, Settings
from app.domain import errors
from tests.fixtures.procs import wait_until
from tests.fixtures.prometheus import PrometheusServer, launch_prometheus

pytestmark = pytest.mark.integration

EXPOSITION = b"""# HELP nightshift_test_gpu_temp GPU temperature.
# TYPE nightshift_test_gpu_temp gauge
nightshift_test_gpu_temp{Hostname="node1",gpu="0"} 61
nightshift_test_gpu_temp{Hostname="node1",gpu="1"} 74.5
"""


class _Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(EXPOSITION)))
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """``host:port`` of a /metrics endpoint with two gauge series."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, exporter: str) -> Iterator[PrometheusServer]:
    """One server for the module: the first scrape comes about 5 s after start (discovery throttling)."""
    server = launch_prometheus(tmp_path_factory.mktemp("prometheus"), [exporter])
    yield server
    server.stop()


def test_query_scraped_series(prometheus: PrometheusServer) -> None:
    client = PrometheusClient(prometheus.url, timeout=5)
    assert client.ready() is True
    samples = wait_until(lambda: client.query("nightshift_test_gpu_temp"), 20, "the exporter to be scraped")
    by_gpu = {s.labels["gpu"]: s for s in samples}
    assert {gpu: s.value for gpu, s in by_gpu.items()} == {"0": 61.0, "1": 74.5}
    assert by_gpu["0"].labels["job"] == "targets"
    assert by_gpu["0"].labels["__name__"] == "nightshift_test_gpu_temp"
    assert abs(by_gpu["0"].timestamp - datetime.now(UTC).timestamp()) < 60

    assert client.query('max(nightshift_test_gpu_temp{Hostname="node1"}) > 70')[0].value == 74.5
    assert client.query("scalar(count(nightshift_test_gpu_temp))")[0].labels == {}
    # Before the server started there is no data: the evaluation time reaches Prometheus.
    assert client.query("nightshift_test_gpu_temp", at=datetime.now(UTC) - timedelta(hours=1)) == []
    # A query longer than a GET URL should carry goes as a POST form and gets the same answer.
    long_expr = "nightshift_test_gpu_temp" + " " * 3000
    assert len(client.query(long_expr)) == 2


def test_bad_promql_is_a_backend_error_not_unavailable(prometheus: PrometheusServer) -> None:
    client = PrometheusClient(prometheus.url, timeout=5)
    with pytest.raises(errors.BackendError) as caught:
        client.query("sum(nightshift_test_gpu_temp")
    assert type(caught.value) is errors.BackendError
    assert "HTTP 400: bad_data" in str(caught.value)
    with pytest.raises(errors.BackendError, match="'matrix' is not supported"):
        client.query("nightshift_test_gpu_temp[1m]")


def test_action_against_real_prometheus(prometheus: PrometheusServer) -> None:
    settings = Settings(prometheus=PrometheusSettings(url=prometheus.url))
    ctx = ActionContext(settings=settings, clients=Clients(settings))
    action = PrometheusQuery()
    hot = 'nightshift_test_gpu_temp{gpu="1"} > 70'
    outcome = wait_until(
        lambda: (o := action.run(action.validate({"query": hot}), ctx)).status == "ok" and o, 20, hot
    )
    assert outcome.data["samples"][0]["value"] == 74.5
    assert (
        action.run(action.validate({"query": "nightshift_test_gpu_temp > 100", "expect": "none"}), ctx).status
        == "ok"
    )
    assert action.run(action.validate({"query": "nightshift_test_gpu_temp > 100"}), ctx).status == "failed"
    assert action.run(action.validate({"query": "sum("}), ctx).status == "failed"


def test_reload_with_rule_file(prometheus: PrometheusServer, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(
        "groups:\n"
        "  - name: test\n"
        "    rules:\n"
        "      - record: node:nightshift_test_gpu_temp:max\n"
        "        expr: max by (Hostname) (nightshift_test_gpu_temp)\n"
    )
    prometheus.reload({**prometheus.config, "rule_files": [str(rules)]})
    client = PrometheusClient(prometheus.url, timeout=5)
    samples = wait_until(lambda: client.query("node:nightshift_test_gpu_temp:max"), 20, "the recording rule")
    assert [(s.labels, s.value) for s in samples] == [
        ({"__name__": "node:nightshift_test_gpu_temp:max", "Hostname": "node1"}, 74.5)
    ]


def test_stopped_server_is_unavailable(start_prometheus: Callable[..., PrometheusServer]) -> None:
    server = start_prometheus([])
    client = PrometheusClient(server.url, timeout=2)
    assert client.ready() is True
    server.stop()
    assert client.ready() is False
    with pytest.raises(errors.Unavailable, match="cannot connect"):
        client.query("up")
