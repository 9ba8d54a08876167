"""The node repair lifecycle with a fake clock, a real SQLite store, the real Slurm actions and a fake Slurm host
and node shell at our CommandRunner seam (tests/fakes.py)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from app.actions.registry import ActionRegistry
from app.actions.slurm import ACTIONS as SLURM_ACTIONS
from app.clients import Clients
from app.clients.slurm import SlurmClient
from app.config import Settings
from app.domain.states import NoticeKind, RepairState, StepStatus
from app.metrics import Metrics
from app.store import repairs
from tests.fakes import FakeClock, FakeHttpPoster, FakeNodeShell, FakeSlurmHost, node_repair_playbook
from tests.worlds import World

PLAYBOOK = node_repair_playbook(
    "xid-reboot",
    "slurm",
    '{repair: [{action: slurm.reboot_node, with: {node: "{{ node.name }}", reason: "Xid reboot {{ node.name }}"}}], '
    'validate: {action: slurm.validate_node, with: {node: "{{ node.name }}", command: "dcgmi diag -r 2", '
    "timeout_seconds: 60}}}",
)
ALL_GRANTS = ("slurm.drain_node", "slurm.reboot_node", "slurm.validate_node", "slurm.resume_node")
NODES = ("node1", "node2", "node3", "node4", "node5", "node6", "node7", "node8")
STORE_URL: str | None = (
    None  # None: SQLite in the test's directory (tests/integration/test_node_repair_postgres.py)
)


class RepairWorld(World):
    """The repair worker with a fake Slurm host and a fake shell per node; requests node2's repair by default."""

    slurm: FakeSlurmHost
    shells: dict[str, FakeNodeShell]

    def request(
        self, node: str = "node2", playbook: str | None = "xid-reboot", incident_id: int | None = 7
    ) -> int:
        return super().request(node, "slurm", playbook, incident_id)


def make_world(
    tmp_path, grants=ALL_GRANTS, validate=(0,), reboot_polls: int = 1, http: Any = None, **settings: Any
) -> RepairWorld:
    """``http``: the notification webhook's client (``notify__webhook_url`` set), e.g. a FakeHttpPoster."""
    clock = FakeClock()
    config = Settings(data_dir=str(tmp_path), store_url=STORE_URL)
    config.repair.poll_seconds = 15
    config.repair.return_timeout_seconds = 600
    for key, value in settings.items():
        section, name = key.split("__")
        setattr(getattr(config, section), name, value)
    slurm = FakeSlurmHost(*NODES, reboot_polls=reboot_polls)
    shells = {node: FakeNodeShell(*validate, clock=clock) for node in NODES}
    seams = {"http": http} if http is not None else {}
    clients = Clients(
        config, slurm=SlurmClient(slurm), **seams, **{f"node:{n}": shell for n, shell in shells.items()}
    )
    world = RepairWorld(
        config,
        playbooks=PLAYBOOK,
        grants=grants,
        clients=clients,
        clock=clock,
        registry=ActionRegistry(SLURM_ACTIONS),
    )
    world.slurm, world.shells = slurm, shells
    return world


def test_drain_reboot_validate_resume(tmp_path):
    w = make_world(tmp_path)
    repair_id = w.request()
    w.settle()
    repair = w.row(repair_id)
    assert (repair["state"], repair["open_key"], repair["taken_out_by_us"]) == (
        RepairState.RETURNED,
        None,
        True,
    )
    assert [c[:3] for c in w.slurm.changes("node2")] == [
        ("scontrol", "update", "NodeName=node2"),  # drain
        ("scontrol", "reboot", "ASAP"),
        ("scontrol", "update", "NodeName=node2"),  # resume
    ]
    assert w.slurm.changes("node2")[0][-1] == "Reason=nightshift: Xid 79 on GPU 3"
    assert w.slurm.changes("node2")[1][4] == "reason=nightshift: Xid reboot node2"
    node = w.slurm.nodes["node2"]
    assert (node.state, node.flags, node.reboots) == ("idle", set(), 1)
    # Validation ran once the node was back from its reboot, on the node itself, detached, and was cleaned up.
    [started] = w.shells["node2"].started
    assert "dcgmi diag -r 2 > /tmp/nightshift-check-1/out" in started and w.shells["node2"].stopped == 1
    assert repair["validation"]["verdict"] == "pass"
    assert [s["step"] for s in repair["steps"]] == ["take_out", "repair:0", "validate", "return"]
    # Every transition is ledgered for the requesting incident, naming the node and the repair.
    rows = [r for r in w.rows() if r["data"].get("repair_id") == repair_id]
    assert rows and all(r["incident_id"] == 7 and r["data"]["node"] == "node2" for r in rows)
    assert "node node2: node back in service" in [r["message"] for r in rows]
    assert w.counter("returned") == 1


def test_validation_fails_node_held_and_stays_out(tmp_path):
    w = make_world(tmp_path, validate=(226,))
    repair_id = w.request()
    w.settle()
    repair = w.row(repair_id)
    assert repair["state"] == RepairState.HELD
    assert repair["held_reason"] == "validation failed: validation `dcgmi diag -r 2` exited 226 on node2"
    assert repair["open_key"] == "node/node2"  # held: still this node's open repair, whatever the scheduler
    assert w.slurm.nodes["node2"].state == "down"  # never resumed
    assert not any("State=RESUME" in c for c in w.slurm.changes("node2"))
    assert w.worker.held() == 1 and w.counter("held") == 1
    assert [n["node"] for n in w.worker.nodes()["held"]] == ["node2"]
    # A new request for the held node is absorbed: it is not repaired again behind the person's back.
    assert w.request() == repair_id
    assert w.rows("repair_absorbed")


def test_validation_timeout_counts_as_failed(tmp_path):
    w = make_world(tmp_path, validate=(None,))
    repair_id = w.request()
    w.settle()
    assert w.row(repair_id)["held_reason"] == (
        "validation failed: validation on node2 timed out after 60s: counts as failed"
    )


def test_a_node_drained_by_someone_else_is_never_resumed(tmp_path):
    w = make_world(tmp_path)
    w.slurm.nodes["node2"].flags.add("drain")
    w.slurm.nodes["node2"].reason = "alice: bad fan"
    repair_id = w.request()
    w.settle()
    repair = w.row(repair_id)
    assert (repair["state"], repair["taken_out_by_us"]) == (RepairState.NOT_OURS, False)
    assert w.slurm.changes("node2") == []  # not drained again, not rebooted, not resumed
    assert w.slurm.nodes["node2"].reason == "alice: bad fan"


def test_a_node_that_never_comes_back_is_held_at_the_deadline(tmp_path):
    w = make_world(tmp_path, reboot_polls=-1)
    repair_id = w.request()
    w.settle(limit=100)
    repair = w.row(repair_id)
    assert repair["state"] == RepairState.HELD
    assert repair["held_reason"].startswith("node not back and validated by ")
    # Bounded: held within return_timeout (600 s) of the take-out, give or take one look.
    assert repair["closed_at"] is None and repair["updated_at"] - repair["taken_out_at"] <= timedelta(
        seconds=620
    )
    assert w.shells["node2"].started == []
    # Every look at the rebooting node is counted, one in 20 ledgered (and the last, which holds it).
    retries = [r for r in w.rows("repair_retry") if r["data"]["repair_id"] == repair_id]
    looks = repair["retries"]
    assert looks >= 30 and len(retries) == (looks - 1) // 20 + 2, (looks, len(retries))
    assert "reboot_requested" in retries[0]["message"]


def test_lemon_rule_holds_a_node_repaired_too_often(tmp_path):
    w = make_world(tmp_path, repair__lemon_repairs=2)
    for _ in range(2):
        repair_id = w.request()
        w.settle()
        assert w.row(repair_id)["state"] == RepairState.RETURNED
        w.clock.advance(hours=1)
    third = w.request()
    w.settle()
    repair = w.row(third)
    assert repair["state"] == RepairState.HELD and repair["taken_out_by_us"]
    assert repair["held_reason"].startswith("lemon node: repaired 2 time(s) in the last 7d (limit 2)")
    assert w.slurm.nodes["node2"].reboots == 2  # taken out, not rebooted a third time
    assert "drain" in w.slurm.nodes["node2"].flags
    # Outside the window the count starts over.
    w.clock.advance(days=8)
    w.worker.release("node2", by="alice")
    w.settle()
    assert w.row(third)["state"] == RepairState.RELEASED
    fourth = w.request()
    w.settle()
    assert w.row(fourth)["state"] == RepairState.RETURNED


def test_a_step_in_flight_at_a_crash_is_held_never_rerun(tmp_path):
    w = make_world(tmp_path)
    repair_id = w.request()
    w.tick(3)  # requested -> taking out -> drained -> reboot issued
    with (
        w.store.transaction() as conn
    ):  # a worker died in the middle of the next step: marked, never finished
        repairs.update_repair(conn, repair_id, w.clock.now(), step="repair:0", step_status=StepStatus.RUNNING)
    reboots = sum(1 for c in w.slurm.commands if c[1] == "reboot")
    w.settle()
    repair = w.row(repair_id)
    assert repair["state"] == RepairState.HELD
    assert (
        repair["held_reason"]
        == "step repair:0 was in flight when its worker stopped: outcome unknown, not re-run"
    )
    assert sum(1 for c in w.slurm.commands if c[1] == "reboot") == reboots


def test_not_whitelisted_is_advisory_and_touches_nothing(tmp_path):
    w = make_world(tmp_path, grants=("slurm.drain_node", "slurm.resume_node"))
    repair_id = w.request()
    w.settle()
    repair = w.row(repair_id)
    assert repair["state"] == RepairState.ADVISORY and repair["open_key"] is None
    assert "slurm.reboot_node" in w.rows("repair_plan")[0]["message"]
    assert w.slurm.changes("node2") == []


def test_blast_radius_counts_nodes_and_the_partition_share(tmp_path):
    # 8 nodes in partition gpu, 25 %: two may be out; the absolute limit (3) is not reached first.
    w = make_world(tmp_path, guards__blast_radius_max_share=0.25, guards__blast_radius_max_nodes=3)
    first, second, third = (w.request(node) for node in ("node1", "node2", "node3"))
    w.spin(30)  # 10 minutes
    states = [w.row(r)["state"] for r in (first, second, third)]
    assert states[:2] == [RepairState.RETURNED, RepairState.RETURNED]
    # Both count for the blast window (1 h) even back in service: node3 waits, its reason in its row and in
    # one ledger row (not one per look).
    assert states[2] == RepairState.REQUESTED
    third_row = w.row(third)
    assert third_row["held_reason"].startswith(
        "2 of the 8 nodes of partition gpu taken out in the last 1h (limit 2"
    )
    assert len([r for r in w.rows("guard") if r["data"]["repair_id"] == third]) == 1
    w.clock.advance(hours=1)
    w.settle()
    assert w.row(third)["state"] == RepairState.RETURNED


def test_repairs_the_blast_radius_holds_back_tell_a_person_once_a_window(tmp_path):
    """A node waiting on the blast radius keeps its fault and stays in service: a person is told, once per blast
    window however many nodes wait (bench/storm.py driver-rollout: 33 nodes with an Xid waited in silence)."""
    chat = FakeHttpPoster()
    w = make_world(
        tmp_path, guards__blast_radius_max_nodes=2, notify__webhook_url="http://chat.example/hook", http=chat
    )
    waiting = [w.request(node) for node in NODES[:5]][2:]
    w.spin(30)  # 10 minutes
    assert {w.row(r)["state"] for r in waiting} == {RepairState.REQUESTED}
    (told,) = [b for b in chat.bodies if b["nightshift"].get("guard") == "blast_radius"]
    assert (
        "blast radius reached" in told["text"]
        and "The repair of node node3 and later ones wait" in told["text"]
    )
    (row,) = [r for r in w.rows("notification") if r["data"]["notice"] == NoticeKind.BLAST_RADIUS]
    assert row["data"]["status"] == StepStatus.OK


def test_a_held_node_counts_for_the_blast_radius_past_the_window(tmp_path):
    w = make_world(tmp_path, guards__blast_radius_max_share=0.25, guards__blast_radius_max_nodes=3)
    w.shells["node1"].exit_codes = [226]
    held = w.request("node1")
    w.settle()
    assert w.row(held)["state"] == RepairState.HELD
    w.clock.advance(hours=2)  # the take-out is outside the window, the node still out
    first, second = w.request("node2"), w.request("node3")
    w.spin(10)
    assert w.row(first)["state"] == RepairState.RETURNED
    assert w.row(second)["state"] == RepairState.REQUESTED  # node1 (held) + node2: 2 of 8 at 25 %
    assert "node1" in w.row(second)["held_reason"]


def test_operator_hold_and_release(tmp_path):
    w = make_world(tmp_path, validate=(1,))
    # A node with no repair: held, so a later request is absorbed and nothing is done to it.
    w.worker.hold("node5", by="bob", note="vendor RMA", scheduler="slurm")
    assert w.worker.node("node5")["current"]["held_reason"] == "held by bob: vendor RMA"
    w.request("node5")
    w.settle()
    assert w.slurm.changes("node5") == []
    w.worker.release("node5", by="bob")
    assert w.worker.node("node5")["current"]["state"] == RepairState.RELEASED
    # A held node we took out: release returns it (resume), as released.
    repair_id = w.request("node2")
    w.settle()
    assert w.row(repair_id)["state"] == RepairState.HELD
    with pytest.raises(ValueError, match="already held"):
        w.worker.hold("node2", by="bob")
    w.worker.release("node2", by="alice", note="replaced the GPU")
    w.settle()
    assert w.row(repair_id)["state"] == RepairState.RELEASED
    assert w.slurm.changes("node2")[-1][-1] == "State=RESUME"
    with pytest.raises(LookupError):
        w.worker.release("node2", by="alice")


def test_kill_switch_holds_a_requested_repair(tmp_path):
    w = make_world(tmp_path, guards__kill_switch=True)
    repair_id = w.request()
    w.worker.work_once("w1")
    assert w.row(repair_id)["state"] == RepairState.REQUESTED
    assert w.slurm.changes("node2") == []


def test_request_is_idempotent_per_node(tmp_path):
    w = make_world(tmp_path)
    first = w.request("node3", incident_id=1)
    assert w.request("node3", incident_id=2) == first
    absorbed = w.rows("repair_absorbed")
    assert absorbed[0]["incident_id"] == 2 and absorbed[0]["data"]["repair_id"] == first


def test_api_lists_held_nodes_and_the_operator_releases_one(tmp_path):
    from app import create_app

    settings = Settings(data_dir=str(tmp_path / "var"), playbook_paths=[str(tmp_path / "playbooks")])
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "xid.yaml").write_text(PLAYBOOK)
    (tmp_path / "permissions.yaml").write_text(
        "apiVersion: nightshift/v1\nkind: Permissions\nallow:\n"
        + "".join(f"  - action: {name}\n" for name in ALL_GRANTS)
    )
    settings.permissions_file = str(tmp_path / "permissions.yaml")
    settings.webhook.auth_disabled = True
    (tmp_path / "operator").write_text("op-token")
    (tmp_path / "viewer").write_text("view-token")
    settings.operator_token_file = str(tmp_path / "operator")
    settings.access.viewer_token_file = str(tmp_path / "viewer")
    slurm = FakeSlurmHost(*NODES)
    shell = FakeNodeShell(226)
    clients = Clients(settings, slurm=SlurmClient(slurm), **{"node:node2": shell})
    clock = FakeClock()
    app = create_app(settings, clock=clock, clients=clients, metrics=Metrics())
    engine = app.extensions["nightshift"].engine
    with engine.deps.store.transaction() as conn:
        repairs.request_repair(
            conn,
            node="node2",
            scheduler="slurm",
            playbook="xid-reboot",
            incident_id=None,
            reason="Xid 79",
            now=clock.now(),
        )
    for _ in range(30):
        if engine.repairs.work_once("w") is None:
            clock.advance(20)
    client = app.test_client()
    viewer = {"Authorization": "Bearer view-token"}
    operator = {"Authorization": "Bearer op-token", "X-Nightshift-Operator": "alice"}
    assert client.get("/api/v1/nodes").status_code == 401  # reads need a reader
    listing = client.get("/api/v1/nodes", headers=viewer).json
    assert [(n["node"], n["state"]) for n in listing["held"]] == [("node2", "held")]
    assert listing["held"][0]["held_reason"].startswith(
        "validation failed: validation `dcgmi diag -r 2` exited 226"
    )
    assert "nightshift_nodes_held 1.0" in client.get("/metrics").text
    page = client.get("/nodes", headers=viewer)
    assert page.status_code == 200
    assert '<tr class="repair held" data-node="node2">' in page.text and "exited 226" in page.text
    detail = client.get("/api/v1/nodes/node2", headers=viewer).json
    assert detail["current"]["validation"]["verdict"] == "fail"
    assert client.get("/api/v1/nodes/node9", headers=viewer).status_code == 404
    bad = client.get("/api/v1/nodes/node%20x;rm", headers=viewer)
    assert bad.status_code == 400 and bad.json["status"] == "error"
    assert client.post("/api/v1/nodes/node2/release", headers=viewer).status_code == 403  # may read, not act
    released = client.post("/api/v1/nodes/node2/release", headers=operator, json={"reason": "GPU replaced"})
    assert released.status_code == 200 and released.json["current"]["state"] == "returning"
    assert client.post("/api/v1/nodes/node2/release", headers=operator).status_code == 409
    for _ in range(5):
        engine.repairs.work_once("w")
    assert client.get("/api/v1/nodes/node2", headers=viewer).json["current"]["state"] == "released"
    assert "nightshift_nodes_held 0.0" in client.get("/metrics").text
    assert 'nightshift_node_repairs_total{outcome="released"} 1.0' in client.get("/metrics").text
    held = client.post(
        "/api/v1/nodes/node3/hold", headers=operator, json={"reason": "RMA", "scheduler": "slurm"}
    )
    assert held.status_code == 200 and held.json["current"]["held_reason"] == "held by alice: RMA"
    assert client.post("/api/v1/nodes/node3/hold", headers=operator).status_code == 409
    assert (
        client.post("/api/v1/nodes/node4/hold", headers=operator, json={"scheduler": "pbs"}).status_code
        == 400
    )
    # The UI's forms: a logged-in operator holds node5 and releases node3 from the nodes page.
    ui = app.test_client()
    token = re.compile(r'name="csrf_token" value="([^"]+)"')
    form = token.search(ui.get("/login").text).group(1)  # type: ignore[union-attr]
    assert (
        ui.post("/login", data={"operator": "bob", "token": "op-token", "csrf_token": form}).status_code
        == 303
    )
    page = ui.get("/nodes").text
    csrf = token.search(page).group(1)  # type: ignore[union-attr]
    assert 'action="/nodes/node3/release"' in page and 'id="hold-form"' in page
    assert (
        ui.post("/nodes/hold", data={"node": "node5", "note": "fan", "csrf_token": csrf}).status_code == 303
    )
    assert ui.post("/nodes/hold", data={"node": "node5;x", "csrf_token": csrf}).status_code == 400
    assert ui.post("/nodes/node3/release", data={"csrf_token": "forged"}).status_code == 403
    assert ui.post("/nodes/node3/release", data={"note": "ok", "csrf_token": csrf}).status_code == 303
    states = {n["node"]: (n["state"], n["held_reason"]) for n in engine.repairs.nodes()["nodes"]}
    assert states["node5"] == ("held", "held by bob: fan") and states["node3"] == ("released", None)


@pytest.mark.parametrize("node", ["ALL", "all", "node[1-4]", "node1,node2", "node1 node2", "-x"])
def test_node_actions_refuse_anything_but_one_node(node: str):
    from app.actions.slurm import RebootNode, ValidateNode
    from app.clients.slurm import reboot_command
    from app.domain.errors import ParamError

    with pytest.raises(ParamError):
        RebootNode().validate({"node": node, "reason": "Xid 79"})
    with pytest.raises(ParamError):
        ValidateNode().validate({"node": node})
    with pytest.raises(ParamError):  # and again where the argv is built
        reboot_command(node, "nightshift: Xid 79")


def test_validation_parameters_are_bounded():
    from app.actions.kubernetes import ValidateNode as PodValidation
    from app.actions.slurm import ValidateNode
    from app.domain.errors import ParamError

    for action in (ValidateNode(), PodValidation()):
        for bad in (
            {"timeout_seconds": 0},
            {"timeout_seconds": 86_401},
            {"command": "dcgmi diag -r 2; reboot"},
        ):
            with pytest.raises(ParamError):
                action.validate({"node": "node1", **bad})
    long_node = ".".join(["a" * 60] * 4)  # a valid node name, too long for the pod's name
    with pytest.raises(ParamError, match="no valid pod name"):
        PodValidation().validate({"node": long_node})


def test_node_check_scripts_and_probe_parsing():
    from app.clients import node_check

    start = node_check.start_script(7, ["dcgmi", "diag", "-r", "2", "--host", "a'b;c"])
    assert "d=/tmp/nightshift-check-7;" in start and "setsid nohup bash -c " in start
    assert "'\"'\"'" in start  # the odd argument stays quoted inside the quoted inner script
    assert node_check.parse_probe("absent\n") == node_check.Probe("absent")
    assert node_check.parse_probe("running 12\n") == node_check.Probe("running", elapsed=12)
    assert node_check.parse_probe("done 130 226\nFail\n") == node_check.Probe("done", 130, 226, "Fail\n")
    for bad in ("", "done x 1", "rm -rf /\n"):
        with pytest.raises(ValueError):
            node_check.parse_probe(bad)
    with pytest.raises(ValueError):
        node_check.workdir(-1)


def test_a_held_node_is_told_to_people_once(tmp_path):
    """Held for a person: a notice on every channel (chat here), ledgered; not again while it stays held."""
    posted: list[dict[str, Any]] = []

    class Chat:
        def post_json(self, url: str, body: dict[str, Any], headers: Any = None) -> int:
            posted.append(body)
            return 200

    w = make_world(tmp_path, validate=(226,), notify__webhook_url="http://chat.example/hook")
    w.deps.clients = Clients(
        w.deps.settings, slurm=w.deps.clients.slurm, http=Chat(),
        **{f"node:{n}": shell for n, shell in w.shells.items()},
    )  # fmt: skip
    w.worker = type(w.worker)(w.deps)
    repair_id = w.request()
    w.settle()
    assert w.row(repair_id)["state"] == RepairState.HELD
    (notice,) = posted
    assert "node node2 held for a person" in notice["text"] and "exited 226" in notice["text"]
    assert w.rows("notification")
    w.request()  # absorbed by the held repair
    w.settle()
    assert len(posted) == 1


@pytest.mark.parametrize("node", ["ghost9", "node-unknown-1"])
def test_a_node_nothing_took_out_is_never_called_out_of_service_and_never_paged(tmp_path, node):
    """A take-out that failed (a name the scheduler does not know) leaves the node in service: the notice says so,
    and it is evidence, not a page (issue 22 item 5: 'Node ALL (slurm) is out of service and held', critical)."""
    from app.domain import paging

    posted: list[dict[str, Any]] = []

    class Chat:
        def post_json(self, url: str, body: dict[str, Any], headers: Any = None) -> int:
            posted.append(body)
            return 200

    w = make_world(tmp_path, notify__webhook_url="http://chat.example/hook")
    w.deps.clients = Clients(
        w.deps.settings, slurm=w.deps.clients.slurm, http=Chat(),
        **{f"node:{n}": shell for n, shell in w.shells.items()},
    )  # fmt: skip
    w.worker = type(w.worker)(w.deps)
    repair_id = w.request(node)
    w.settle()
    row = w.row(repair_id)
    assert row["state"] == RepairState.HELD and not row["taken_out_by_us"]
    (notice,) = posted
    assert "out of service and held" not in notice["text"] and "did not take" in notice["text"]
    (sent,) = w.rows("notification")
    kind = NoticeKind(sent["data"]["notice"])
    assert kind == NoticeKind.NODE_NOT_TAKEN_OUT
    assert paging.page_for(paging.Notice(kind, "s", notice["text"], notice["nightshift"])) is None


@pytest.mark.parametrize(("held_under", "fault_under"), [("kubernetes", "slurm"), ("slurm", "kubernetes")])
def test_an_operators_hold_holds_the_node_against_either_schedulers_faults(tmp_path, held_under, fault_under):
    """Issue 22 item 1: a hold keyed <scheduler>/<node> let the other scheduler's fault drain and reboot the node."""
    from app.store import repairs

    w = make_world(tmp_path)
    w.worker.hold("node2", by="alice", note="firmware work", scheduler=held_under)
    with w.store.transaction() as conn:
        absorbed = repairs.request_repair(
            conn, node="node2", scheduler=fault_under, playbook="xid-reboot", incident_id=9,
            reason="Xid 79", now=w.clock.now(),
        )  # fmt: skip
    w.settle()
    row = w.row(absorbed)
    assert row["state"] == RepairState.HELD and row["scheduler"] == held_under
    assert w.slurm.changes("node2") == []
    listing = w.worker.nodes()
    assert [r["node"] for r in listing["held"]] == ["node2"]


def test_a_repair_whose_tick_keeps_failing_is_held_for_a_person(tmp_path, monkeypatch):
    """Repair tick errors are bounded like incidents' (worker.max_tick_errors in a row), never retried forever."""
    w = make_world(tmp_path)

    def broken(argv: Any, timeout: float | None = None) -> Any:
        raise RuntimeError("a bug behind the partition lookup")

    monkeypatch.setattr(w.slurm, "run", broken)
    repair_id = w.request()
    limit = w.deps.settings.worker.max_tick_errors
    w.settle()
    row = w.row(repair_id)
    assert (row["state"], row["tick_errors"], row["taken_out_by_us"]) == (RepairState.HELD, limit, False)
    assert f"processing failed {limit} times in a row" in row["held_reason"]
    assert len(w.rows("engine_error")) == limit
