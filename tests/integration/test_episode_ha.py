"""One failure episode of a two-node job, delivered by Alertmanager HA to three `nightshift serve` replicas on one
PostgreSQL, acting on a real Slurm over real SSH: one job incident, one requeue that keeps the job off the culprit
node, one drain of that node, its validation and its return to service."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from app.store import Store, repairs
from app.store.schema import incidents, steps
from tests.fixtures.procs import wait_until
from tests.fixtures.serve import start_serve, wait_ready, write_settings
from tests.fixtures.slurm import SlurmCluster
from tests.payloads import alert, body, xid

pytestmark = pytest.mark.integration

PLAYBOOKS = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: nccl-failure, description: "every rank reports it"}
match: ['alertname="TrainingJobError"', 'error_class="nccl"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
priority: 50
steps:
  - action: slurm.requeue_job
    with: {job: "{{ target.job }}", exclude_nodes: "{{ incident.culprits }}"}
---
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: gpu-xid, description: "node-scoped: the node is a culprit, repaired and validated"}
match: ['alertname="GpuXidError"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
priority: 100
steps:
  - action: slurm.requeue_job
    with: {job: "{{ target.job }}", exclude_nodes: "{{ incident.culprits }}"}
node_repair: {}
"""
PERMISSIONS = """
apiVersion: nightshift/v1
kind: Permissions
allow:
  - action: slurm.requeue_job
  - action: slurm.drain_node
  - action: slurm.validate_node
  - action: slurm.resume_node
"""


def nccl(node: str, rank: int, job: str) -> dict[str, str]:
    return {"alertname": "TrainingJobError", "error_class": "nccl", "Hostname": node, "rank": str(rank),
            "slurm_job_id": job}  # fmt: skip


def replica_settings(directory: Path, cluster: SlurmCluster, postgres_url: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "permissions.yaml").write_text(PERMISSIONS)
    ssh = cluster.settings.slurm
    return write_settings(
        directory,
        PLAYBOOKS,
        store_url=postgres_url,
        permissions_file=str(directory / "permissions.yaml"),
        slurm={
            "host": ssh.host,
            "port": ssh.port,
            "user": ssh.user,
            "key_file": ssh.key_file,
            "known_hosts_file": ssh.known_hosts_file,
            "node_ssh_host": "127.0.0.1",  # every test node is this host (its own slurmd port)
        },
        repair={"validation_command": "true"},
        episodes={"correlation_seconds": 5},
        guards={"defer_seconds": 1},
    )


def test_one_episode_on_three_replicas_is_one_recovery_one_drain_and_one_return(
    tmp_path, clean_slurm: SlurmCluster, postgres_url: str
):
    job = clean_slurm.sbatch("sleep 600", "--nodes=2", "--nodelist=node1,node2", "--requeue")
    wait_until(lambda: clean_slurm.squeue_state(job) == "RUNNING", 30, f"job {job} running")
    replicas = [
        start_serve(replica_settings(tmp_path / f"replica{n}", clean_slurm, postgres_url), f"replica{n}")
        for n in range(3)
    ]
    try:
        for serve in replicas:
            wait_ready(serve)
        episode = body(
            alert(nccl("node1", 0, job)), alert(nccl("node2", 1, job)), alert(xid(node="node2", job=job))
        )
        deliveries = [serve for _ in range(3) for serve in replicas]  # each replica, three repeats
        with ThreadPoolExecutor(max_workers=9) as pool:
            statuses = list(pool.map(lambda serve: serve.post_alerts(episode).status_code, deliveries))
        assert statuses == [200] * len(deliveries)

        store = Store.from_url(postgres_url)
        try:

            def settled() -> bool:
                with store.read() as conn:
                    closed = conn.execute(select(incidents.c.open_key)).scalars().all()
                    repair = repairs.list_repairs(conn, node="node2", limit=5)
                return closed == [None] and len(repair) == 1 and repair[0].state == "returned"

            logs = "\n".join(serve.daemon.log_tail() for serve in replicas)
            wait_until(settled, 150, f"one closed job incident and node2 returned\n{logs}")
            with store.read() as conn:
                rows = conn.execute(select(incidents)).mappings().all()
                step_rows = conn.execute(select(steps.c.action, steps.c.status)).all()
                (found,) = repairs.list_repairs(conn, node="node2")
                repair = found.as_dict()
        finally:
            store.dispose()
    finally:
        for serve in replicas:
            serve.daemon.stop()

    (incident,) = rows
    assert (incident["kind"], incident["playbook"], incident["node"]) == ("job", "gpu-xid", "node2")
    assert [(a, s) for a, s in step_rows if a == "slurm.requeue_job"] == [("slurm.requeue_job", "ok")]
    assert [s["step"] for s in repair["steps"] if s["status"] == "ok"] == ["take_out", "validate", "return"]
    assert repair["taken_out_by_us"] is True
    # On the cluster: requeued once, kept off node2; node2 drained by us once, then back in service.
    assert clean_slurm.job_restarts(job) == 1
    shown = clean_slurm.command("scontrol", "show", "job", "--oneliner", job).stdout
    assert re.search(r"ExcNodeList=\S*node2", shown), shown
    assert "drain" not in clean_slurm.node_state("node2")
    print(
        yaml.safe_dump(
            {"incidents": 1, "requeues": 1, "repairs of node2": 1, "repair steps": repair["steps"]}
        )
    )
