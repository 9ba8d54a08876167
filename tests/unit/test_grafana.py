"""GrafanaClient, the grafana.annotate action, and HTTP error translation (app/clients/http.py).

No Grafana server is installable here, so :class:`GrafanaFake` reproduces the legacy annotations API
contract from Grafana's docs and ``pkg/api/annotations.go``: bearer service-account token (else 401), a JSON
body bound to a typed DTO (a type mismatch is 400 "bad request data"), ``time``/``timeEnd`` as integer epoch
**milliseconds** (values below 10**12 are refused here as the classic seconds-for-milliseconds mistake),
non-empty ``text``, tags a list of strings, 200 ``{"message": "Annotation added", "id": N}``; PATCH updates
only the fields it is given.
Transport failures (refused, timeouts, dropped connections) use real sockets on loopback.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import requests
import responses

from app.actions.base import ActionContext
from app.actions.grafana import GrafanaAnnotate
from app.clients import Clients
from app.clients.grafana import GrafanaClient
from app.clients.http import DEFAULT_RETRY_AFTER, retry_after
from app.config import GrafanaSettings, Settings
from app.domain import errors
from app.domain.errors import ParamError
from app.domain.outcome import Retry, outcome_from_error
from tests.contracts import GrafanaFake, grafana_contract
from tests.fixtures.procs import free_port

URL = "http://grafana.test:3000"
TOKEN = "glsa_59XrtzqaLhSMrlep4eCcGvPsXCaf9xE6_b83d1d4f"
START = datetime(2026, 12, 2, 15, 3, 23, 500000, tzinfo=UTC)
START_MS = 1_796_223_803_500


class FixedClock:
    def __init__(self, now: datetime):
        self._now = now

    def now(self) -> datetime:
        return self._now

    def sleep(self, seconds: float) -> None:
        raise AssertionError("no sleeping in unit tests")


@pytest.fixture
def grafana() -> Iterator[GrafanaFake]:
    with grafana_contract(URL, TOKEN) as fake:
        yield fake


@pytest.fixture
def client() -> GrafanaClient:
    return GrafanaClient(URL, token=TOKEN, timeout=2.0)


def test_create_annotation_sends_milliseconds(grafana: GrafanaFake, client: GrafanaClient) -> None:
    annotation_id = client.create_annotation(
        text="drained node1", tags=["nightshift", "node:node1"], time=START
    )
    assert annotation_id == 1
    assert grafana.annotations[1] == {
        "time": START_MS,
        "timeEnd": START_MS,
        "text": "drained node1",
        "tags": ["nightshift", "node:node1"],
        "dashboardUID": "",
    }
    assert grafana.bodies == [
        {"time": START_MS, "text": "drained node1", "tags": ["nightshift", "node:node1"]}
    ]


def test_create_region_and_dashboard_uid(grafana: GrafanaFake) -> None:
    client = GrafanaClient(URL, token=TOKEN, dashboard_uid="remediation")
    client.create_annotation(text="x", tags=[], time=START, time_end=START + timedelta(minutes=5))
    assert grafana.annotations[1]["timeEnd"] == START_MS + 300_000
    assert grafana.annotations[1]["dashboardUID"] == "remediation"


def test_the_fake_refuses_seconds(grafana: GrafanaFake) -> None:
    """The contract fake must catch the seconds-for-milliseconds mistake, or the tests above prove nothing."""
    response = requests.post(
        f"{URL}/api/annotations",
        json={"time": int(START.timestamp()), "text": "x", "tags": []},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=1,
    )
    assert response.status_code == 400
    assert not grafana.annotations


def test_close_annotation_patches_only_time_end(grafana: GrafanaFake, client: GrafanaClient) -> None:
    annotation_id = client.create_annotation(text="incident 7 opened", tags=["nightshift"], time=START)
    client.close_annotation(annotation_id, time_end=START + timedelta(minutes=3))
    assert grafana.bodies[-1] == {"timeEnd": START_MS + 180_000}
    assert grafana.annotations[annotation_id] == {
        "time": START_MS,
        "timeEnd": START_MS + 180_000,
        "text": "incident 7 opened",
        "tags": ["nightshift"],
        "dashboardUID": "",
    }


def test_close_annotation_with_text_and_tags(grafana: GrafanaFake, client: GrafanaClient) -> None:
    annotation_id = client.create_annotation(text="opened", tags=["nightshift"], time=START)
    client.close_annotation(
        annotation_id,
        time_end=START + timedelta(seconds=1),
        text="recovered",
        tags=["nightshift", "outcome:ok"],
    )
    stored = grafana.annotations[annotation_id]
    assert (stored["text"], stored["tags"]) == ("recovered", ["nightshift", "outcome:ok"])


def test_close_unknown_annotation_is_not_found(grafana: GrafanaFake, client: GrafanaClient) -> None:
    with pytest.raises(errors.NotFound, match="HTTP 404: Annotation not found"):
        client.close_annotation(99, time_end=START)


def test_wrong_or_missing_token_is_credential_rejected(grafana: GrafanaFake) -> None:
    for token in ("glsa_wrong", None):
        with pytest.raises(errors.CredentialRejected, match="HTTP 401: Unauthorized"):
            GrafanaClient(URL, token=token).create_annotation(text="x", tags=[], time=START)
    assert not grafana.annotations


def test_empty_text_is_refused(grafana: GrafanaFake, client: GrafanaClient) -> None:
    with pytest.raises(errors.BackendError, match="HTTP 400: Failed to save annotation"):
        client.create_annotation(text="", tags=[], time=START)


def test_answer_without_id_is_backend_error() -> None:
    with responses.RequestsMock() as mock:
        mock.post(f"{URL}/api/annotations", json={"message": "Annotation added"})
        with pytest.raises(errors.BackendError, match="without an id"):
            GrafanaClient(URL, token=TOKEN).create_annotation(text="x", tags=[], time=START)


def test_healthy(grafana: GrafanaFake, client: GrafanaClient) -> None:
    assert client.healthy() is True


def test_unhealthy_database_or_unreachable_is_false() -> None:
    with responses.RequestsMock() as mock:
        mock.get(f"{URL}/api/health", status=503, json={"database": "failing", "version": "11.3.0"})
        assert GrafanaClient(URL).healthy() is False
    assert GrafanaClient(f"http://127.0.0.1:{free_port()}", timeout=1).healthy() is False


def test_from_settings(tmp_path, grafana: GrafanaFake) -> None:
    with pytest.raises(errors.ConfigError, match=r"^grafana\.url is not set$"):
        GrafanaClient.from_settings(Settings())
    with pytest.raises(errors.ConfigError, match=r"grafana\.token_file: cannot read secret file"):
        GrafanaClient.from_settings(
            Settings(grafana=GrafanaSettings(url=URL, token_file=str(tmp_path / "none")))
        )
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    client = GrafanaClient.from_settings(
        Settings(
            grafana=GrafanaSettings(
                url=URL, token_file=str(token_file), dashboard_uid="d1", timeout_seconds=3
            )
        )
    )
    assert (client.dashboard_uid, client.timeout) == ("d1", 3)
    assert client.create_annotation(text="x", tags=[], time=START) == 1


# --- HTTP error translation (app/clients/http.py), through the mutating Grafana POST ---


@pytest.mark.parametrize(
    ("status", "body", "error", "message"),
    [
        (401, {"message": "Unauthorized"}, errors.CredentialRejected, "grafana: HTTP 401: Unauthorized"),
        (403, {"message": "Permissions needed"}, errors.CredentialRejected, "HTTP 403: Permissions needed"),
        (404, {"message": "Not found"}, errors.NotFound, "HTTP 404: Not found"),
        (409, {"message": "version-mismatch"}, errors.Conflict, "HTTP 409: version-mismatch"),
        (500, {"message": "Internal Server Error"}, errors.BackendError, "HTTP 500: Internal Server Error"),
    ],
)
def test_status_mapping(status, body, error, message) -> None:
    with responses.RequestsMock() as mock:
        mock.post(f"{URL}/api/annotations", status=status, json=body)
        with pytest.raises(error) as caught:
            GrafanaClient(URL, token=TOKEN).create_annotation(text="x", tags=[], time=START)
    assert type(caught.value) is error
    assert message in str(caught.value)


def test_server_error_body_excerpt_is_short_and_one_line() -> None:
    page = "<html>\n<body>" + "Bad Gateway " * 100 + "</body></html>"
    with responses.RequestsMock() as mock:
        mock.post(f"{URL}/api/annotations", status=502, body=page, content_type="text/html")
        with pytest.raises(errors.BackendError) as caught:
            GrafanaClient(URL, token=TOKEN).create_annotation(text="x", tags=[], time=START)
    assert str(caught.value).startswith("grafana: HTTP 502: <html> <body>Bad Gateway")
    assert len(str(caught.value)) < 250
    assert caught.value.output == page


@pytest.mark.parametrize(
    ("header", "expected"),
    [("17", 17.0), (None, DEFAULT_RETRY_AFTER), ("soon", DEFAULT_RETRY_AFTER)],
)
def test_rate_limited_honours_retry_after(header, expected) -> None:
    with responses.RequestsMock() as mock:
        headers = {"Retry-After": header} if header else {}
        mock.post(
            f"{URL}/api/annotations", status=429, json={"message": "Too many requests"}, headers=headers
        )
        with pytest.raises(errors.RateLimited) as caught:
            GrafanaClient(URL, token=TOKEN).create_annotation(text="x", tags=[], time=START)
    assert caught.value.retry_after == expected


def test_service_unavailable_is_retried_after_its_retry_after() -> None:
    with responses.RequestsMock() as mock:
        mock.post(f"{URL}/api/annotations", status=503, body="maintenance", headers={"Retry-After": "5"})
        with pytest.raises(errors.Unavailable) as caught:
            GrafanaClient(URL, token=TOKEN).create_annotation(text="x", tags=[], time=START)
    assert (caught.value.retry_after, caught.value.output) == (5.0, "maintenance")
    outcome = outcome_from_error(caught.value, command="POST /api/annotations")
    assert isinstance(outcome, Retry) and outcome.after == 5.0  # a step that hits it runs again, not Failed


def test_retry_after_http_date() -> None:
    now = datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC)
    assert retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now=now) == 90.0
    assert retry_after("Wed, 02 Dec 2026 14:00:00 GMT", now=now) == 0.0


def test_connection_refused_is_unavailable() -> None:
    client = GrafanaClient(f"http://127.0.0.1:{free_port()}", token=TOKEN, timeout=2)
    with pytest.raises(errors.Unavailable, match=r"grafana: cannot connect: .*Connection refused"):
        client.create_annotation(text="x", tags=[], time=START)


def test_connect_timeout_is_unavailable() -> None:
    with responses.RequestsMock() as mock:
        mock.post(f"{URL}/api/annotations", body=requests.exceptions.ConnectTimeout("connect timed out"))
        with pytest.raises(errors.Unavailable, match="connect timed out after 5s"):
            GrafanaClient(URL, token=TOKEN).create_annotation(text="x", tags=[], time=START)


def test_read_timeout_after_sending_a_post_is_outcome_unknown() -> None:
    # A listening socket that never accepts: the POST is written into the kernel's queue and no answer comes.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        client = GrafanaClient(f"http://127.0.0.1:{silent.getsockname()[1]}", token=TOKEN, timeout=0.3)
        with pytest.raises(errors.OutcomeUnknown, match=r"no answer to POST within 0\.3s: Read timed out"):
            client.create_annotation(text="x", tags=[], time=START)
        assert client.healthy() is False  # the same silence on a GET is just "not healthy"


@pytest.fixture
def hanging_up_server() -> Iterator[str]:
    """Reads one request, then closes the connection without answering."""
    server = socket.create_server(("127.0.0.1", 0))
    requests_seen: list[bytes] = []

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            requests_seen.append(connection.recv(65536))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    thread.join(5)
    server.close()
    assert requests_seen and requests_seen[0].startswith(b"POST /api/annotations")


def test_connection_dropped_after_sending_a_post_is_outcome_unknown(hanging_up_server: str) -> None:
    client = GrafanaClient(hanging_up_server, token=TOKEN, timeout=2)
    with pytest.raises(errors.OutcomeUnknown, match="connection lost after sending POST"):
        client.create_annotation(text="x", tags=[], time=START)


# --- the grafana.annotate action ---

ACTION = GrafanaAnnotate()


@pytest.fixture
def ctx(tmp_path) -> ActionContext:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    settings = Settings(grafana=GrafanaSettings(url=URL, token_file=str(token_file)))
    return ActionContext(settings=settings, clients=Clients(settings), clock=FixedClock(START), incident_id=7)


def test_annotate_action(grafana: GrafanaFake, ctx: ActionContext) -> None:
    params = ACTION.validate({"text": "Xid 79 on node1: drained", "tags": ["node:node1", "nightshift"]})
    outcome = ACTION.run(params, ctx)
    assert outcome.status == "ok"
    assert outcome.data == {"annotation_id": 1}
    assert grafana.annotations[1]["tags"] == ["nightshift", "node:node1", "incident:7"]
    assert grafana.annotations[1]["time"] == START_MS
    assert outcome.command.startswith("POST /api/annotations ")


def test_annotate_action_incident_param_wins(grafana: GrafanaFake, ctx: ActionContext) -> None:
    ACTION.run(ACTION.validate({"text": "x", "incident": "12"}), ctx)
    assert grafana.annotations[1]["tags"] == ["nightshift", "incident:12"]


def test_annotate_action_errors_become_outcomes(grafana: GrafanaFake, ctx: ActionContext) -> None:
    grafana.token = "rotated"
    assert ACTION.run(ACTION.validate({"text": "x"}), ctx).status == "credential_error"
    settings = Settings()
    unconfigured = ActionContext(settings=settings, clients=Clients(settings))
    outcome = ACTION.run(ACTION.validate({"text": "x"}), unconfigured)
    assert (outcome.status, outcome.reason) == ("failed", "grafana.url is not set")


def test_annotate_action_schema() -> None:
    assert ACTION.read_only
    assert ACTION.plan({"text": "hello", "tags": ["job:42"]}).command == (
        'POST /api/annotations {"text": "hello", "tags": ["nightshift", "job:42"]}'
    )
    with pytest.raises(ParamError, match="tags"):
        ACTION.validate({"text": "x", "tags": ["has space"]})
    with pytest.raises(ParamError, match="incident"):
        ACTION.validate({"text": "x", "incident": "7; rm"})
    with pytest.raises(ParamError, match="is required"):
        ACTION.validate({"tags": ["a"]})
