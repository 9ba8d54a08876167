"""Who acts on the world besides Nightshift: people, the requeue loops, and the oracle.

* :class:`People`: a person answers after a delay that depends on the time of day (:class:`Staff`), looks, and
  if the job hurts or a node of its allocation is at fault does the fix by hand (:func:`fix_by_hand`): finds
  each node at fault with probability ``accuracy`` (otherwise takes a healthy one out), drains it, trims the
  job's exclusion list to nodes still at fault, rolls a corrupted job back to its last clean checkpoint, waits
  out a storage outage, requeues. Every look at a page costs ``triage_minutes``, every fix ``fix_minutes`` more;
  a glance at the people channel that finds nothing to do costs nothing.
* :class:`RequeueLoop`: a script that requeues the job within a minute of its exit; with ``health_check`` it also
  watches the nodes' health (DCGM health watches: Xid and ECC errors; the NIC's port state; Slurm's DOWN) every
  minute, drains a node that fails it and requeues the job off it before the job even exits.
* :class:`Oracle`: knows every fault the moment it strikes and does the cheapest right thing at once: the
  lower bound of the lost time (the work since the last checkpoint and the restart are unavoidable).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta

from bench.ettr.causes import KINDS, Fault
from bench.ettr.world import START, World

# Faults a node health check sees (DCGM's health watches report Xid and ECC errors; ibstat a dead port).
HEALTH_CHECK_SEES = {name for name, kind in KINDS.items() if kind.xid} | {"nic", "host_hardware"}


@dataclass(frozen=True)
class Staff:
    """How fast people answer (minutes, by day 07:00-22:00 and by night) and how well."""

    name: str
    day_minutes: float
    night_minutes: float
    fix_minutes: float = 15.0
    triage_minutes: float = 5.0
    accuracy: float = 0.9  # finds the node at fault (assumed), otherwise takes out a healthy one
    trust_minutes: float = 30.0  # with automation running, the people channel is read this much later

    def delay(self, at: float) -> float:
        hour = (START + timedelta(seconds=at)).hour
        night = hour >= 22 or hour < 7
        return (self.night_minutes if night else self.day_minutes) * 60


# The people of the baselines: a team without a night rota (best effort), and a staffed 24/7 on-call.
TEAM = Staff("team", day_minutes=20, night_minutes=120)
ON_CALL = Staff("on-call", day_minutes=5, night_minutes=30)


def fix_by_hand(world: World, staff: Staff, rng: random.Random) -> None:
    """What a person does to a hurting job (see the module's docstring)."""
    job, now = world.job, world.now
    culprits = world.culprits()
    bad = set(culprits)
    healthy = [n for n in job.allocation if n not in bad] if culprits else []
    for culprit in culprits:
        target = culprit if rng.random() < staff.accuracy or not healthy else rng.choice(healthy)
        if target != culprit:
            world.wrong += 1
        world.nodes[target].take_out(now, "person")
    job.exc = {n for n in job.exc if not world.nodes[n].healthy(now)}
    if job.state == "PENDING":
        return
    if world.outage_until > now:
        world.requeue(rollback=True, delay=world.outage_until - now + world.p.queue_seconds)
    elif world.hurting():
        world.requeue(rollback=True)


class People:
    """People who answer ``staff``'s way; ``channel``: they read every alert as it comes (no automation) or, with
    automation running, ``trust_minutes`` later; pages always as they come."""

    def __init__(self, staff: Staff, rng: random.Random, automated: bool):
        self.staff, self.rng, self.automated = staff, rng, automated
        self.look_at = -1.0
        self.paged = False
        self.minutes = 0.0
        self.fixes = 0
        self.pages = 0

    def alerted(self, world: World, at: float) -> None:
        """An alert reached the people channel at ``at``."""
        if self.look_at < 0:
            trust = self.staff.trust_minutes * 60 if self.automated else 0.0
            self.look_at = at + self.staff.delay(at) + trust
            self.paged = not self.automated

    def page(self, world: World) -> None:
        """Nightshift handed something over (a page)."""
        self.pages += 1
        later = self.look_at < 0 or self.look_at > world.now + self.staff.delay(world.now)
        if later:
            self.look_at = world.now + self.staff.delay(world.now)
        self.paged = True

    def next_due(self) -> float:
        return self.look_at if self.look_at >= 0 else math.inf

    def step(self, world: World) -> None:
        if not 0 <= self.look_at <= world.now:
            return
        paged, self.look_at, self.paged = self.paged, -1.0, False
        if paged:
            self.minutes += self.staff.triage_minutes
        if not world.needs_fix():
            return
        if not paged:
            self.minutes += self.staff.triage_minutes
        self.minutes += self.staff.fix_minutes
        self.fixes += 1
        fix_by_hand(world, self.staff, self.rng)
        # They come back to check it worked (a wrong node, a second fault): only a look that acts costs time.
        self.look_at = world.now + self.staff.delay(world.now)


class RequeueLoop:
    """Requeue the job within ``poll`` seconds of its exit; with ``health_check``, also drain and requeue off a
    node of the job whose health check fails. It looks every ``poll`` seconds: it acts one poll after the trouble
    begins."""

    def __init__(self, health_check: bool, poll: float = 60.0):
        self.health_check, self.poll = health_check, poll
        self.act_at = -1.0

    def next_due(self) -> float:
        return self.act_at if self.act_at >= 0 else math.inf

    def _bad(self, world: World) -> list[str]:
        if not self.health_check:
            return []
        nodes = world.nodes
        return [
            n
            for n in sorted(world.touched & world.in_job)
            if nodes[n].fault in HEALTH_CHECK_SEES or nodes[n].down_until > world.now
        ]

    def step(self, world: World) -> None:
        job = world.job
        trouble = job.state == "FAILED" or (job.state == "RUNNING" and bool(self._bad(world)))
        if not trouble:
            self.act_at = -1.0
            return
        if self.act_at < 0:
            self.act_at = world.now + self.poll
        if world.now < self.act_at:
            return
        self.act_at = -1.0
        for name in self._bad(world):
            world.nodes[name].take_out(world.now, "health check")
        world.requeue(rollback=False)


class Oracle:
    """Knows each fault as it strikes and does the cheapest right thing at once."""

    def __init__(self, world: World):
        self.world = world
        world.on_event.append(self.see)

    def next_due(self) -> float:
        return math.inf

    def step(self, world: World) -> None:
        job = world.job
        if job.state == "FAILED":
            world.requeue(rollback=True)  # anything that still crashed (a restart into an outage)

    def see(self, what: str, node: str, fault: Fault | None) -> None:
        world = self.world
        job = world.job
        kind = KINDS[fault.kind] if fault else None
        if what == "warning":
            # Swap the node out at a checkpoint; its repair finds the fault before it strikes.
            world.nodes[node].take_out(world.now, "oracle: warning")
            world.nodes[node].warned = ""
            if node in job.allocation and job.state == "RUNNING":
                world.checkpoint_now()
                world.requeue(rollback=False)
            return
        if kind is None or fault is None:
            return
        if kind.effect == "slow":
            keep_cost = (fault.length or math.inf) * (1 - world.nodes[node].speed)
            swap_cost = world.p.restart_minutes * 60 + world.p.checkpoint_seconds
            if keep_cost <= swap_cost:
                return
            world.nodes[node].take_out(world.now, "oracle: straggler")
            if job.state == "RUNNING":
                world.checkpoint_now()
                world.requeue(rollback=False)
            return
        if kind.node_bound or kind.effect == "node_down":
            world.nodes[node].take_out(world.now, "oracle")
        if job.state == "PENDING" or (node not in job.allocation and kind.node_bound):
            return
        if world.outage_until > world.now:
            world.requeue(rollback=False, delay=world.outage_until - world.now + world.p.queue_seconds)
        elif world.hurting() or kind.effect == "nan":
            world.requeue(rollback=True)
