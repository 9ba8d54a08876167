"""``nightshift explain`` on a notification with many alerts: the episodes they form, with the worker's own code."""

from __future__ import annotations

import json
from pathlib import Path

from app import build_engine
from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.domain.permissions import Grant, Permissions
from app.store import Store
from tests.fakes import FakeClock
from tests.payloads import alert, payload, xid

ROOT = Path(__file__).resolve().parents[2]


def nccl(node: str, rank: int) -> dict[str, str]:
    return {"alertname": "TrainingJobError", "error_class": "nccl", "Hostname": node, "rank": str(rank),
            "slurm_job_id": "4242"}  # fmt: skip


def explained(
    *alerts: dict,
    grants: tuple[str, ...] = (),
    job_window: int = 86400,
    schedulers: tuple[str, ...] = ("slurm", "kubernetes"),
    playbooks: Path = ROOT / "playbooks",
) -> dict:
    settings = Settings(playbook_paths=[str(playbooks)], schedulers=list(schedulers))
    settings.guards.job_recoveries_window_seconds = job_window
    engine = build_engine(
        settings,
        store=Store.unread(),
        clock=FakeClock(),
        permissions=Permissions(Grant(action=name) for name in grants),
        workloads=None,
    )
    return engine.explain(parse_notification(json.dumps(payload(*alerts))))


def test_ranks_and_an_xid_are_one_job_episode_with_one_plan_and_a_node_plan_for_the_culprit():
    report = explained(
        alert(nccl("node1", 0)),
        alert(nccl("node2", 1)),
        alert(xid(node="node2", job="4242")),
        alert({**xid(node="node1; reboot", job="4243")}),  # an invalid target is reported, the rest goes on
    )
    assert [a["episodes"] for a in report["alerts"]] == [["job:slurm/4242"]] * 3 + [[]]
    assert (
        "invalid" in report["alerts"][3]["errors"][0] or "does not match" in report["alerts"][3]["errors"][0]
    )
    (episode,) = report["episodes"]
    assert episode["playbook"] == "gpu-xid-node-fault-slurm" and episode["culprits"] == ["node2"]
    assert len(episode["alerts"]) == 3
    plan = episode["job_plan"]
    assert plan["excluded"] == ["node2"]
    assert [s["action"] for s in plan["steps"]] == ["slurm.requeue_job"]
    assert "ExcNodeList=node2" in plan["steps"][0]["command"]
    (node_plan,) = episode["node_plans"]
    assert node_plan["node"] == "node2"
    assert [s["action"] for s in node_plan["steps"]] == [
        "slurm.drain_node",
        "slurm.reboot_node",
        "slurm.validate_node",
        "slurm.resume_node",
    ]


def test_a_slurm_only_deployment_never_loads_a_kubernetes_playbook():
    """The same Xid as dcgm-exporter sends it on Kubernetes (namespace, pod): no Kubernetes playbook is loaded,
    so it matches nothing, and explain says which playbooks were set aside."""
    on_kubernetes = {**xid(node="gpu-1"), "namespace": "ml", "pod": "llama-worker-0", "container": "pytorch"}
    report = explained(alert(xid(node="node2", job="4242")), alert(on_kubernetes), schedulers=("slurm",))

    assert [a["episodes"] for a in report["alerts"]] == [["job:slurm/4242"], []]
    assert report["alerts"][1]["note"].startswith("no playbook matches")
    assert report["alerts"][1]["not_loaded"] == [
        "playbook gpu-xid-node-fault-k8s acts on kubernetes, which this deployment does not (schedulers: slurm): "
        "not loaded"
    ]
    assert "kubernetes." not in json.dumps(report)


def test_guard_inputs_come_from_the_settings_as_the_worker_reads_them():
    report = explained(alert(xid(node="node2", job="4242")), grants=("slurm.requeue_job",), job_window=7200)
    verdicts = {v["guard"]: v for v in report["episodes"][0]["job_plan"]["guards"]}
    assert verdicts["permission"]["decision"] == "pass"
    assert verdicts["job_budget"]["reason"] == "job 4242: recovery 1 of 5 in 2h"
    assert (
        verdicts["blast_radius"]["reason"] == "takes no node out of service"
    )  # a requeue is not a disruption


def test_an_empty_reference_in_free_text_leaves_a_gap_and_the_step_runs(tmp_path):
    """gpu-link-fault-slurm as it once was, on DcgmExporterDown (no gpu label): the reboot reason reads
    "... gpu ", and the node's repair plan is whole (it used to be an invalid step, the node held and a page
    sent). The shipped playbook now takes the alert's summary, which lint --strict accepts."""
    text = (ROOT / "playbooks" / "node-health.yaml").read_text()
    (tmp_path / "node-health.yaml").write_text(
        text.replace(
            'reason: "{{ annotations.summary }}"', 'reason: "{{ labels.alertname }} gpu {{ labels.gpu }}"'
        )
    )
    silent = {"alertname": "DcgmExporterDown", "Hostname": "node3", "instance": "node3:9400", "job": "dcgm"}
    (episode,) = explained(alert(silent), playbooks=tmp_path)["episodes"]
    assert episode["playbook"] == "gpu-link-fault-slurm"
    steps = {s["action"]: s for s in episode["node_plans"][0]["steps"]}
    reboot = steps["slurm.reboot_node"]
    assert reboot["status"] == "would_run", reboot
    assert "reason=nightshift: DcgmExporterDown gpu" in reboot["command"]
