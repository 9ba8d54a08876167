"""Every alert of rules/ has, on Slurm and on Kubernetes, a playbook in playbooks/ or a deliberate route to a person
(alerts/routes-to-people.yaml), and no route is stale (shadowed by a playbook). The coverage table of the alerts is
printed by ``python -m pytest tests/unit/test_alert_coverage.py -s -k table``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.actions import default_registry
from app.alert_labels import own
from app.domain.playbooks import PlaybookSet, load_playbooks

ROOT = Path(__file__).resolve().parents[2]
ROUTES = ROOT / "alerts" / "routes-to-people.yaml"
# The training job's error classes (rules/README.md, metric contract).
ERROR_CLASSES = ("nccl", "cuda_oom", "storage_io", "object_store_timeout", "checkpoint_corrupt", "nan")
# What an alert carries on each scheduler when it names a training job (rules/README.md): DCGM's job mapping label
# becomes slurm_job_id on Slurm; Kubernetes mode adds the GPU's pod and namespace.
JOB_LABELS = {
    "slurm": {"slurm_job_id": "4242", "train_job": "llama", "pod": ""},
    "kubernetes": {"namespace": "ml", "pod": "llama-worker-0", "train_job": "llama"},
}
NODE_LABELS = {"Hostname": "node1", "gpu": "0", "instance": "node1:9400"}
# Every series scraped on Kubernetes carries the target's namespace (a ServiceMonitor/PodMonitor target label): an
# exporter's own when the alert names no job (rules/README.md); a Slurm node's series carry none.
SCRAPE_LABELS = {"slurm": {}, "kubernetes": {"namespace": "gpu-operator"}}
SCHEDULERS = tuple(JOB_LABELS)


def rules() -> list[dict[str, Any]]:
    """The alerts sent to Nightshift: Nightshift's own (rules/nightshift.yml) go to people only
    (tests/integration/test_alertmanager_config.py)."""
    return [
        rule
        for path in sorted((ROOT / "rules").glob("*.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if not own(rule["alert"])
    ]


def cases() -> list[tuple[str, dict[str, str], bool]]:
    """(alertname, static labels, names a job) per distinct alert: TrainingJobError once per error class."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], bool] = {}
    for rule in rules():
        static = {k: v for k, v in rule.get("labels", {}).items() if k != "severity"}
        names_job = "slurm_job_id" in rule["expr"] or "training_" in rule["expr"]
        variants = (
            [{**static, "error_class": c} for c in ERROR_CLASSES]
            if rule["alert"] == "TrainingJobError"
            else [static]
        )
        for labels in variants:
            found[(rule["alert"], tuple(sorted(labels.items())))] = names_job
    return [(name, dict(labels), names_job) for (name, labels), names_job in found.items()]


def alert_labels(name: str, static: dict[str, str], names_job: bool, scheduler: str) -> dict[str, str]:
    labels = {"alertname": name, **NODE_LABELS, **SCRAPE_LABELS[scheduler], **static}
    if names_job:
        labels.update(JOB_LABELS[scheduler])
    return {k: v for k, v in labels.items() if v != ""}


def playbooks() -> PlaybookSet:
    return load_playbooks([ROOT / "playbooks"], default_registry())


def handling(playbook_set: PlaybookSet, labels: dict[str, str], scheduler: str) -> list[str]:
    return [p.name for p in playbook_set.match(labels) if p.target.get("scheduler") == scheduler]


def routes() -> list[dict[str, Any]]:
    return yaml.safe_load(ROUTES.read_text())["routes"]


def routed(
    name: str, static: dict[str, str], scheduler: str, route_list: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    return [
        r
        for r in route_list
        if r["alert"] == name
        and scheduler in r["schedulers"]
        and all(static.get(k) == v for k, v in (r.get("labels") or {}).items())
    ]


def coverage(route_list: list[dict[str, Any]] | None = None) -> list[tuple[str, str, str, str]]:
    """(alert, its labels, scheduler, playbooks or 'person: why' or 'NOTHING')."""
    playbook_set = playbooks()
    route_list = routes() if route_list is None else route_list
    table = []
    for name, static, names_job in cases():
        shown = " ".join(f"{k}={v}" for k, v in static.items())
        for scheduler in SCHEDULERS:
            names = handling(playbook_set, alert_labels(name, static, names_job, scheduler), scheduler)
            people = routed(name, static, scheduler, route_list)
            handled = ", ".join(names) if names else ("person: " + people[0]["why"] if people else "NOTHING")
            table.append((name, shown, scheduler, handled))
    return table


def uncovered(route_list: list[dict[str, Any]] | None = None) -> list[str]:
    return [
        f"{name} {labels} on {scheduler}"
        for name, labels, scheduler, how in coverage(route_list)
        if how == "NOTHING"
    ]


def test_every_alert_has_a_playbook_or_a_route_to_a_person_on_both_schedulers() -> None:
    missing = uncovered()
    assert missing == [], (
        "no playbook and no route to a person (alerts/routes-to-people.yaml):\n" + "\n".join(missing)
    )


def test_no_route_is_stale_and_every_route_says_why() -> None:
    playbook_set = playbooks()
    known = {(name, tuple(sorted(static.items()))): job for name, static, job in cases()}
    stale = []
    for route in routes():
        assert route.get("why"), route
        assert set(route["schedulers"]) <= set(SCHEDULERS), route
        matching = [
            (name, dict(labels), job)
            for (name, labels), job in known.items()
            if name == route["alert"]
            and all(dict(labels).get(k) == v for k, v in (route.get("labels") or {}).items())
        ]
        assert matching, f"route for an alert the rules do not have: {route}"
        for scheduler in route["schedulers"]:
            for name, static, job in matching:
                names = handling(playbook_set, alert_labels(name, static, job, scheduler), scheduler)
                if names:
                    stale.append(f"{name} {static} on {scheduler}: routed to a person but handled by {names}")
    assert stale == []


def test_the_check_fails_for_an_alert_with_neither() -> None:
    without = [r for r in routes() if r["alert"] != "GpuMemoryGrowth"]
    assert uncovered(without) == ["GpuMemoryGrowth  on slurm", "GpuMemoryGrowth  on kubernetes"]


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    rows = coverage()
    with capsys.disabled():
        print("\n| alert | labels | scheduler | playbook, or route to a person |\n|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    assert len(rows) == 2 * len(cases())
