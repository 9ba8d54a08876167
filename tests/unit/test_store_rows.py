"""The typed rows and the tables they come from agree: a column added by a schema step is a field of its row (a row
built from a query with a column the dataclass lacks fails with a TypeError at the first read)."""

from __future__ import annotations

import dataclasses

import pytest

from app.store import schema
from app.store.rows import AlertRow, Attempt, Incident, LedgerEntry, Repair, StepRow


@pytest.mark.parametrize(
    ("table", "row"),
    [
        ("incidents", Incident),
        ("attempts", Attempt),
        ("alerts", AlertRow),
        ("ledger", LedgerEntry),
        ("steps", StepRow),
        ("node_repairs", Repair),
    ],
)
def test_a_typed_row_has_its_tables_columns(table: str, row: type) -> None:
    columns = {column.name for column in schema.metadata.tables[table].columns}
    assert {field.name for field in dataclasses.fields(row)} == columns
