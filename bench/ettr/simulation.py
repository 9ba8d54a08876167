"""One run: a policy against a draw of faults in a fresh world, and what it cost.

The policies (each a set of responders acting on the same world, the same faults at the same times):

==============================  ====================================================================
``oracle``                      knows each fault as it strikes, does the cheapest right thing at once
``nightshift``                  the real engine with the shipped playbooks; the team answers its pages
``nightshift-no-issue25``       the same without the straggler and planned-swap playbooks
``nightshift-no-person``        the real engine, and nobody answering what it hands over
``on-call``                     a staffed 24/7 on-call answers every alert (5 min by day, 30 by night)
``team``                        people alone: the team answers every alert (20 min by day, 2 h by night)
``health-check-loop``           a requeue loop with a node health check; the team reads the channel
``naive-loop``                  a loop that requeues every exit; the team reads the channel
==============================  ====================================================================

Technicians repair nodes taken out of service (drained, held, dead) within ``manual_repair_hours`` in every
policy, the no-person one included: they are not the on-call.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.ettr.causes import Draw, Fault, Rates
from bench.ettr.detection import Detection
from bench.ettr.nightshift import Nightshift
from bench.ettr.responders import ON_CALL, TEAM, Oracle, People, RequeueLoop
from bench.ettr.world import Alert, Physics, World

POLICIES = (
    "oracle",
    "nightshift",
    "nightshift-no-issue25",
    "nightshift-no-person",
    "on-call",
    "team",
    "health-check-loop",
    "naive-loop",
)
ENGINE_POLICIES = ("nightshift", "nightshift-no-issue25", "nightshift-no-person")


class Responder(Protocol):
    def next_due(self) -> float: ...

    def step(self, world: World) -> None: ...


@dataclass
class Cast:
    """The responders of one policy, in the order they act at a moment."""

    responders: list[Responder]
    people: People | None = None
    nightshift: Nightshift | None = None

    def on_alerts(self, world: World, alerts: list[Alert]) -> None:
        if self.nightshift is not None:
            self.nightshift.on_alerts(world, alerts)
        if self.people is not None:
            self.people.alerted(world, min(a.at for a in alerts))


def cast(policy: str, world: World, seed: int, workdir: Path) -> Cast:
    rng = random.Random(seed * 7919 + 1)
    if policy == "oracle":
        return Cast([Oracle(world)])
    if policy in ("on-call", "team"):
        people = People(ON_CALL if policy == "on-call" else TEAM, rng, automated=False)
        return Cast([people], people=people)
    if policy in ("health-check-loop", "naive-loop"):
        people = People(TEAM, rng, automated=True)
        return Cast([RequeueLoop(health_check=policy == "health-check-loop"), people], people=people)
    if policy in ENGINE_POLICIES:
        world.replicate_peers = True  # the engine sees every node's alert, as from Alertmanager
        team = None if policy == "nightshift-no-person" else People(TEAM, rng, automated=True)
        engine = Nightshift(world, workdir, team, issue25=policy != "nightshift-no-issue25")
        responders: list[Responder] = [engine] if team is None else [engine, team]
        return Cast(responders, people=team, nightshift=engine)
    raise ValueError(f"unknown policy {policy!r}")


def schedule(faults: list[Fault]) -> list[tuple[float, str, Fault]]:
    """When each fault shows: its warning (if warned), then its strike."""
    events: list[tuple[float, str, Fault]] = []
    for fault in faults:
        if fault.warned:
            events.append((max(0.0, fault.at - fault.lead), "warn", fault))
        events.append((fault.at, "strike", fault))
    return sorted(events, key=lambda e: (e[0], e[1] != "warn"))


def run(
    policy: str,
    p: Physics,
    rates: Rates,
    draw: Draw,
    detection: Detection,
    seed: int,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """One policy over the whole horizon; the figures of :func:`summary`."""
    tmp = Path(tempfile.mkdtemp(prefix="ettr-")) if workdir is None else workdir
    try:
        world = World(p, detection, random.Random(seed), rates.straggler_speed)
        actors = cast(policy, world, seed, tmp)
        play(world, actors, schedule(draw.copies()), p.days * 86400)
        return summary(world, actors, p)
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def play(world: World, actors: Cast, events: list[tuple[float, str, Fault]], horizon: float) -> None:
    i = 0
    act: dict[str, Callable[[Fault], None]] = {"warn": world.warn, "strike": world.strike}
    while world.now < horizon:
        due = [events[i][0] if i < len(events) else math.inf, world.next_alert(), horizon]
        due += [r.next_due() for r in actors.responders]
        world.advance(max(world.now, min(due)))
        if world.now >= horizon:
            break
        while i < len(events) and events[i][0] <= world.now:
            act[events[i][1]](events[i][2])
            i += 1
        delivered = world.due_alerts()
        if delivered:
            actors.on_alerts(world, delivered)
        for responder in actors.responders:
            responder.step(world)


def summary(world: World, actors: Cast, p: Physics) -> dict[str, Any]:
    horizon = p.days * 86400
    people = actors.people
    out: dict[str, Any] = {
        "ettr": world.job.progress / horizon,
        "restarts": world.job.restarts,
        "restarts_onto_faulty_node": world.recrashes,
        "wrong_actions": world.wrong,
        "human_minutes": people.minutes if people else 0.0,
        "human_fixes": people.fixes if people else 0,
        "lost_hours": {k: v / 3600 for k, v in sorted(world.lost.items())},
        "exclusion_list_at_end": len(world.job.exc),
        "job_state_at_end": world.job.state,
    }
    if actors.nightshift is not None:
        extra = actors.nightshift.summary()
        out["wrong_actions"] += extra.pop("engine_wrong_actions")
        out.update(extra)
        out["handed_to_person"] = actors.nightshift.handed
    return out
