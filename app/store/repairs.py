"""Node repair records (table ``node_repairs``): query functions over an open connection, no decisions.

One open repair per node (``open_key`` = ``node/<node>``, whatever the scheduler, while its state is in
``REPAIR_OPEN``, NULL once settled), claimed by one worker at a time like incidents. Every change the engine
makes is written with its ledger row in the same transaction (:func:`write_transition`); ledger rows carry the
requesting incident's id and ``data.node`` / ``data.repair_id``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from app.domain.states import REPAIR_OPEN, LedgerKind, RepairState, StepStatus
from app.store import records
from app.store.rows import Repair
from app.store.schema import node_repairs, steps

MAX_LIST = 1000  # rows one listing returns at most (API ``limit`` is clamped to this)


def open_key(scheduler: str, node: str) -> str:
    """The node's identity, whatever the scheduler (``scheduler`` is kept for callers): one open repair per node,
    so an operator's hold under one scheduler also holds the node against the other's faults (issue 22 item 1)."""
    del scheduler
    return f"node/{node}"


def _one(conn: Connection, stmt: Any) -> Repair | None:
    row = conn.execute(stmt).first()
    return Repair.from_row(dict(row._mapping)) if row is not None else None


def _ledger(
    conn: Connection,
    now: datetime,
    kind: LedgerKind,
    message: str,
    *,
    node: str,
    repair_id: int,
    incident_id: int | None,
    **data: Any,
) -> None:
    records.record(
        conn,
        now,
        kind,
        f"node {node}: {message}",
        incident_id=incident_id,
        data={"node": node, "repair_id": repair_id, **data},
    )


def get_repair(conn: Connection, repair_id: int) -> Repair | None:
    return _one(conn, select(node_repairs).where(node_repairs.c.id == repair_id))


def open_repair(conn: Connection, scheduler: str, node: str) -> Repair | None:
    """The node's open repair (held included) under any scheduler, if any (rows written before open keys named
    the node alone carry ``<scheduler>/<node>``: found by the node too)."""
    del scheduler
    stmt = select(node_repairs).where(node_repairs.c.node == node, node_repairs.c.open_key.is_not(None))
    return _one(conn, stmt.order_by(node_repairs.c.id.desc()).limit(1))


def open_repair_of(conn: Connection, node: str) -> Repair | None:
    """The open repair of ``node`` whatever its scheduler, locked until the transaction ends (an operator's
    change must not interleave with a worker claiming it; SQLite's writer lock does the same)."""
    stmt = select(node_repairs).where(node_repairs.c.node == node, node_repairs.c.open_key.is_not(None))
    return _one(conn, stmt.order_by(node_repairs.c.id.desc()).limit(1).with_for_update())


def request_repair(
    conn: Connection,
    *,
    node: str,
    scheduler: str,
    playbook: str | None,
    incident_id: int | None,
    reason: str,
    now: datetime,
) -> int:
    """Ask for a repair of ``node``; returns the id of the repair that will carry it out.

    Idempotent: an open repair of the node (any state in ``REPAIR_OPEN``, held included) absorbs the request (a
    ``repair_absorbed`` ledger row), also when another replica inserts one concurrently."""
    existing = open_repair(conn, scheduler, node)
    if existing is None:
        values: dict[str, Any] = {
            "node": node,
            "scheduler": scheduler,
            "state": RepairState.REQUESTED,
            "open_key": open_key(scheduler, node),
            "playbook": playbook,
            "incident_id": incident_id,
            "reason": reason,
            "taken_out_by_us": False,
            "repairs": 1,
            "retries": 0,
            "steps": [],
            "created_at": now,
            "updated_at": now,
            "next_run_at": now,
        }
        try:
            with conn.begin_nested():
                repair_id = records.inserted_id(conn.execute(insert(node_repairs).values(values)))
        except IntegrityError:  # another writer opened one first: join it
            existing = open_repair(conn, scheduler, node)
            assert existing is not None
        else:
            _ledger(
                conn, now, LedgerKind.REPAIR_REQUESTED, f"repair requested: {reason}",
                node=node, repair_id=repair_id, incident_id=incident_id, playbook=playbook,
            )  # fmt: skip
            return repair_id
    _ledger(
        conn,
        now,
        LedgerKind.REPAIR_ABSORBED,
        f"repair already {existing.state} (repair #{existing.id}): request absorbed ({reason})",
        node=node,
        repair_id=existing.id,
        incident_id=incident_id,
        state=existing.state,
    )
    return existing.id


def insert_held(conn: Connection, *, node: str, scheduler: str, reason: str, now: datetime) -> Repair:
    """A held record for a node with no open repair (an operator's hold): no later request repairs it."""
    values = {
        "node": node,
        "scheduler": scheduler,
        "state": RepairState.HELD,
        "open_key": open_key(scheduler, node),
        "reason": reason,
        "held_reason": reason,
        "taken_out_by_us": False,
        "repairs": 0,
        "retries": 0,
        "steps": [],
        "created_at": now,
        "updated_at": now,
    }
    try:
        with conn.begin_nested():
            repair_id = records.inserted_id(conn.execute(insert(node_repairs).values(values)))
    except IntegrityError:  # a request opened a repair of the node meanwhile
        raise ValueError(f"node {node} has an open repair now; try again") from None
    _ledger(conn, now, LedgerKind.REPAIR_HELD, reason, node=node, repair_id=repair_id, incident_id=None,
            state=RepairState.HELD)  # fmt: skip
    held = get_repair(conn, repair_id)
    assert held is not None
    return held


def write_transition(
    conn: Connection,
    repair: Repair,
    now: datetime,
    *,
    kind: LedgerKind,
    message: str,
    data: Mapping[str, Any] | None = None,
    **values: Any,
) -> None:
    """Change the repair's columns and write its ledger row, in the caller's one transaction. A settled state
    clears the open key (the node may be repaired again) and the schedule."""
    state = values.get("state")
    if state is not None and state not in REPAIR_OPEN:
        values.update(open_key=None, closed_at=now, next_run_at=None, step=None, step_status=None)
    if state == RepairState.HELD:
        values.update(next_run_at=None, step=None, step_status=None)
    conn.execute(update(node_repairs).where(node_repairs.c.id == repair.id).values(updated_at=now, **values))
    _ledger(conn, now, kind, message, node=repair.node, repair_id=repair.id, incident_id=repair.incident_id,
            **{"state": state or repair.state, **(data or {})})  # fmt: skip


def update_repair(conn: Connection, repair_id: int, now: datetime, **values: Any) -> None:
    """Change bookkeeping columns that are no transition (the running marker, a guard's next look)."""
    conn.execute(update(node_repairs).where(node_repairs.c.id == repair_id).values(updated_at=now, **values))


def earlier_repairs(conn: Connection, node: str, since: datetime, exclude_id: int) -> int:
    """How many other repairs took ``node`` out since ``since`` (the lemon rule's count)."""
    stmt = select(func.count()).where(
        node_repairs.c.node == node,
        node_repairs.c.id != exclude_id,
        node_repairs.c.taken_out_by_us.is_(True),
        node_repairs.c.taken_out_at >= since,
    )
    return int(conn.execute(stmt).scalar_one())


def nodes_taken_out_since(conn: Connection, since: datetime, take_out_actions: Collection[str]) -> set[str]:
    """Nodes taken out of service since ``since`` by repairs, or still out by an open repair of ours (a node held
    for weeks still counts), and by incidents' steps of the ``take_out_actions`` (drain, cordon, reboot) that ran
    ok. What the blast-radius guard counts; job restarts are not among them."""
    ours = node_repairs.c.taken_out_by_us.is_(True)
    recent_or_out = or_(node_repairs.c.taken_out_at >= since, node_repairs.c.open_key.is_not(None))
    nodes = {row.node for row in conn.execute(select(node_repairs.c.node).where(ours, recent_or_out))}
    if take_out_actions:
        stmt = select(steps.c.params).where(
            steps.c.action.in_(sorted(take_out_actions)),
            # A take-out whose outcome is unknown (in flight, or ambiguous after a crash) may have happened: counted.
            steps.c.status.in_((StepStatus.OK, StepStatus.RUNNING, StepStatus.AMBIGUOUS)),
            func.coalesce(steps.c.finished_at, steps.c.started_at) >= since,
        )
        nodes.update(str(row.params["node"]) for row in conn.execute(stmt) if row.params.get("node"))
    return nodes


def list_repairs(
    conn: Connection,
    *,
    node: str | None = None,
    state: str | None = None,
    open_only: bool = False,
    limit: int = 100,
) -> list[Repair]:
    """Repairs, newest first, at most ``limit`` (clamped to ``MAX_LIST``)."""
    stmt = select(node_repairs).order_by(node_repairs.c.id.desc()).limit(max(1, min(limit, MAX_LIST)))
    if node:
        stmt = stmt.where(node_repairs.c.node == node)
    if state:
        stmt = stmt.where(node_repairs.c.state == state)
    if open_only:
        stmt = stmt.where(node_repairs.c.open_key.is_not(None))
    return [Repair.from_row(dict(row._mapping)) for row in conn.execute(stmt)]


def held_count(conn: Connection) -> int:
    """Nodes held for a person now."""
    stmt = select(func.count()).where(node_repairs.c.state == RepairState.HELD)
    return int(conn.execute(stmt).scalar_one())
