"""One failure of a two-node training job, on the real stack: one job incident, one recovery, the node repaired.

A job runs one rank per node on node1 and node2 (srun), each checkpointing. Xid 79 on node2 GPU 3: node2's
exporter reports it (GpuXidError), the rank on node2 dies with its CUDA error and the rank on node1 with NCCL's
watchdog timeout, each counting an NCCL error (TrainingJobError from each rank). Nightshift must make of all that
one job incident naming node2 its culprit, requeue the job once excluding node2 (the job runs again on two other
nodes from its checkpoint, verified), and repair node2 apart from the job: drained, validated with
``dcgmi diag -r 2`` (the simulator's look-alike), then held when validation fails and returned to service when
it passes. The two runs (validation failing, validation passing) each get a stack of their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from sim import checkpoints, faults
from sim.stack import Stack, running_stack
from tests.fixtures.procs import require_binary, wait_until
from tests.fixtures.slurm import SlurmCluster

pytestmark = pytest.mark.e2e

JOB = "llama-70b"
NODES = ["node1", "node2"]
CULPRIT = "node2"
SETTLED = ("held", "returned")  # the repair states a run ends in


@dataclass(frozen=True)
class Episode:
    """What one run did: the job, its incident once closed, node2's repair once settled, and the moments."""

    stack: Stack
    verdict: str  # the validation verdict injected on node2 before the fault
    job: str
    checkpoint: int  # the newest step both ranks had saved at the fault
    detail: dict[str, Any]  # the job incident with its alerts, steps and ledger
    repair: dict[str, Any]  # node2's repairs: current, repairs
    running_again_s: float  # fault → job RUNNING again off node2
    node_settled_s: float  # fault → node2's repair held or returned


def _checkpointed(stack: Stack) -> int:
    """The newest step that both ranks have checkpointed (their shards in checkpoints/<job>/rank<N>/), 0 if none."""
    root = stack.sim.base_dir / "checkpoints" / JOB
    return checkpoints.newest_common([root / f"rank{rank}" for rank in range(len(NODES))]) or 0


def _run(stack: Stack, verdict: str) -> Episode:
    stack.inject_validation(CULPRIT, verdict)
    job = stack.submit_trainer(JOB, NODES)
    stack.wait_training(job, NODES)
    wait_until(lambda: _checkpointed(stack), 60, f"a checkpoint of job {job} on both ranks")
    fault = time.time()
    stack.inject_xid(CULPRIT, 79, 3)
    checkpoint = _checkpointed(stack)  # the rank on node2 saves nothing more: it dies at its next step
    if verdict == "pass":
        # The repair works: the GPU is reset once node2 is drained (what a reboot does; the simulated nodes cannot
        # reboot, so the test plays it), and the exporter stops reporting the Xid.
        wait_until(lambda: "drain" in stack.slurm.node_state(CULPRIT), 60, f"{CULPRIT} drained")
        faults.clear(stack.sim.state_dir, node=CULPRIT, gpu=3)

    running = stack.wait_running(job, avoid=[CULPRIT], timeout=180)
    running_again = time.time() - fault
    assert len(running) == 2, running

    def settled() -> dict[str, Any] | None:
        repairs = stack.nightshift.get(f"/api/v1/nodes/{CULPRIT}")
        return repairs if repairs["current"]["state"] in SETTLED else None

    repair = wait_until(settled, 180, f"{CULPRIT}'s repair to settle")
    # When the repair reached held/returned, by its own record (it may settle before the job runs again).
    node_settled = datetime.fromisoformat(repair["current"]["updated_at"]).timestamp() - fault
    (incident,) = [i for i in stack.nightshift.incidents(job=job) if i.get("kind") == "job"]
    detail = stack.wait_closed(incident["id"], timeout=180)
    return Episode(stack, verdict, job, checkpoint, detail, repair, running_again, node_settled)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=["fail", "pass"], ids=["validation-fails", "validation-passes"])
def episode(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, slurm_cluster: SlurmCluster
) -> Iterator[Episode]:
    slurm_cluster.reset()
    with running_stack(
        tmp_path_factory.mktemp(f"episode-{request.param}"), slurm_cluster, find_binary=require_binary
    ) as stack:
        yield _run(stack, request.param)
    slurm_cluster.reset()


def _fired(episode: Episode) -> set[tuple[str, str]]:
    """(alertname, Hostname) of every alert naming the job that fired in Prometheus during the episode."""
    series = episode.stack.prometheus.query(f'ALERTS{{alertstate="firing",slurm_job_id="{episode.job}"}}[5m]')
    return {(s["metric"]["alertname"], s["metric"].get("Hostname", "")) for s in series}


def test_every_rank_and_the_exporter_alerted(episode: Episode) -> None:
    """The evidence is there: the Xid from node2's exporter, an NCCL error counted by each rank."""
    fired = _fired(episode)
    assert ("GpuXidError", CULPRIT) in fired
    assert {("TrainingJobError", node) for node in NODES} <= fired
    log = episode.stack.job_log(episode.job)
    assert "NCCL WARN Cuda failure 'unspecified launch failure'" in log  # the faulty rank
    assert "[Rank 0] Watchdog caught collective operation timeout" in log  # its peer


def test_the_job_incident_holds_the_culprits_xid_and_only_this_jobs_alerts(episode: Episode) -> None:
    """Which ranks' TrainingJobError reach the incident before it acts is timing (the recovery can end a rank
    before the rule's increase() has two samples of its counter); the invariant is that the culprit's Xid is in
    the one job incident and nothing of another job is (test_one_job_incident_names_node2_and_recovers: one)."""
    alerts = episode.detail["alerts"]
    joined = {(a["labels"]["alertname"], a["labels"].get("Hostname")) for a in alerts}
    assert ("GpuXidError", CULPRIT) in joined
    assert {a["labels"].get("slurm_job_id") for a in alerts} == {episode.job}, joined


def test_one_job_incident_names_node2_and_recovers(episode: Episode) -> None:
    incident = episode.detail["incident"]
    assert (incident["kind"], incident["job"], incident["outcome"]) == ("job", episode.job, "recovered"), (
        incident
    )
    assert [c["node"] for c in incident["culprits"]] == [CULPRIT]
    jobs = [i for i in episode.stack.nightshift.incidents() if i.get("kind") == "job"]
    assert [i["id"] for i in jobs] == [incident["id"]]  # exactly one job incident for the whole episode


def test_one_requeue_excluding_node2(episode: Episode) -> None:
    requeues = [
        step
        for incident in episode.stack.nightshift.incidents()
        for step in episode.stack.nightshift.incident(incident["id"])["steps"]
        if step["action"] == "slurm.requeue_job" and step["status"] == "ok"
    ]
    (requeue,) = requeues
    assert CULPRIT in requeue["command"]  # ExcNodeList names node2
    assert episode.stack.slurm.job_restarts(episode.job) == 1


def test_the_job_runs_on_two_other_nodes_from_its_checkpoint(episode: Episode) -> None:
    slurm = episode.stack.slurm
    assert slurm.squeue_state(episode.job) == "RUNNING"
    nodes = slurm.job_node_list(episode.job)
    assert len(nodes) == 2 and CULPRIT not in nodes
    log = episode.stack.job_log(episode.job)
    for rank in (0, 1):
        resumed = [
            int(line.split()[4]) for line in log.splitlines() if f"[rank{rank}]: resuming from step" in line
        ]
        assert resumed and resumed[-1] >= episode.checkpoint > 0  # from a checkpoint, not from scratch
    assert any(row["kind"] == "verify_sample" for row in episode.detail["ledger"])


def test_node2_was_drained_by_us_and_validated(episode: Episode) -> None:
    current = episode.repair["current"]
    assert current["taken_out_by_us"]
    assert current["validation"]["command"].startswith("dcgmi diag -r 2")
    assert current["validation"]["exit_code"] == (226 if episode.verdict == "fail" else 0)
    assert len(episode.repair["repairs"]) == 1  # one repair of node2, however many alerts named it


def test_node2_is_held_when_validation_fails_and_back_when_it_passes(episode: Episode) -> None:
    slurm, current = episode.stack.slurm, episode.repair["current"]
    if episode.verdict == "fail":
        assert current["state"] == "held" and current["held_reason"]
        assert "drain" in slurm.node_state(CULPRIT).split("+")
        assert slurm.node_reason(CULPRIT).startswith("nightshift:")
        held = episode.stack.nightshift.get("/api/v1/nodes")["held"]
        assert [row["node"] for row in held] == [CULPRIT]
    else:
        assert current["state"] == "returned"
        assert slurm.node_state(CULPRIT) == "idle"


def test_figures(episode: Episode, record_property: Any) -> None:
    """The figures of the issue, in the report (``-rA`` or the JUnit XML): incidents and actions per episode, fault →
    job running again, fault → node2 settled (held, or back in service)."""
    nightshift = episode.stack.nightshift
    incidents = nightshift.incidents()
    steps = [s for i in incidents for s in nightshift.incident(i["id"])["steps"] if s["phase"] == "steps"]
    figures = {
        "incidents": len(incidents),
        "actions": sorted(s["action"] for s in steps if s["status"] == "ok"),
        "fault_to_running_s": round(episode.running_again_s, 1),
        "fault_to_node_settled_s": round(episode.node_settled_s, 1),
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"episode ({episode.verdict}): {figures}")
    assert figures["fault_to_running_s"] < 120
