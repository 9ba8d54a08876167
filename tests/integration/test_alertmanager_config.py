"""alerts/alertmanager.yml: amtool accepts it, and a real Alertmanager running it delivers to the webhook
with the bearer token, groups as documented, and inhibits job alerts on a node being rebooted."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.alert_labels import own
from rules import gen_prometheusrule
from sim.webhook_sink import WebhookSink
from tests.fixtures.alertmanager import (
    SHIPPED_CONFIG,
    AlertmanagerServer,
    nightshift_config,
    start_alertmanager,
)
from tests.fixtures.procs import require_binary, wait_until

pytestmark = pytest.mark.integration
__all__ = ["start_alertmanager"]  # the fixture, imported so pytest finds it


class Sink(WebhookSink):
    """The webhook receiver Alertmanager posts to: records every POST (headers and JSON body) and answers 200."""

    def payloads(self, **group_labels: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """(headers, body) of the requests whose ``groupLabels`` include ``group_labels``."""
        return [
            (r.headers, r.body)
            for r in self.received
            if group_labels.items() <= r.body["groupLabels"].items()
        ]


@pytest.fixture
def sink() -> Iterator[Sink]:
    receiver = Sink()
    yield receiver
    receiver.close()


def alert(ends: bool = False, **labels: str) -> dict[str, Any]:
    body: dict[str, Any] = {"labels": labels, "annotations": {"summary": labels["alertname"]}}
    if ends:
        body["endsAt"] = datetime.now(UTC).isoformat()
    return body


def test_amtool_accepts_the_shipped_config() -> None:
    amtool = require_binary("amtool", "apt-get install prometheus-alertmanager")
    result = subprocess.run([amtool, "check-config", str(SHIPPED_CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "1 inhibit rules" in result.stdout


def test_shipped_config_routes_everything_to_nightshift_and_to_people() -> None:
    config = yaml.safe_load(SHIPPED_CONFIG.read_text())
    route = config["route"]
    assert route["routes"] == [
        {"receiver": "people", "matchers": ['alertname=~"Nightshift.+"']},  # Nightshift's own: people only
        {"receiver": "nightshift", "continue": True},
        {"receiver": "people"},
    ]
    assert route["receiver"] == "people"  # the fallback, were a matcher ever added to the routes
    assert route["group_by"] == ["alertname", "Hostname", "slurm_job_id", "train_job", "namespace", "pod"]
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == ("10s", "1m", "4h")
    nightshift, people = config["receivers"]
    (webhook,) = nightshift["webhook_configs"]
    assert nightshift["name"] == "nightshift" and people["name"] == "people"
    assert webhook == {
        "url": "http://127.0.0.1:8080/api/v1/alerts",
        "send_resolved": True,
        "max_alerts": 500,
        "http_config": {
            "authorization": {"type": "Bearer", "credentials_file": "/etc/alertmanager/nightshift.token"}
        },
    }
    (chat,) = people["slack_configs"]
    assert chat["api_url_file"] == "/etc/alertmanager/people-slack.url" and chat["send_resolved"] is True


@pytest.mark.parametrize(
    "labels",
    [
        "alertname=GpuXidError xid_class=reboot Hostname=node1",
        "alertname=TrainingMetricsAbsent train_job=a",
        "alertname=SlurmNodeDown Hostname=node2",
        "alertname=SomethingNobodyWrote",
    ],
)
def test_amtool_routes_every_alert_to_both_receivers(labels: str) -> None:
    amtool = require_binary("amtool", "apt-get install prometheus-alertmanager")
    result = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={SHIPPED_CONFIG}", *labels.split()],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["nightshift,people"]


@pytest.mark.parametrize(
    "name", gen_prometheusrule.alert_names([gen_prometheusrule.RULES / "nightshift.yml"])
)
def test_nightshifts_own_alerts_reach_people_only(name: str) -> None:
    """rules/nightshift.yml's alerts are about Nightshift: never sent to it (issue 23 item 7)."""
    assert own(name)
    amtool = require_binary("amtool", "apt-get install prometheus-alertmanager")
    result = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={SHIPPED_CONFIG}", f"alertname={name}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["people"]


def test_a_real_alertmanager_delivers_each_alert_to_nightshift_and_to_the_people_channel(
    start_alertmanager: Callable[..., AlertmanagerServer], sink: Sink, tmp_path: Path
) -> None:
    token = tmp_path / "nightshift.token"
    token.write_text("t\n")
    am = start_alertmanager(nightshift_config(sink.url(), token, people_url=sink.url("/people")))
    am.post_alerts([alert(alertname="SlurmNodeDown", Hostname="node2", node_name="node2")])

    def by_path() -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for request in sink.received:
            found.setdefault(request.path, []).append(request.body)
        return found

    received = wait_until(lambda: len(by_path()) == 2 and by_path(), 15, "a POST to each receiver")
    (to_nightshift,) = received["/api/v1/alerts"]
    assert to_nightshift["receiver"] == "nightshift"
    assert [a["labels"]["alertname"] for a in to_nightshift["alerts"]] == ["SlurmNodeDown"]
    (to_people,) = received["/people"]  # Slack's incoming-webhook shape
    assert to_people["channel"] == "#gpu-oncall"
    (attachment,) = to_people["attachments"]
    assert attachment["title"] == "FIRING SlurmNodeDown node2"
    assert attachment["text"].startswith("SlurmNodeDown: ")


def test_alerts_reach_the_webhook_grouped_with_the_bearer_token(
    start_alertmanager: Callable[..., AlertmanagerServer], sink: Sink, tmp_path: Path
) -> None:
    token = tmp_path / "nightshift.token"
    token.write_text("s3cret-1\n")
    am = start_alertmanager(nightshift_config(sink.url(), token))
    xid = {"alertname": "GpuXidError", "Hostname": "node1", "xid": "79", "xid_class": "reboot"}
    am.post_alerts([alert(**xid, gpu="3"), alert(**xid, gpu="5")])

    (headers, body), *_ = wait_until(lambda: sink.payloads(alertname="GpuXidError"), 15, "GpuXidError POST")
    assert headers["Authorization"] == "Bearer s3cret-1"
    assert headers["Content-Type"] == "application/json"
    assert (body["version"], body["receiver"], body["status"]) == ("4", "nightshift", "firing")
    assert body["groupLabels"] == {"alertname": "GpuXidError", "Hostname": "node1"}
    assert sorted(a["labels"]["gpu"] for a in body["alerts"]) == ["3", "5"]  # one POST for the node

    # The token file is read per request: rotating it needs no reload.
    token.write_text("s3cret-2\n")
    job = {"alertname": "TrainingHang", "Hostname": "node2", "train_job": "llama-7b", "slurm_job_id": "4242"}
    am.post_alerts([alert(**job)])
    (headers, body), *_ = wait_until(lambda: sink.payloads(alertname="TrainingHang"), 15, "TrainingHang POST")
    assert headers["Authorization"] == "Bearer s3cret-2"
    assert body["groupLabels"] == {
        "alertname": "TrainingHang",
        "Hostname": "node2",
        "train_job": "llama-7b",
        "slurm_job_id": "4242",
    }

    # send_resolved: the end of an alert is delivered too.
    am.post_alerts([alert(ends=True, **job)])
    resolved = wait_until(
        lambda: [b for _, b in sink.payloads(alertname="TrainingHang") if b["status"] == "resolved"],
        15,
        "resolved POST",
    )
    assert resolved[0]["alerts"][0]["status"] == "resolved"


def test_reboot_class_xid_inhibits_job_alerts_on_its_node_only(
    start_alertmanager: Callable[..., AlertmanagerServer], sink: Sink, tmp_path: Path
) -> None:
    token = tmp_path / "nightshift.token"
    token.write_text("t\n")
    am = start_alertmanager(nightshift_config(sink.url(), token))
    am.post_alerts(
        [
            alert(alertname="GpuXidError", Hostname="node1", gpu="3", xid="79", xid_class="reboot"),
            alert(alertname="GpuXidError", Hostname="node3", gpu="0", xid="13", xid_class="restart_app"),
            alert(alertname="TrainingHang", Hostname="node1", train_job="a"),
            alert(alertname="TrainingJobError", Hostname="node1", train_job="a", error_class="nccl"),
            alert(alertname="TrainingHang", Hostname="node2", train_job="a"),
            alert(alertname="TrainingHang", Hostname="node3", train_job="b"),
            alert(alertname="TrainingHang", train_job="c"),  # no Hostname: never inhibited
        ]
    )

    def states() -> dict[tuple[str, str], str]:
        return {
            (a["labels"]["alertname"], a["labels"].get("Hostname", "")): a["status"]["state"]
            for a in am.alerts()
        }

    expected = {
        ("GpuXidError", "node1"): "active",
        ("GpuXidError", "node3"): "active",
        ("TrainingHang", "node1"): "suppressed",
        ("TrainingJobError", "node1"): "suppressed",
        ("TrainingHang", "node2"): "active",
        ("TrainingHang", "node3"): "active",
        ("TrainingHang", ""): "active",
    }
    wait_until(lambda: states() == expected, 15, f"inhibition states {expected}")
    inhibited = [a for a in am.alerts() if a["status"]["state"] == "suppressed"]
    assert all(a["status"]["inhibitedBy"] for a in inhibited)

    # Delivered: the active job alerts; never: the inhibited ones.
    wait_until(lambda: len(sink.payloads(alertname="TrainingHang")) == 3, 15, "three TrainingHang POSTs")
    delivered = {
        (a["labels"]["alertname"], a["labels"].get("Hostname", ""))
        for body in sink.bodies()
        for a in body["alerts"]
    }
    assert ("TrainingHang", "node1") not in delivered and ("TrainingJobError", "node1") not in delivered
