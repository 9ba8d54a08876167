"""Exclusions that shrink (app/domain/exclusions.py, app/engine/exclusions.py): a node Nightshift kept a job off leaves
the job's list on its next recovery once its repair returned it and the scheduler says it is in service; nothing else
does, and a node someone else excluded never does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.actions.kubernetes import excluded_templates, not_in_values
from app.domain.exclusions import Excluded, returned
from app.domain.outcome import Ok
from app.domain.params import NODE_NAME, SLURM_JOB_ID, Param
from app.domain.permissions import Grant, Permissions
from app.domain.playbooks import PlaybookSet, parse_playbooks
from app.domain.states import RepairState
from app.engine import Engine
from app.store import records, repairs
from tests.fakes import START, FakeAction, FakeSample, FakeSlurm
from tests.payloads import alert, xid
from tests.worlds import EPISODE_VERIFY, episode_world

T0 = datetime(2026, 1, 5, 2, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("repair", "in_service", "dropped"),
    [
        (RepairState.RETURNED, True, True),  # validated and returned, the scheduler agrees
        (RepairState.RELEASED, True, True),  # a person released it
        (RepairState.RETURNED, False, False),  # returned, then drained again (by anyone)
        (RepairState.RETURNED, None, False),  # the scheduler did not answer
        (RepairState.HELD, True, False),  # held for a person
        (RepairState.ADVISORY, True, False),  # never taken out: still the culprit it was
        (RepairState.NOT_OURS, True, False),  # someone else's repair
        (RepairState.REPAIRING, False, False),
        (None, True, False),  # no repair since it was excluded (a straggler excluded without repair)
    ],
)
def test_a_node_leaves_the_list_only_when_its_repair_returned_it_and_the_scheduler_agrees(
    repair, in_service, dropped
):
    node = Excluded("gpu7", T0, repair, in_service)
    assert returned([node]) == (("gpu7",) if dropped else ())


def test_a_kubernetes_not_in_drops_the_returned_nodes_and_disappears_when_empty():
    spec = {"template": {"spec": {"containers": [{"name": "c"}]}}}
    kept = excluded_templates("Job", spec, ["gpu-a", "gpu-b"])
    assert not_in_values("Job", kept) == ["gpu-a", "gpu-b"]
    assert not_in_values("Job", excluded_templates("Job", kept, ["gpu-c"], ["gpu-b"])) == ["gpu-a", "gpu-c"]
    emptied = excluded_templates("Job", kept, [], ["gpu-a", "gpu-b"])
    assert "affinity" not in emptied["template"]["spec"]  # no empty NotIn (invalid), no empty term


# --- in the engine: a job's list over two episodes ----------------------------------------------------------------

LISTED = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: xid, description: "node-scoped"}
match: ['alertname="GpuXidError"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
steps:
  - action: fake.listed_requeue
    with: {job: "{{ target.job }}", exclude_nodes: "{{ incident.culprits }}", return_nodes: "{{ incident.returned }}"}
verify: {promql: 'increase(training_step_total{slurm_job_id="{{ target.job }}"}[2m]) > 0', timeout: 5m,
         interval: 30s}
node_repair: {}
"""


class ListedRequeue(FakeAction):
    """A requeue that keeps the job's exclusion list as Slurm would, and says what it added and dropped, as
    slurm.requeue_job does."""

    def __init__(self, excluded: set[str]):
        nodes = Param(pattern=rf"{NODE_NAME}(,{NODE_NAME})*", required=False)
        params = {"job": Param(pattern=SLURM_JOB_ID), "exclude_nodes": nodes, "return_nodes": nodes}
        super().__init__("fake.listed_requeue", params=params)
        self.excluded = excluded

    def run(self, params, ctx):
        self.script.calls.append(dict(params))
        nodes = [n for n in (params.get("exclude_nodes") or "").split(",") if n]
        back = [n for n in (params.get("return_nodes") or "").split(",") if n]
        added = [n for n in nodes if n not in self.excluded]
        dropped = [n for n in back if n in self.excluded and n not in nodes]
        self.excluded.difference_update(dropped)
        self.excluded.update(nodes)
        return Ok(output="requeued", data={"added": added, "dropped": dropped})


def listed_world(tmp_path, hand_excluded: set[str], node2: str):
    slurm = FakeSlurm({"4242": ("FAILED", "node1,node2,node3")}, node_states={"node2": node2})
    w = episode_world(tmp_path, slurm=slurm)
    action = ListedRequeue(set(hand_excluded))
    deps = w.engine.deps
    deps.registry.register(action)
    deps.playbooks = PlaybookSet(parse_playbooks(LISTED, "listed.yaml", deps.registry))
    deps.permissions = Permissions([Grant(action="fake.listed_requeue")])
    w.engine = Engine(deps)
    return w, action


def episode(w, node: str, minutes: int) -> None:
    """An Xid on ``node`` of job 4242: its recovery, verified."""
    w.send(alert(xid(node=node, job="4242"), starts_at=START + timedelta(minutes=minutes)))
    w.run()
    w.prometheus.answers[EPISODE_VERIFY] = [FakeSample({"slurm_job_id": "4242"}, 3)]
    w.clock.advance(31)
    w.run()
    w.prometheus.answers.pop(EPISODE_VERIFY)


def return_to_service(w, node: str) -> None:
    repair = w.repair(node)
    assert repair is not None
    with w.engine.deps.store.transaction() as conn:
        now = w.clock.now()
        repairs.update_repair(
            conn, repair["id"], now, state=RepairState.RETURNED, closed_at=now, open_key=None
        )


@pytest.mark.parametrize(("node2", "back_on"), [("idle", True), ("idle+drain", False)])
def test_a_node_returned_to_service_leaves_the_job_list_and_a_hand_exclusion_never_does(
    tmp_path, node2, back_on
):
    w, requeue = listed_world(tmp_path, hand_excluded={"node9"}, node2=node2)
    episode(w, "node2", 0)
    assert requeue.excluded == {"node9", "node2"}
    w.clock.advance(hours=2)
    return_to_service(w, "node2")  # its repair returned it; the scheduler says idle (or drained again)
    episode(w, "node3", 130)
    last = requeue.script.calls[-1]
    assert last["exclude_nodes"] == "node3"
    assert last.get("return_nodes", "") == ("node2" if back_on else "")
    assert requeue.excluded == ({"node9", "node3"} if back_on else {"node9", "node2", "node3"})
    with w.engine.deps.store.read() as conn:
        ours = {r["node"] for r in records.exclusions_of_job(conn, "slurm/4242")}
    assert ours == ({"node3"} if back_on else {"node2", "node3"})  # node9 is someone else's, never ours


def test_a_node_whose_repair_never_returned_it_stays_excluded(tmp_path):
    w, requeue = listed_world(tmp_path, hand_excluded=set(), node2="idle")
    episode(w, "node2", 0)
    w.clock.advance(hours=2)  # its repair is advisory here (not granted): never taken out, never returned
    episode(w, "node3", 130)
    assert requeue.script.calls[-1].get("return_nodes", "") == ""
    assert requeue.excluded == {"node2", "node3"}
