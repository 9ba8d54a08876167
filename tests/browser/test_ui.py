"""The operator UI in headless Chromium against a real server with seeded incidents (see conftest.py)."""

from __future__ import annotations

import re

import requests

from app.domain.guards import CHAIN
from tests.browser.conftest import VIEWER_TOKEN, Page

GUARDS = [guard.__name__ for guard in CHAIN] + [
    "recheck"
]  # the chain's order; the re-check is the engine's last


def csrf_from(html: str) -> str:
    """The CSRF token a server-rendered form carries."""
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def row_ids(page, css: str = "tr.incident") -> list[int]:
    return [int(row.get_attribute("data-id")) for row in page.all(css)]


def test_overview_shows_job_states_open_incidents_guards_and_credentials(site, page):
    page.open("/")
    states = {
        row.get_attribute("data-job"): row.find_element("css selector", ".job-state").text
        for row in page.all("tr.job")
    }
    assert states == {
        "1001": "enabled",
        "1002": "needs_human",
        "1003": "recovering",
        "1004": "recovering",
        "1005": "needs_human",  # advisory: a human has to act on the advice
        "1006": "credential_error",
        "1007": "enabled",
    }
    assert "awaits operator approval" in page.find("tr.job[data-job='1003']").text
    assert set(row_ids(page, "#open-incidents tr.incident")) == {
        site.incidents["awaiting_approval"],
        site.incidents["waiting"],
    }
    assert page.text("#automation-state").startswith("Automation enabled (resumed by seed")
    assert "5 of 10 nodes disrupted in the last 60 min: node1, node2, node3, node6, node7" in page.text(
        "#blast-radius"
    )
    assert "credential_error" in page.text("#credential-fake") and "publickey" in page.text(
        "#credential-fake"
    )
    assert "unset" in page.text("#credential-slurm")  # slurm.host is not set: said from the start
    assert not page.exists("#pause") and page.exists("#viewer")  # a viewer reads; acting needs the operator
    page.screenshot("overview")


def test_incident_page_shows_alert_diagnosis_guards_steps_verification_and_timeline(site, page):
    incident_id = site.incidents["recovered"]
    page.open(f"/incidents/{incident_id}")
    assert page.text("h1") == f"Incident #{incident_id}: gpu-xid-79"
    assert page.text("#incident-state") == "recovered"
    assert 'Hostname="node1"' in page.text("#alerts") and "2026-12-02T03:00:00Z" in page.text("#alerts")
    assert page.find(".prometheus-link").get_attribute("href") == "http://prometheus:9090/graph?g0.expr=x"
    assert page.text("#diagnosis-category") == "gpu_hardware"
    assert "GPU has fallen off the bus" in page.text("#evidence")
    verdicts = [row.find_elements("css selector", "td")[1].text for row in page.all("tr.verdict")]
    assert verdicts == GUARDS
    steps = {row.get_attribute("data-action"): row for row in page.all("tr.step")}
    drain = steps["fake.drain"]
    assert drain.find_element("css selector", ".step-status").text == "ok"
    assert drain.find_element("css selector", ".command").text == "fake.drain node=node1 reason=Xid 79"
    assert drain.find_element("css selector", ".output").text == "drained"
    assert "1 series" in page.text("#verification")
    timeline = page.text("#timeline")
    assert (
        "incident_opened" in timeline and "incident_closed" in timeline and "recovered: verified" in timeline
    )
    grafana = page.find("#grafana-link").get_attribute("href")
    assert grafana.startswith("http://grafana.test:3000/d/nightshift-remediation?from=")
    assert "annotation #" in page.text("#summary")
    page.screenshot("incident")


def test_advisory_incident_shows_would_run_steps_and_escapes_alert_values(site, page):
    page.open(f"/incidents/{site.incidents['advisory']}")
    assert page.text("#incident-state") == "advisory"
    restart = page.find("tr.step[data-action='fake.restart']")
    assert restart.find_element("css selector", ".step-status").text == "would_run"
    assert "no grant for fake.restart" in restart.text
    assert 'note="<script>window.pwned=1</script>"' in page.text("#alerts")
    assert "no step for 10m <b>bold?</b>" in page.text("#alerts")
    assert page.driver.execute_script("return typeof window.pwned") == "undefined"
    assert not page.exists(".prometheus-link")  # a javascript: generatorURL is shown as text, never a link
    assert "javascript:alert(1)" in page.text("#alerts")
    page.screenshot("incident-advisory")


def test_history_filters_by_node_outcome_and_playbook_and_pages_by_before(site, page):
    page.open("/history")
    assert len(row_ids(page)) == 7
    page.fill("#filter-node", "node2")
    page.submit("#filter-submit", lambda: "node=node2" in page.driver.current_url, "the node filter")
    rows = page.all("tr.incident")
    assert [row.get_attribute("data-node") for row in rows] == ["node2"]
    assert row_ids(page) == [site.incidents["needs_human"]]

    page.open("/history")
    page.select("#filter-outcome", "recovered")
    page.submit(
        "#filter-submit", lambda: "outcome=recovered" in page.driver.current_url, "the outcome filter"
    )
    assert sorted(row_ids(page)) == sorted([site.incidents["lemon"], site.incidents["recovered"]])
    assert {cell.text for cell in page.all("tr.incident .outcome")} == {"recovered"}

    page.open("/history?playbook=training-stalled")
    assert row_ids(page) == [site.incidents["advisory"]]
    page.open("/history?job=nope")
    assert page.text("#no-incidents") == "No incident matches."

    page.open("/history?limit=3")
    seen = row_ids(page)
    while page.exists("#older-page"):
        last = seen[-1]
        page.submit(
            "#older-page", lambda last=last: f"before={last}" in page.driver.current_url, "an older page"
        )
        older = row_ids(page)
        assert older and max(older) < last, "an older page shows only older incidents"
        seen += older
    assert sorted(seen, reverse=True) == seen and sorted(seen) == sorted(site.incidents.values())
    page.open("/history")
    page.screenshot("history")


def test_nodes_rank_lemon_nodes_by_remediations(site, page):
    page.open("/nodes")
    ranking = [row.get_attribute("data-node") for row in page.all("tr.lemon")]
    # node5 only reported the stalled job (not node-scoped): the job's incident names no culprit node.
    assert ranking == ["node7", "node1", "node2", "node3", "node6", "node4"]
    node7 = page.find("tr.lemon[data-node='node7']")
    assert node7.find_element("css selector", ".remediations").text == "2"
    assert node7.find_element("css selector", ".outcomes").text == "failed: 1, recovered: 1"
    assert page.find("tr.lemon[data-node='node3'] .outcomes").text == "in_progress: 1"
    page.screenshot("nodes")
    site.clock.advance(days=3)
    page.login_viewer()  # three days on, the 12-hour session has expired
    page.open("/nodes?days=1")
    assert not page.exists("tr.lemon") and "No incident on any node" in page.text("main")


def test_login_then_pause_shows_paused_then_resume(site, page):
    page.open("/login")
    page.fill("#operator-name", "alice")
    page.fill("#operator-token", "not-the-token")
    page.submit("#login-submit", lambda: page.exists("#login-error"), "the refusal")
    assert page.text("#login-error") == "Wrong token."
    page.screenshot("login")
    page.login("alice")
    page.fill("#pause-reason", "swapping PSUs in row 4")
    page.submit("#pause", lambda: "paused" in page.text("#automation-state"), "the paused overview")
    assert page.text("#automation-state").startswith("Automation paused by alice at 2026-12-02T")
    assert page.text("#automation-state").endswith(": swapping PSUs in row 4")
    status = site.engine.status()
    assert status["paused"] and status["pause"]["by"] == "alice"
    page.screenshot("overview-paused")
    page.submit("#resume", lambda: "enabled" in page.text("#automation-state"), "the resumed overview")
    assert not site.engine.status()["paused"] and page.exists("#pause")


def test_approve_a_step_awaiting_approval_then_the_engine_runs_it(site, page):
    incident_id = site.incidents["awaiting_approval"]
    page.login("alice")
    page.open(f"/incidents/{incident_id}")
    requeue = "tr.step[data-action='fake.requeue']"
    assert page.text(f"{requeue} .step-status").startswith("awaiting_approval")
    page.screenshot("incident-awaiting-approval")
    page.submit(f"{requeue} button.approve", lambda: page.has_text(".flash", "approved"), "the approval")
    assert page.text(f"{requeue} .step-status") == "pending"
    assert "approved by alice" in page.text(requeue)
    calls = site.actions["fake.requeue"].script.calls
    before = list(calls)
    assert {"job": "1003"} not in before  # approving only releases the step; the worker runs it
    site.run()
    page.open(f"/incidents/{incident_id}")
    assert page.text(f"{requeue} .step-status") == "ok"
    assert page.text("#incident-state") == "verifying"
    assert calls == [*before, {"job": "1003"}]
    assert "step fake.requeue approved by alice" in page.text("#timeline")


def test_mark_an_open_incident_handled(site, page):
    incident_id = site.incidents["waiting"]
    page.login("bob")
    page.open(f"/incidents/{incident_id}")
    page.fill("#handled-note", "rebooted by hand")
    page.submit("#mark-handled", lambda: page.text("#incident-state") == "handled", "the handled incident")
    assert page.text("#incident-reason") == "handled by bob: rebooted by hand"
    assert not page.exists("#handled-form")
    site.clock.advance(minutes=5)
    site.run()
    assert site.incident("waiting")["outcome"] == "handled"
    assert all(call["node"] != "node4" for call in site.actions["fake.drain"].script.calls)  # never acted on


def test_forms_without_login_or_csrf_token_are_refused(site):
    waiting = site.incidents["awaiting_approval"]
    step_id = next(
        s["id"] for s in site.engine.incident(waiting)["steps"] if s["status"] == "awaiting_approval"
    )
    approve = f"{site.url}/incidents/{waiting}/steps/{step_id}/approve"

    anonymous = requests.post(f"{site.url}/pause", data={"reason": "x"}, timeout=10, allow_redirects=False)
    assert anonymous.status_code == 401 and "log in" in anonymous.text

    browser = requests.Session()
    login_page = browser.get(f"{site.url}/login", timeout=10)
    cookie = login_page.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    no_csrf_login = browser.post(
        f"{site.url}/login", data={"operator": "mallory", "token": site.operator_token}, timeout=10
    )
    assert no_csrf_login.status_code == 403
    logged_in = browser.post(
        f"{site.url}/login",
        data={"operator": "carol", "token": site.operator_token, "csrf_token": csrf_from(login_page.text)},
        timeout=10,
        allow_redirects=False,
    )
    assert logged_in.status_code == 303
    token = csrf_from(browser.get(site.url + "/", timeout=10).text)
    for data in ({"reason": "x"}, {"reason": "x", "csrf_token": "forged"}, {"reason": "x", "csrf_token": ""}):
        assert browser.post(f"{site.url}/pause", data=data, timeout=10).status_code == 403
        assert browser.post(approve, data=data, timeout=10).status_code == 403
    assert not site.engine.status()["paused"]
    assert any(s["status"] == "awaiting_approval" for s in site.engine.incident(waiting)["steps"])

    accepted = browser.post(f"{site.url}/pause", data={"reason": "x", "csrf_token": token}, timeout=10)
    assert accepted.status_code == 200 and site.engine.status()["pause"]["by"] == "carol"


def test_without_an_operator_token_the_ui_is_read_only(read_only_site, driver):
    site = read_only_site
    driver.delete_all_cookies()
    Page(driver, site).login_viewer()
    assert "viewer: victor (read-only)" in driver.find_element("css selector", "nav").text
    assert not driver.find_elements("css selector", "#pause, #resume")
    driver.get(f"{site.url}/incidents/{site.incidents['awaiting_approval']}")
    assert not driver.find_elements("css selector", "button.approve, #mark-handled")
    for path in ("/login", "/pause", "/resume", f"/incidents/{site.incidents['waiting']}/handled"):
        assert (
            requests.post(site.url + path, data={"operator": "x", "token": "x"}, timeout=10).status_code
            == 403
        )
    assert not site.engine.status()["paused"] and site.incident("waiting")["state"] == "waiting"


# --- the login wall -----------------------------------------------------------------------------------------


def test_pages_redirect_to_the_login_and_back_and_the_api_needs_a_reader(site, driver):
    driver.get(site.url + "/healthz")
    driver.delete_all_cookies()
    incident = f"/incidents/{site.incidents['recovered']}"
    for path in ("/", incident, "/history?node=node1", "/nodes"):
        driver.get(site.url + path)
        assert driver.current_url.startswith(f"{site.url}/login?next="), (path, driver.current_url)
        assert driver.find_elements("css selector", "#login-form")
        assert "node1" not in driver.find_element("css selector", "main").text  # nothing read past the wall
    driver.get(site.url + incident)  # after the login the browser lands where it was going
    page = Page(driver, site)
    page.fill("#operator-name", "victor")
    page.fill("#operator-token", VIEWER_TOKEN)
    page.submit("#login-submit", lambda: page.exists("#incident-state"), "the incident page after login")
    assert driver.current_url == site.url + incident
    assert not page.exists("#mark-handled") and not page.exists("button.approve")  # a viewer cannot act
    for path in ("/api/v1/incidents", "/api/v1/status", f"/api/v1{incident}"):
        anonymous = requests.get(site.url + path, timeout=10)
        assert anonymous.status_code == 401 and anonymous.json()["status"] == "error", path
        viewer = requests.get(
            site.url + path, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}, timeout=10
        )
        assert viewer.status_code == 200, path
    for path in ("/healthz", "/readyz", "/metrics", "/login"):
        assert requests.get(site.url + path, timeout=10).status_code == 200, path


def test_logout_revokes_the_session_server_side(site, page):
    page.login("alice")
    cookies = {c["name"]: c["value"] for c in page.driver.get_cookies()}
    kept = requests.Session()
    kept.cookies.update(cookies)
    csrf = csrf_from(kept.get(site.url + "/", timeout=10).text)  # the kept cookie works before the logout
    page.submit("#logout", lambda: page.exists("#login-form") or page.exists("#login-link"), "the logout")
    replay = kept.get(site.url + "/", timeout=10, allow_redirects=False)
    assert replay.status_code == 303 and "/login" in replay.headers["Location"]
    resumed = kept.post(f"{site.url}/resume", data={"reason": "x", "csrf_token": csrf}, timeout=10)
    assert resumed.status_code == 401
    pause = kept.post(f"{site.url}/pause", data={"reason": "replayed", "csrf_token": csrf}, timeout=10)
    assert pause.status_code == 401 and not site.engine.status()["paused"]
