"""A culprit as the store keeps it: the typed row and the JSON the ``incidents.culprits`` column holds agree both
ways, key for key as earlier versions wrote them (the JSON views show that form), and a culprit an older version
wrote still reads."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import JSON, Connection, bindparam, text

from app.domain.culprits import Culprit
from app.domain.states import State
from app.store import Store, records
from tests.fakes import START

# Each culprit, and the JSON object the column holds for it (same keys, same order).
SHAPES = [
    pytest.param(
        Culprit("node2", "GpuXidError on node2", "xid=79 gpu=3", playbook="gpu-xid"),
        {
            "node": "node2",
            "source": "GpuXidError on node2",
            "reason": "xid=79 gpu=3",
            "playbook": "gpu-xid",
            "confirmed": None,
        },
        id="named by a node's alert",
    ),
    pytest.param(
        Culprit("node3", "diagnosis", "NaN only on rank 3", confirmed=False),
        {
            "node": "node3",
            "source": "diagnosis",
            "reason": "NaN only on rank 3",
            "playbook": None,
            "confirmed": False,
        },
        id="named by the diagnosis, outside the allocation",
    ),
    pytest.param(
        Culprit("node4", "alert", "GpuXidError: Xid 79", confirmed=True, repair_id=7),
        {
            "node": "node4",
            "source": "alert",
            "reason": "GpuXidError: Xid 79",
            "confirmed": True,
            "repair_id": 7,
        },
        id="a node incident's node, handed to repair 7",
    ),
]

# What versions before the playbook named culprits wrote (no "playbook" key), with a key this one never wrote.
OLDER = (
    '[{"node": "node2", "source": "GpuXidError on node2", "reason": "xid=79", "confirmed": true, "seen": 2}]'
)


@pytest.mark.parametrize(("culprit", "stored"), SHAPES)
def test_a_culprit_is_its_json_object_key_for_key_and_back(
    culprit: Culprit, stored: dict[str, object]
) -> None:
    assert list(culprit.to_json().items()) == list(stored.items())
    assert Culprit.from_json(stored) == culprit


def test_a_repair_handle_that_names_a_playbook_keeps_it() -> None:
    culprit = Culprit("node4", "alert", "Xid 79", playbook="gpu-xid", confirmed=True, repair_id=7)
    assert Culprit.from_json(culprit.to_json()) == culprit


def test_a_culprit_an_older_version_wrote_reads_with_defaults_and_its_unknown_keys_ignored() -> None:
    (older,) = json.loads(OLDER)
    assert Culprit.from_json(older) == Culprit("node2", "GpuXidError on node2", "xid=79", confirmed=True)
    assert Culprit.from_json({"node": "node5"}) == Culprit("node5", "", "")


def _incident(conn: Connection, open_key: str) -> int:
    values = {
        "playbook": "gpu-xid",
        "target_key": open_key,
        "open_key": open_key,
        "target": {},
        "state": State.OPEN,
        "labels": {},
        "annotations": {},
        "alert_starts_at": START,
        "opened_at": START,
        "updated_at": START,
    }
    incident_id = records.insert_incident(conn, values)
    assert incident_id is not None
    return incident_id


def test_the_store_reads_culprits_an_older_version_wrote_and_writes_the_same_json(store: Store) -> None:
    written = tuple(p.values[0] for p in SHAPES)
    with store.transaction() as conn:
        older, typed, never = (_incident(conn, key) for key in ("job:1", "job:2", "target:3"))
        # As an older version bound it: a list of plain objects to the JSON column.
        conn.execute(
            text("UPDATE incidents SET culprits = :raw WHERE id = :id").bindparams(
                bindparam("raw", type_=JSON)
            ),
            {"raw": json.loads(OLDER), "id": older},
        )
        records.update_incident(conn, typed, culprits=written)
    with store.read() as conn:
        rows = {i: records.get_incident(conn, i) for i in (older, typed, never)}
        column = conn.execute(
            text("SELECT culprits FROM incidents WHERE id = :id").columns(culprits=JSON), {"id": typed}
        ).scalar_one()
    assert rows[older] is not None and rows[older].culprits == (
        Culprit("node2", "GpuXidError on node2", "xid=79", confirmed=True),
    )
    assert rows[typed] is not None and rows[typed].culprits == written
    assert rows[never] is not None and rows[never].culprits == ()  # NULL: none named
    # The column holds what earlier versions wrote for the same culprits, and the JSON views show it.
    stored = [list(p.values[1].items()) for p in SHAPES]
    assert [list(c.items()) for c in column] == stored
    assert [list(c.items()) for c in rows[typed].as_dict()["culprits"]] == stored
