"""Browser tests: headless Chromium (Selenium) against a real HTTP server holding seeded incidents.

The server is werkzeug's threaded server in a thread, serving an app built like ``tests.unit.test_webhook.make_app``
(fake actions, fake Prometheus, a fake clock). It is seeded through its own webhook with real Alertmanager payloads,
and the tests drive ``engine.run_until_idle()`` and the clock themselves, so every state is reached the way
production reaches it and stays put while the browser looks.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from werkzeug.serving import make_server

from app import create_app
from app.actions import default_registry
from app.clients import Clients
from app.config import Settings
from app.domain.outcome import Ambiguous, CredentialError, Failed, Ok
from app.domain.params import SLURM_JOB_ID, Param
from app.engine import Engine
from app.metrics import Metrics
from tests.fakes import FakeAction, FakeClock, FakePrometheus, FakeSample, FakeSlurm, fake_actions
from tests.fixtures.procs import IN_CI, free_port, require_binary, wait_until
from tests.payloads import alert, body, xid
from tests.worlds import PLAYBOOK

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
WEBHOOK_TOKEN = "browser-webhook-token"
VIEWER_TOKEN = "browser-viewer-token"
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
)

# Node-scoped, as the shipped Xid playbooks are: the Xid's node is its job's culprit (the scheduler, FakeSlurm
# below, puts each seeded job on its alert's node), so job incidents carry the node the UI ranks and filters by.
NODE_SCOPED = "node_repair: {}\n"
XID_79 = PLAYBOOK.replace('xid=~"79|48"', 'xid="79"') + NODE_SCOPED
XID_48_GATED = (
    PLAYBOOK.replace("gpu-xid-79", "gpu-xid-48-gated")
    .replace('xid=~"79|48"', 'xid="48"')
    .replace(
        """  - action: fake.requeue
    with: {job: "{{ target.job }}"}""",
        """  - action: fake.requeue
    with: {job: "{{ target.job }}"}
    approval: required""",
    )
    + NODE_SCOPED
)
# Where the seeded jobs run (job id -> node), as the scheduler reports it.
JOBS = {str(1000 + n): ("RUNNING", f"node{n}") for n in range(1, 8)}
STALLED = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: training-stalled, description: "Training stopped stepping: restart the job"}
match: ['alertname="TrainingStalled"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
serialize: job
steps:
  - action: fake.restart
    with: {job: "{{ target.job }}"}
"""
PERMISSIONS = """
apiVersion: nightshift/v1
kind: Permissions
allow:
  - action: fake.drain
  - action: fake.requeue
  - action: fake.resume
"""
HOSTILE_NOTE = "<script>window.pwned=1</script>"


class FakeGrafana:
    """Grafana at our own seam: annotation ids handed out in order, regions closed."""

    def __init__(self) -> None:
        self.annotations: dict[int, dict[str, Any]] = {}

    def create_annotation(self, *, text: str, tags: list[str], time: Any, time_end: Any = None) -> int:
        annotation_id = len(self.annotations) + 1
        self.annotations[annotation_id] = {"text": text, "tags": tags, "time": time, "time_end": time_end}
        return annotation_id

    def close_annotation(
        self, annotation_id: int, *, time_end: Any, text: Any = None, tags: Any = None
    ) -> None:
        self.annotations[annotation_id]["time_end"] = time_end


@dataclass
class Site:
    """A running server and the handles the tests drive it with."""

    url: str
    engine: Engine
    clock: FakeClock
    actions: dict[str, FakeAction]
    operator_token: str | None
    incidents: dict[str, int] = field(default_factory=dict)  # scenario -> incident id

    def post_alerts(self, *alerts: dict[str, Any]) -> dict[str, Any]:
        response = requests.post(
            f"{self.url}/api/v1/alerts",
            data=body(*alerts),
            headers={"Authorization": f"Bearer {WEBHOOK_TOKEN}", "Content-Type": "application/json"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
        return response.json()

    def open_incident(self, scenario: str, *alerts: dict[str, Any]) -> int:
        self.post_alerts(*alerts)
        opened = self.engine.inbox.ingest_all().opened
        assert len(opened) == 1, opened
        self.incidents[scenario] = opened[0]
        return opened[0]

    def run(self) -> None:
        self.engine.run_until_idle()

    def incident(self, scenario: str) -> dict[str, Any]:
        detail = self.engine.incident(self.incidents[scenario])
        assert detail is not None
        return detail["incident"]


def seed(site: Site) -> None:
    """Incidents in every state the UI shows; the clock is left where no held incident is due."""
    actions = site.actions
    # A lemon: attempt 1 fails, attempt 2 after the 10-minute backoff recovers.
    actions["fake.drain"].script.outcomes[:] = [Failed(reason="node busy"), Ok(output="drained")]
    site.open_incident("lemon", alert(xid(node="node7", job="1007")))
    site.run()
    site.clock.advance(minutes=10)
    site.run()
    site.clock.advance(30)
    site.run()
    site.open_incident("recovered", alert(xid(node="node1", job="1001")))
    site.run()
    site.clock.advance(30)
    site.run()
    actions["fake.drain"].script.outcomes[:] = [Ambiguous(reason="ssh timed out after sending"), Ok()]
    site.open_incident("needs_human", alert(xid(node="node2", job="1002")))
    site.run()
    actions["fake.requeue"].script.outcomes[:] = [
        CredentialError(reason="Permission denied (publickey)"),
        Ok(),
    ]
    site.open_incident("credential_error", alert(xid(node="node6", job="1006")))
    site.run()
    stalled = alert(
        {"alertname": "TrainingStalled", "Hostname": "node5", "slurm_job_id": "1005", "note": HOSTILE_NOTE},
        annotations={"summary": "no step for 10m <b>bold?</b>"},
    )
    stalled["generatorURL"] = "javascript:alert(1)"
    site.open_incident("advisory", stalled)
    site.run()
    site.open_incident("awaiting_approval", alert(xid(node="node3", job="1003", code="48")))
    site.run()
    site.engine.set_paused(True, "maintenance window", by="seed")
    site.open_incident("waiting", alert(xid(node="node4", job="1004")))
    site.run()
    site.engine.set_paused(
        False, "maintenance over", by="seed"
    )  # node4 stays held until its next look (30 s)
    states = {scenario: site.incident(scenario)["state"] for scenario in site.incidents}
    assert states == {
        "lemon": "recovered",
        "recovered": "recovered",
        "needs_human": "needs_human",
        "credential_error": "credential_error",
        "advisory": "advisory",
        "awaiting_approval": "acting",
        "waiting": "waiting",
    }


@contextmanager
def serve(tmp_path: Path, operator_token: str | None) -> Iterator[Site]:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    for name, text in {"xid79.yaml": XID_79, "xid48.yaml": XID_48_GATED, "stalled.yaml": STALLED}.items():
        (playbooks / name).write_text(text)
    (tmp_path / "permissions.yaml").write_text(PERMISSIONS)
    (tmp_path / "webhook.token").write_text(WEBHOOK_TOKEN)
    settings = Settings(data_dir=str(tmp_path / "var"), playbook_paths=[str(playbooks)])
    settings.permissions_file = str(tmp_path / "permissions.yaml")
    settings.webhook.token_file = str(tmp_path / "webhook.token")
    (tmp_path / "viewer.token").write_text(VIEWER_TOKEN)
    settings.access.viewer_token_file = str(tmp_path / "viewer.token")
    settings.guards.blast_radius_max_nodes = 10
    settings.episodes.correlation_seconds = 0  # seeded incidents act at once (episodes are tested elsewhere)
    settings.grafana.url = "http://grafana.test:3000"
    settings.grafana.dashboard_uid = "nightshift-remediation"
    if operator_token:
        (tmp_path / "operator.token").write_text(operator_token)
        settings.operator_token_file = str(tmp_path / "operator.token")
    clock = FakeClock()
    actions = {
        **fake_actions(),
        "fake.restart": FakeAction("fake.restart", params={"job": Param(pattern=SLURM_JOB_ID)}),
    }
    registry = default_registry()  # node repairs plan with the scheduler's actions (not granted: advisory)
    for action in actions.values():
        registry.register(action)
    prometheus = FakePrometheus()
    prometheus.default = [FakeSample({"slurm_job_id": "any"}, 1.0)]  # re-checks hold, verifications succeed
    app = create_app(
        settings,
        clock=clock,
        registry=registry,
        clients=Clients(settings, prometheus=prometheus, grafana=FakeGrafana(), slurm=FakeSlurm(JOBS)),
        metrics=Metrics(),
    )
    server = make_server("127.0.0.1", free_port(), app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="ui-test-server", daemon=True)
    thread.start()
    site = Site(
        url=f"http://127.0.0.1:{server.server_port}",
        engine=app.extensions["nightshift"].engine,
        clock=clock,
        actions=actions,
        operator_token=operator_token,
    )
    try:
        wait_until(lambda: requests.get(f"{site.url}/healthz", timeout=2).ok, 10, "the UI test server")
        seed(site)
        yield site
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


@pytest.fixture
def site(tmp_path) -> Iterator[Site]:
    with serve(tmp_path, operator_token=secrets.token_urlsafe(24)) as running:
        yield running


@pytest.fixture
def read_only_site(tmp_path) -> Iterator[Site]:
    with serve(tmp_path, operator_token=None) as running:
        yield running


# --- the browser --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def driver(tmp_path_factory) -> Iterator[Any]:
    chromium = require_binary("chromium", "apt-get install chromium chromium-driver")
    chromedriver = require_binary("chromedriver", "apt-get install chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if IN_CI:
            pytest.fail("selenium is not installed (pip install selenium)")
        pytest.skip("selenium is not installed (pip install selenium)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    browser = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()


class Page:
    """The browser pointed at one site: open pages, read visible text, fill and submit forms, take screenshots."""

    def __init__(self, driver: Any, site: Site):
        self.driver = driver
        self.site = site

    def open(self, path: str) -> Page:
        self.driver.get(self.site.url + path)
        return self

    def find(self, css: str) -> Any:
        return self.driver.find_element("css selector", css)

    def all(self, css: str) -> list[Any]:
        return self.driver.find_elements("css selector", css)

    def text(self, css: str = "body") -> str:
        return self.find(css).text

    def exists(self, css: str) -> bool:
        return bool(self.all(css))

    def fill(self, css: str, value: str) -> None:
        element = self.find(css)
        element.clear()
        element.send_keys(value)

    def select(self, css: str, value: str) -> None:
        self.find(f"{css} option[value='{value}']").click()

    def submit(self, css: str, until: Callable[[], object], what: str) -> None:
        """Click a submit button and wait for the page it leads to."""
        self.find(css).click()
        wait_until(until, 10, what)

    def has_text(self, css: str, needle: str) -> bool:
        return any(needle in element.text for element in self.all(css))

    def login(self, name: str = "alice") -> None:
        assert self.site.operator_token
        self.open("/login")
        self.fill("#operator-name", name)
        self.fill("#operator-token", self.site.operator_token)
        self.submit("#login-submit", lambda: self.has_text("#operator", f"operator: {name}"), "the login")

    def login_viewer(self, name: str = "victor") -> None:
        """Log in with the viewer token: pages become readable, nothing can be changed."""
        self.open("/login")
        self.fill("#operator-name", name)
        self.fill("#operator-token", VIEWER_TOKEN)
        self.submit("#login-submit", lambda: self.has_text("#viewer", f"viewer: {name}"), "the viewer login")

    def screenshot(self, name: str) -> None:
        """The whole page, for review, in test-output/screenshots/<name>.png."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1400, max(1000, min(int(height) + 120, 6000)))
        self.driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
        self.driver.set_window_size(1400, 1000)


@pytest.fixture
def page(driver, site) -> Page:
    driver.get(site.url + "/healthz")
    driver.delete_all_cookies()  # no session carried over from another test's server on the same host
    page = Page(driver, site)
    page.login_viewer()  # reading needs a login; tests that act log in again as the operator
    return page
