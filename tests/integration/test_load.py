"""Scale, by counts rather than timings.

- 10,000 notifications with duplicates, repeats, reordering and resolved-before-firing go through the engine's
  ingest into a real SQLite store; the incidents expected are computed from the generated stream's own plan
  (episodes of alert instances per target), and the store holds exactly those: none lost, none doubled.
- An alert storm across 20 nodes trips the blast-radius guard: only N nodes are disrupted, the others wait,
  one storm notice goes out, and return-to-service steps still run meanwhile.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from app.domain.alertmanager import am_fingerprint, parse_notification
from app.store.schema import alerts, incident_alerts, incidents
from tests.fakes import START, FakeSample
from tests.payloads import alert, payload, xid
from tests.worlds import GRANTS, PLAYBOOK, make_world

NOTIFICATIONS = 10_000
Instance = tuple[str, str]  # (fingerprint, startsAt) as Alertmanager identifies an alert instance


@dataclass
class Stream:
    """The notifications to deliver, in order, and what they must produce."""

    notifications: list[list[dict[str, Any]]] = field(default_factory=list)
    # One expected incident per episode: (node, its alert instances, still open at the end).
    episodes: list[tuple[str, frozenset[Instance], bool]] = field(default_factory=list)
    instances: set[Instance] = field(default_factory=set)
    resolved_first: set[Instance] = field(default_factory=set)

    @property
    def deliveries(self) -> int:
        return sum(len(n) for n in self.notifications)


def instance_of(doc: dict[str, Any]) -> Instance:
    return am_fingerprint(doc["labels"]), doc["startsAt"]


def target_events(rng: random.Random, n: int, stream: Stream) -> list[dict[str, Any]]:
    """One node's alert documents, in delivery order: episodes one after another; within one, every instance
    fires (with duplicates, shuffled) before any resolves (shuffled with late firing copies and repeats)."""
    node, job = f"node-{n:04d}", str(10_000 + n)
    events: list[dict[str, Any]] = []
    episodes = rng.randint(1, 3)
    for e in range(episodes):
        starts = START + timedelta(hours=e, seconds=n)
        firing = [
            alert(xid(node=node, job=job, gpu=str(g)), starts_at=starts) for g in range(rng.randint(1, 3))
        ]
        resolves = e < episodes - 1 or rng.random() < 0.7
        phase1 = [doc for doc in firing for _ in range(rng.randint(1, 3))]
        rng.shuffle(phase1)
        phase2 = [doc for doc in firing for _ in range(rng.randint(0, 2))]  # repeats and late copies
        if resolves:
            ends = starts + timedelta(minutes=5)
            phase2 += [
                {**doc, "status": "resolved", "endsAt": ends.isoformat().replace("+00:00", "Z")}
                for doc in firing
                for _ in range(rng.randint(1, 2))
            ]
        rng.shuffle(phase2)
        events += phase1 + phase2
        members = frozenset(instance_of(doc) for doc in firing)
        stream.episodes.append((node, members, not resolves))
        stream.instances |= members
    # Resolved before firing: an instance whose firing copies arrive after its resolution (a reordering
    # Alertmanager retries can produce) never opens anything.
    for _ in range(rng.randint(0, 2)):
        starts = START + timedelta(hours=rng.randint(0, 3), minutes=30, seconds=rng.randint(0, 59))
        late = alert(xid(node=node, job=job, gpu="7"), starts_at=starts)
        resolved = {**late, "status": "resolved", "endsAt": late["startsAt"]}
        at = rng.randint(0, len(events))
        events.insert(at, resolved)
        for _ in range(rng.randint(1, 2)):
            events.insert(rng.randint(at + 1, len(events)), late)
        stream.instances.add(instance_of(late))
        stream.resolved_first.add(instance_of(late))
    return events


def group(rng: random.Random, events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive events batched into notifications of one to three alerts, order kept."""
    out = []
    while events:
        size = rng.choice((1, 1, 1, 2, 3))
        out.append(events[:size])
        events = events[size:]
    return out


def generate(seed: int) -> Stream:
    rng = random.Random(seed)
    stream = Stream()
    per_target: list[list[list[dict[str, Any]]]] = []
    total = 0
    n = 0
    while total < NOTIFICATIONS - 40:
        checkpoint = (len(stream.episodes), set(stream.instances), set(stream.resolved_first))
        batches = group(rng, target_events(rng, n, stream))
        if total + len(batches) > NOTIFICATIONS:  # would overshoot: take this target back, pad instead
            stream.episodes = stream.episodes[: checkpoint[0]]
            stream.instances, stream.resolved_first = checkpoint[1], checkpoint[2]
            break
        per_target.append(batches)
        total += len(batches)
        n += 1
    # Interleave the targets at random, each target's own order kept.
    queues = [list(reversed(batches)) for batches in per_target]
    while queues:
        queue = rng.choice(queues)
        stream.notifications.append(queue.pop())
        if not queue:
            queues.remove(queue)
    # Pad to exactly NOTIFICATIONS with repeats of resolved notifications (no-ops once delivered).
    resolved = [batch for batch in stream.notifications if all(a["status"] == "resolved" for a in batch)]
    while len(stream.notifications) < NOTIFICATIONS:
        stream.notifications.append(rng.choice(resolved))
    return stream


def test_ten_thousand_notifications_yield_exactly_the_expected_incidents(tmp_path):
    stream = generate(seed=20261202)
    assert len(stream.notifications) == NOTIFICATIONS
    kinds = Counter(a["status"] for batch in stream.notifications for a in batch)
    assert kinds["firing"] > 5000 and kinds["resolved"] > 2000 and stream.resolved_first

    world = make_world(tmp_path, GRANTS)
    for batch in stream.notifications:
        world.engine.ingest(parse_notification(json.dumps(payload(*batch))))

    with world.engine.deps.store.transaction() as conn:
        stored = {
            row.id: (row.fingerprint, row.starts_at.isoformat().replace("+00:00", "Z"), row.status)
            for row in conn.execute(
                select(alerts.c.id, alerts.c.fingerprint, alerts.c.starts_at, alerts.c.status)
            )
        }
        delivered = conn.execute(select(func.sum(alerts.c.notifications))).scalar_one()
        links = conn.execute(select(incident_alerts.c.incident_id, incident_alerts.c.alert_id)).all()
        rows = conn.execute(
            select(incidents.c.id, incidents.c.job, incidents.c.open_key, incidents.c.outcome)
        )
        # Each node's alerts name its one job (node-NNNN runs job 1NNNN): one job incident per episode.
        found = {
            row.id: (f"node-{int(row.job) - 10_000:04d}", row.open_key is not None, row.outcome)
            for row in rows
        }

    # Every alert instance recorded exactly once, every delivery of it counted.
    assert sorted((fp, starts) for fp, starts, _ in stored.values()) == sorted(stream.instances)
    assert delivered == stream.deliveries
    assert all(
        status == "resolved"
        for fp, starts, status in stored.values()
        if (fp, starts) in stream.resolved_first
    )
    # Exactly one incident per episode, holding exactly that episode's instances, open iff it never resolved.
    members: dict[int, set[Instance]] = {incident_id: set() for incident_id in found}
    for incident_id, alert_id in links:
        members[incident_id].add(stored[alert_id][:2])
    actual = Counter((node, frozenset(members[i]), is_open) for i, (node, is_open, _) in found.items())
    assert actual == Counter(stream.episodes)
    assert {outcome for _, is_open, outcome in found.values() if not is_open} == {"resolved"}
    assert len(found) == len(stream.episodes) > 1000


RETURN_TO_SERVICE = """
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: node-healthy, description: "return a repaired node to service"}
match: ['alertname="GpuNodeHealthy"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}"}
steps:
  - action: fake.resume
    with: {node: "{{ target.node }}"}
"""


def test_storm_across_twenty_nodes_trips_the_blast_radius_and_return_to_service_still_runs(tmp_path):
    world = make_world(
        tmp_path, GRANTS, playbooks=PLAYBOOK + "---\n" + RETURN_TO_SERVICE, blast_radius_max_nodes=3
    )
    world.prometheus.default = [FakeSample({}, 1.0)]  # every re-check holds; verification succeeds
    storm = [alert(xid(node=f"gpu-{n:02d}", job=str(900 + n))) for n in range(20)]
    opened = world.send(*storm).opened
    healthy = [alert({"alertname": "GpuNodeHealthy", "Hostname": f"spare-{n}"}) for n in range(3)]
    assert len(opened) == 20

    for _ in range(10):  # five minutes of worker ticks through the storm
        world.run()
        world.send(*healthy[:1], *storm)  # Alertmanager keeps re-sending the group meanwhile
        world.clock.advance(30)
    world.send(*healthy[1:])
    world.run()

    drained = {call["node"] for call in world.calls("fake.drain")}
    assert len(drained) == 3 and len(world.calls("fake.drain")) == 3
    states = Counter(world.incident(i)["state"] for i in opened)
    assert states == Counter({"recovered": 3, "waiting": 17})
    waiting = [world.incident(i) for i in opened if world.incident(i)["state"] == "waiting"]
    assert all("taken out in the last 1h (limit 3)" in inc["reason"] for inc in waiting)
    assert sorted(call["job"] for call in world.calls("fake.requeue")) == sorted(
        str(900 + int(node.removeprefix("gpu-"))) for node in drained
    )
    notices = [text for _, text in world.notifications if "blast radius reached" in text]
    assert len(notices) == 1
    # Return-to-service is never held by the blast radius: every spare node was resumed during the storm.
    assert sorted(call["node"] for call in world.calls("fake.resume")) == ["spare-0", "spare-1", "spare-2"]
