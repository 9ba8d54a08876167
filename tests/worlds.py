"""The engine under test, wired at our own seams: one :class:`World` (an engine over a fresh store, fake actions and
backends, a fake clock) and what tests ask of it, built by :func:`make_world` (incidents and their steps),
:func:`episode_world` (job episodes on the shipped scheduler actions) or directly (node repairs)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from app import build_engine
from app.actions import default_registry
from app.actions.registry import ActionRegistry
from app.clients import Clients
from app.config import Settings
from app.domain.alertmanager import parse_notification
from app.domain.outcome import Ok
from app.domain.params import NODE_NAME, SLURM_JOB_ID, Param
from app.domain.permissions import Grant, Permissions
from app.domain.playbooks import PlaybookSet, parse_playbooks
from app.engine import EngineDeps
from app.engine.ingest import IngestResult
from app.metrics import Metrics
from app.store import Store, records, repairs
from tests.fakes import FakeAction, FakeClock, FakePrometheus, FakeSample, FakeSlurm, Script, fake_actions
from tests.payloads import payload

PLAYBOOK = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: gpu-xid-79, description: "Xid 79: move the job, take the node out"}
match: ['alertname="GpuXidError"', 'xid=~"79|48"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
serialize: node
budget: {attempts: 3, window: 24h, backoff: 10m}
cooldown: 30m
recheck: 'DCGM_EXP_XID_ERRORS_COUNT{Hostname="{{ labels.Hostname }}",xid="{{ labels.xid }}"} > 0'
collect:
  - action: fake.logs
    with: {job: "{{ target.job }}"}
steps:
  - action: fake.drain
    with: {node: "{{ target.node }}", reason: "Xid {{ labels.xid }}"}
  - action: fake.requeue
    with: {job: "{{ target.job }}"}
  - action: fake.notice
    with: {text: "{{ diagnosis.summary }}"}
    when: ['diagnosis=~"gpu_.*"']
verify: {promql: 'increase(training_step_total{slurm_job_id="{{ target.job }}"}[2m]) > 0', timeout: 5m,
         interval: 30s}
on_resolved:
  - action: fake.resume
    with: {node: "{{ target.node }}"}
"""
# The same, for alerts without a job: a per-(playbook, target) incident on the node, serialised per node.
NODE_PLAYBOOK = (
    PLAYBOOK.replace(', job: "{{ labels.slurm_job_id }}"', "")
    .replace('collect:\n  - action: fake.logs\n    with: {job: "{{ target.job }}"}\n', "")
    .replace('  - action: fake.requeue\n    with: {job: "{{ target.job }}"}\n', "")
)
RECHECK = 'DCGM_EXP_XID_ERRORS_COUNT{Hostname="node1",xid="79"} > 0'
VERIFY = 'increase(training_step_total{slurm_job_id="1234"}[2m]) > 0'


GRANTS = ("fake.drain", "fake.requeue", "fake.resume")

PLAYBOOKS = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: nccl, description: "every rank reports it"}
match: ['alertname="TrainingJobError"', 'error_class="nccl"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
priority: 50
steps:
  - action: fake.requeue
    with: {job: "{{ target.job }}", exclude_nodes: "{{ incident.culprits }}"}
verify: {promql: 'increase(training_step_total{slurm_job_id="{{ target.job }}"}[2m]) > 0', timeout: 5m,
         interval: 30s}
---
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: xid, description: "node-scoped"}
match: ['alertname="GpuXidError"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
priority: 100
steps:
  - action: fake.requeue
    with: {job: "{{ target.job }}", exclude_nodes: "{{ incident.culprits }}"}
verify: {promql: 'increase(training_step_total{slurm_job_id="{{ target.job }}"}[2m]) > 0', timeout: 5m,
         interval: 30s}
node_repair: {}
---
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: straggler, description: "excluded from the job, not repaired until the third time"}
match: ['alertname="TrainingStraggler"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
priority: 20
exclude_node: {repair_after: 3, window: 24h}
steps:
  - action: fake.requeue
    with: {job: "{{ target.job }}", exclude_nodes: "{{ incident.culprits }}"}
"""
EPISODE_VERIFY = (
    'increase(training_step_total{slurm_job_id="4242"}[2m]) > 0'  # PLAYBOOKS' verification of job 4242
)


COLLECT_LOG = 'collect: [{action: fake.logs, with: {job: "{{ target.job }}"}}]\n'  # episode_world(log=...)


class World:
    """An engine over a fresh store of ``settings``, with the given playbooks (YAML), grants, clients, clock and
    registry; ``actions``: the fake actions among them (their calls), ``prometheus`` and ``slurm``: the fakes
    behind ``clients``, ``notifications``: what reached the chat webhook."""

    def __init__(
        self,
        settings: Settings,
        *,
        playbooks: str,
        grants: Iterable[str],
        clients: Clients,
        clock: FakeClock,
        registry: ActionRegistry | None = None,
        actions: Mapping[str, FakeAction] | None = None,
        prometheus: FakePrometheus | None = None,
        slurm: Any = None,
        notifications: list[tuple[str, str]] | None = None,
    ):
        registry = registry or default_registry()
        self.clock = clock
        self.engine = build_engine(
            settings,
            clock=clock,
            clients=clients,
            registry=registry,
            playbooks=PlaybookSet(parse_playbooks(playbooks, "world.yaml", registry)),
            permissions=Permissions(Grant(action=name) for name in grants),
        )
        self.worker = self.engine.repairs
        self.actions = dict(actions or {})
        self.prometheus = prometheus
        self.slurm = slurm
        self.notifications = notifications if notifications is not None else []

    @property
    def deps(self) -> EngineDeps:
        return self.engine.deps

    @property
    def store(self) -> Store:
        return self.engine.deps.store

    @property
    def metrics(self) -> Metrics:
        return self.engine.deps.metrics

    # --- incidents ------------------------------------------------------------------------------------------

    def send(self, *alerts: dict[str, Any]) -> IngestResult:
        return self.engine.ingest(parse_notification(json.dumps(payload(*alerts))))

    def run(self, ticks: int = 500) -> int:
        """Work until idle (at most ``ticks`` rounds); the clock does not move."""
        return self.engine.run_until_idle(limit=ticks)

    def incident(self, incident_id: int) -> dict[str, Any]:
        detail = self.engine.incident(incident_id)
        assert detail is not None
        return detail["incident"]

    def incidents(self) -> list[dict[str, Any]]:
        return self.engine.incidents(limit=100)

    def only(self) -> dict[str, Any]:
        incidents = self.incidents()
        assert len(incidents) == 1, [(i["id"], i["kind"], i["open_key"]) for i in incidents]
        return incidents[0]

    def steps(self, incident_id: int, phase: str = "steps") -> list[tuple[str, str]]:
        detail = self.engine.incident(incident_id)
        assert detail is not None
        return [(s["action"], s["status"]) for s in detail["steps"] if s["phase"] == phase]

    def ledger(self, incident_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        detail = self.engine.incident(incident_id)
        assert detail is not None
        return [row for row in detail["ledger"] if kind is None or row["kind"] == kind]

    def calls(self, action: str) -> list[dict[str, Any]]:
        return self.actions[action].script.calls

    @property
    def requeue(self) -> FakeAction:
        return self.actions["fake.requeue"]

    # --- node repairs ---------------------------------------------------------------------------------------

    def request(
        self, node: str, scheduler: str, playbook: str | None = None, incident_id: int | None = None
    ) -> int:
        with self.store.transaction() as conn:
            return repairs.request_repair(
                conn, node=node, scheduler=scheduler, playbook=playbook, incident_id=incident_id,
                reason="Xid 79 on GPU 3", now=self.clock.now(),
            )  # fmt: skip

    def row(self, repair_id: int) -> dict[str, Any]:
        with self.store.read() as conn:
            row = repairs.get_repair(conn, repair_id)
        assert row is not None
        return row.as_dict()

    def repair(self, node: str) -> dict[str, Any] | None:
        """The node's newest repair."""
        with self.store.read() as conn:
            found = repairs.list_repairs(conn, node=node, limit=1)
        return found[0].as_dict() if found else None

    def settle(self, limit: int = 50, step_seconds: float = 20) -> None:
        """Tick the repair worker until nothing is due, advancing the clock past each wait (bounded)."""
        for _ in range(limit):
            if self.worker.work_once("w1") is None:
                with self.store.read() as conn:
                    waiting = [r for r in repairs.list_repairs(conn, open_only=True) if r.next_run_at]
                if not waiting:
                    return
                self.clock.advance(step_seconds)
        raise AssertionError("repair did not settle")

    def spin(self, rounds: int, step_seconds: float = 20) -> None:
        """Work until idle, then advance the clock, ``rounds`` times (for repairs that wait on purpose)."""
        for _ in range(rounds):
            self.tick(20)
            self.clock.advance(step_seconds)

    def tick(self, times: int) -> None:
        for _ in range(times):
            self.worker.work_once("w1")

    def counter(self, outcome: str) -> float:
        sample = self.metrics.registry.get_sample_value("nightshift_node_repairs_total", {"outcome": outcome})
        return sample or 0.0

    def rows(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every ledger row (of ``kind``), whatever it is about."""
        with self.store.read() as conn:
            return [r.as_dict() for r in records.iter_ledger(conn) if kind is None or r.kind == kind]

    def close(self) -> None:
        self.store.dispose()


def make_world(
    tmp_path: Any,
    grants: Iterable[str] = (),
    playbooks: str = PLAYBOOK,
    correlation_seconds: int = 0,
    **guard_settings: Any,
) -> World:
    """Incidents on :data:`PLAYBOOK`'s fake actions (:func:`tests.fakes.fake_actions`), the re-check holding on
    node1, every job running, notifications collected from the chat webhook. ``correlation_seconds`` 0: a job
    incident acts at once (the window has its own tests, test_episodes.py). Every job runs, on no node the alerts
    name: culprits stay evidence (test_episodes.py covers exclusion)."""
    actions = fake_actions()
    settings = Settings(data_dir=str(tmp_path))
    settings.episodes.correlation_seconds = correlation_seconds
    for key, value in guard_settings.items():
        setattr(settings.guards, key, value)
    prometheus = FakePrometheus()
    prometheus.answers[RECHECK] = [FakeSample({"Hostname": "node1"}, 1)]
    notifications: list[tuple[str, str]] = []

    class Notifier:
        """Collects engine notifications through the real send_notification path (webhook channel)."""

        def post_json(self, url: str, body: dict[str, Any], headers: Any = None) -> int:
            notifications.append((url, body["text"]))
            return 200

    settings.notify.webhook_url = "http://chat.example/hook"
    slurm = FakeSlurm(default=("RUNNING", ""))
    return World(
        settings,
        playbooks=playbooks,
        grants=grants,
        clients=Clients(settings, prometheus=prometheus, http=Notifier(), slurm=slurm),
        clock=FakeClock(),
        registry=ActionRegistry(actions.values()),
        actions=actions,
        prometheus=prometheus,
        slurm=slurm,
        notifications=notifications,
    )


def nccl(node: str, rank: int, job: str = "4242") -> dict[str, str]:
    return {"alertname": "TrainingJobError", "error_class": "nccl", "Hostname": node, "rank": str(rank),
            "slurm_job_id": job}  # fmt: skip


def requeue_action() -> FakeAction:
    return FakeAction(
        "fake.requeue",
        params={
            "job": Param(pattern=SLURM_JOB_ID),
            "exclude_nodes": Param(pattern=rf"{NODE_NAME}(,{NODE_NAME})*", required=False),
        },
    )


def episode_world(
    tmp_path: Any,
    *,
    playbooks: str = PLAYBOOKS,
    url: str | None = None,
    clock: FakeClock | None = None,
    slurm: FakeSlurm | None = None,
    log: str | None = None,
    **episode_settings: Any,
) -> World:
    """Job episodes on :data:`PLAYBOOKS` (a granted fake requeue; the repair lifecycle plans with the scheduler's
    own actions, not granted). ``url``: the store's (default: SQLite in ``tmp_path``); ``log``: what the nccl
    playbook's collect step reads for the diagnosis (None: it collects nothing, and the diagnosis reads the labels
    alone)."""
    requeue = requeue_action()
    actions = {"fake.requeue": requeue}
    registry = default_registry()
    registry.register(requeue)
    if log is not None:
        actions["fake.logs"] = FakeAction("fake.logs", read_only=True, params={"job": Param(pattern=SLURM_JOB_ID)},
                                          script=Script([Ok(output="log", data={"log": log})]))  # fmt: skip
        registry.register(actions["fake.logs"])
        assert "priority: 50\n" in playbooks
        playbooks = playbooks.replace("priority: 50\n", f"priority: 50\n{COLLECT_LOG}", 1)
    settings = Settings(data_dir=str(tmp_path), store_url=url)
    for key, value in episode_settings.items():
        setattr(settings.episodes, key, value)
    prometheus = FakePrometheus()
    slurm = slurm or FakeSlurm({"4242": ("RUNNING", "node1,node2")})
    return World(
        settings,
        playbooks=playbooks,
        grants=("fake.requeue",),
        clients=Clients(settings, prometheus=prometheus, slurm=slurm),
        clock=clock or FakeClock(),
        registry=registry,
        actions=actions,
        prometheus=prometheus,
        slurm=slurm,
    )


def matching_that_raises_on(world: World, hostname: str) -> Callable[[Mapping[str, str]], list[Any]]:
    """The world's playbook matching, raising for the alerts of ``hostname``: a bug in matching, which the inbox sets
    the notification aside for."""
    real = world.engine.deps.playbooks.match

    def match(labels: Mapping[str, str]) -> list[Any]:
        if labels.get("Hostname") == hostname:
            raise RuntimeError("a bug in matching")
        return real(labels)

    return match
