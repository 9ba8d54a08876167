"""PrometheusClient and the prometheus.query action against a `responses` fake of ``/api/v1/query``.

The fake enforces the HTTP API contract (Prometheus 2.x ``web/api/v1``): GET with a ``query`` parameter or
POST with a form body, an optional ``time`` as unix seconds, the bearer token when one is configured, and
answers in the ``{"status", "data": {"resultType", "result"}}`` envelope; errors carry ``errorType`` and
``error``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest
import responses

from app.actions.base import ActionContext
from app.actions.prometheus import PrometheusQuery
from app.clients import Clients
from app.clients.prometheus import MAX_GET_QUERY_CHARS, PrometheusClient, Sample
from app.config import PrometheusSettings, Settings
from app.domain import errors
from app.domain.errors import ParamError
from tests.fixtures.procs import free_port

URL = "http://prometheus.test:9090"
TOKEN = "prom-secret-token"
NOW = 1_764_687_803.125

RESULTS: dict[str, tuple[int, dict]] = {
    'up{job="node"}': (
        200,
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {"metric": {"__name__": "up", "job": "node", "instance": "n1:9100"}, "value": [NOW, "1"]},
                    {"metric": {"__name__": "up", "job": "node", "instance": "n2:9100"}, "value": [NOW, "0"]},
                ],
            },
        },
    ),
    "absent_metric": (200, {"status": "success", "data": {"resultType": "vector", "result": []}}),
    "scalar(vector(2))": (200, {"status": "success", "data": {"resultType": "scalar", "result": [NOW, "2"]}}),
    "odd_values": (
        200,
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {"metric": {"k": "nan"}, "value": [NOW, "NaN"]},
                    {"metric": {}, "value": [NOW, "+Inf"]},
                ],
            },
        },
    ),
    "up[5m]": (
        200,
        {
            "status": "success",
            "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[NOW, "1"]]}]},
        },
    ),
    "sum(": (
        400,
        {
            "status": "error",
            "errorType": "bad_data",
            "error": 'invalid parameter "query": 1:5: parse error: unclosed left parenthesis',
        },
    ),
    "slow_query": (
        503,
        {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"},
    ),
}


class PrometheusFake:
    """``/api/v1/query`` and ``/-/ready`` as Prometheus serves them; records each query's parameters."""

    def __init__(self, token: str | None = None):
        self.token = token
        self.queries: list[dict[str, str]] = []
        self.methods: list[str] = []

    def _unauthorized(self, request) -> tuple[int, dict, str] | None:
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"Content-Type": "text/plain"}, "Unauthorized\n"
        return None

    def query(self, request) -> tuple[int, dict, str]:
        if refused := self._unauthorized(request):
            return refused
        if request.method == "POST":
            assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
            form = parse_qs(request.body)
        else:
            assert not request.body
            form = parse_qs(urlsplit(request.url).query)
        assert set(form) <= {"query", "time", "timeout"}, form
        assert all(len(values) == 1 for values in form.values()), "repeated parameter"
        params = {key: values[0] for key, values in form.items()}
        if "time" in params:
            float(params["time"])  # Prometheus accepts unix seconds (or RFC 3339); anything else is a 400
        self.queries.append(params)
        self.methods.append(request.method)
        status, body = RESULTS.get(params["query"].strip(), RESULTS["absent_metric"])
        return status, {"Content-Type": "application/json"}, json.dumps(body)

    def ready(self, request) -> tuple[int, dict, str]:
        if refused := self._unauthorized(request):
            return refused
        return 200, {}, "Prometheus Server is Ready.\n"


@pytest.fixture
def fake() -> Iterator[PrometheusFake]:
    server = PrometheusFake(token=TOKEN)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add_callback(responses.GET, f"{URL}/api/v1/query", callback=server.query)
        mock.add_callback(responses.POST, f"{URL}/api/v1/query", callback=server.query)
        mock.add_callback(responses.GET, f"{URL}/-/ready", callback=server.ready)
        yield server


@pytest.fixture
def client() -> PrometheusClient:
    return PrometheusClient(URL, bearer_token=TOKEN, timeout=2.0)


def test_vector_result_becomes_samples(fake: PrometheusFake, client: PrometheusClient) -> None:
    samples = client.query('up{job="node"}')
    assert samples == [
        Sample(labels={"__name__": "up", "job": "node", "instance": "n1:9100"}, value=1.0, timestamp=NOW),
        Sample(labels={"__name__": "up", "job": "node", "instance": "n2:9100"}, value=0.0, timestamp=NOW),
    ]
    assert fake.methods == ["GET"]


def test_scalar_result_is_one_unlabelled_sample(fake: PrometheusFake, client: PrometheusClient) -> None:
    assert client.query("scalar(vector(2))") == [Sample(labels={}, value=2.0, timestamp=NOW)]


def test_special_float_values_parse(fake: PrometheusFake, client: PrometheusClient) -> None:
    nan, inf = client.query("odd_values")
    assert nan.value != nan.value
    assert inf.value == float("inf")


def test_empty_vector_is_empty_list(fake: PrometheusFake, client: PrometheusClient) -> None:
    assert client.query("absent_metric") == []


def test_evaluation_time_is_sent_as_unix_seconds(fake: PrometheusFake, client: PrometheusClient) -> None:
    at = datetime(2026, 12, 2, 15, 3, 23, 125000, tzinfo=UTC)
    client.query("absent_metric", at=at)
    assert float(fake.queries[0]["time"]) == pytest.approx(at.timestamp())
    client.query("absent_metric")
    assert "time" not in fake.queries[1]


def test_long_query_is_posted_as_form(fake: PrometheusFake, client: PrometheusClient) -> None:
    expr = 'up{job="node"}' + " " * MAX_GET_QUERY_CHARS
    assert len(client.query(expr)) == 2
    assert fake.methods == ["POST"]
    assert fake.queries[0]["query"] == expr


def test_missing_token_is_credential_rejected(fake: PrometheusFake) -> None:
    with pytest.raises(errors.CredentialRejected, match="HTTP 401"):
        PrometheusClient(URL).query("up")


def test_bad_promql_is_backend_error_with_prometheus_text(
    fake: PrometheusFake, client: PrometheusClient
) -> None:
    with pytest.raises(errors.BackendError) as caught:
        client.query("sum(")
    assert type(caught.value) is errors.BackendError  # not Unavailable: retrying bad PromQL cannot help
    assert "HTTP 400" in str(caught.value)
    assert "bad_data: invalid parameter" in str(caught.value)
    assert "unclosed left parenthesis" in str(caught.value)


def test_query_timeout_reports_error_type(fake: PrometheusFake, client: PrometheusClient) -> None:
    with pytest.raises(errors.BackendError, match="HTTP 503: timeout: query timed out"):
        client.query("slow_query")


def test_range_vector_result_is_refused(fake: PrometheusFake, client: PrometheusClient) -> None:
    with pytest.raises(errors.BackendError, match="'matrix' is not supported"):
        client.query("up[5m]")


def test_error_envelope_with_200_is_still_an_error() -> None:
    body = {"status": "error", "errorType": "execution", "error": "many-to-many matching not allowed"}
    with responses.RequestsMock() as mock:
        mock.get(f"{URL}/api/v1/query", json=body)
        with pytest.raises(errors.BackendError, match="execution: many-to-many"):
            PrometheusClient(URL).query("a * on() b")


def test_non_json_answer_is_backend_error() -> None:
    with responses.RequestsMock() as mock:
        mock.get(f"{URL}/api/v1/query", body="<html>proxy login</html>", content_type="text/html")
        with pytest.raises(errors.BackendError, match="expected JSON"):
            PrometheusClient(URL).query("up")


def test_connection_refused_is_unavailable() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2.0)
    with pytest.raises(errors.Unavailable, match="cannot connect"):
        client.query("up")
    assert client.ready() is False


def test_read_timeout_on_a_query_is_unavailable_not_unknown() -> None:
    # A listening socket that never accepts: the request is written to the kernel's queue and no answer comes.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        client = PrometheusClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3)
        with pytest.raises(errors.Unavailable, match=r"no answer within 0\.3s"):
            client.query("up")


def test_ready(fake: PrometheusFake, client: PrometheusClient) -> None:
    assert client.ready() is True
    with pytest.raises(errors.CredentialRejected):
        PrometheusClient(URL).ready()


def test_not_ready_is_false() -> None:
    with responses.RequestsMock() as mock:
        mock.get(f"{URL}/-/ready", status=503, body="Service Unavailable")
        assert PrometheusClient(URL).ready() is False


def test_from_settings_requires_url() -> None:
    with pytest.raises(errors.ConfigError, match=r"^prometheus\.url is not set$"):
        PrometheusClient.from_settings(Settings())


def test_from_settings_reads_token_file(fake: PrometheusFake, tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings = Settings(prometheus=PrometheusSettings(url=URL + "/", bearer_token_file=str(token_file)))
    client = PrometheusClient.from_settings(settings)
    assert client.timeout == 5.0
    assert client.query("absent_metric") == []


# --- the prometheus.query action ---


@pytest.fixture
def ctx(tmp_path) -> ActionContext:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    settings = Settings(prometheus=PrometheusSettings(url=URL, bearer_token_file=str(token_file)))
    return ActionContext(settings=settings, clients=Clients(settings))


ACTION = PrometheusQuery()


@pytest.mark.parametrize(
    ("query", "expect", "status"),
    [
        ('up{job="node"}', "any", "ok"),
        ('up{job="node"}', "none", "failed"),
        ("absent_metric", "any", "failed"),
        ("absent_metric", "none", "ok"),
    ],
)
def test_action_checks_expectation(fake: PrometheusFake, ctx: ActionContext, query, expect, status) -> None:
    outcome = ACTION.run(ACTION.validate({"query": query, "expect": expect}), ctx)
    assert outcome.status == status
    assert outcome.command == query
    assert len(outcome.data["samples"]) == (2 if query.startswith("up") else 0)


def test_action_data_and_output(fake: PrometheusFake, ctx: ActionContext) -> None:
    outcome = ACTION.run(ACTION.validate({"query": 'up{job="node"}'}), ctx)
    assert outcome.data["samples"][0] == {
        "labels": {"__name__": "up", "job": "node", "instance": "n1:9100"},
        "value": 1.0,
        "timestamp": NOW,
    }
    assert outcome.output.splitlines()[0] == 'up{instance="n1:9100", job="node"} 1'


def test_action_bad_promql_is_failed(fake: PrometheusFake, ctx: ActionContext) -> None:
    outcome = ACTION.run(ACTION.validate({"query": "sum("}), ctx)
    assert outcome.status == "failed"
    assert "bad_data" in outcome.reason


def test_action_unreachable_is_retry() -> None:
    settings = Settings(prometheus=PrometheusSettings(url=f"http://127.0.0.1:{free_port()}"))
    outcome = ACTION.run(
        ACTION.validate({"query": "up"}), ActionContext(settings=settings, clients=Clients(settings))
    )
    assert outcome.status == "retry"


def test_action_unconfigured_is_failed() -> None:
    settings = Settings()
    outcome = ACTION.run(
        ACTION.validate({"query": "up"}), ActionContext(settings=settings, clients=Clients(settings))
    )
    assert outcome.status == "failed"
    assert outcome.reason == "prometheus.url is not set"


def test_action_schema_and_plan() -> None:
    assert ACTION.read_only
    assert ACTION.validate({"query": "up"}) == {"query": "up", "expect": "any"}
    assert ACTION.plan({"query": "up == 0", "expect": "none"}).command == "up == 0"
    with pytest.raises(ParamError, match="longer than 2000"):
        ACTION.validate({"query": "x" * 2001})
    with pytest.raises(ParamError, match="not one of any, none"):
        ACTION.validate({"query": "up", "expect": "some"})
