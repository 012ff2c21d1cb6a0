"""docs/formats/study.md's field tables match the code (the manifest's fields, compare's
columns: names, order, types and meanings), and a written file has exactly those."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from hallulog.study.manifest import CELL_FIELDS, STUDY_FIELDS, make_cell, write_study
from hallulog.study.paired import PAIRED_COLUMNS
from hallulog.study.table import TABLE_COLUMNS
from hallulog.study.transfer import TRANSFER_COLUMNS

from tests.storage.test_storage_docs import tables

DOC = "study.md"


@pytest.mark.parametrize("table,fields", [("study.json", STUDY_FIELDS), ("cells[]", CELL_FIELDS)])
def test_manifest_tables_match_the_code(table, fields):
    documented = tables(DOC)[table]
    assert list(documented) == list(fields)
    assert {k: (v[0], v[1] == "yes") for k, v in documented.items()} == fields


@pytest.mark.parametrize(
    "table,columns",
    [
        ("table.parquet", TABLE_COLUMNS),
        ("paired.parquet", PAIRED_COLUMNS),
        ("transfer.parquet", TRANSFER_COLUMNS),
    ],
)
def test_compare_tables_match_the_code(table, columns):
    documented = tables(DOC)[table]
    assert list(documented) == list(columns)
    # the doc parser strips a cell's outer backticks
    assert {k: tuple(v[:2]) for k, v in documented.items()} == {
        k: (t, what.strip("`")) for k, (t, what) in columns.items()
    }


def test_a_written_manifest_has_the_documented_fields(tmp_path):
    cell = make_cell({"seed": 1}, fingerprint="f", config=True)
    write_study(tmp_path, [cell], source={"path": "s.toml"})
    doc = json.loads((tmp_path / "study.json").read_text())
    assert set(doc) <= set(STUDY_FIELDS) and list(doc["cells"][0]) == list(CELL_FIELDS)


def test_written_tables_have_the_documented_columns(compared):
    for name, columns in [
        ("table.parquet", TABLE_COLUMNS),
        ("paired.parquet", PAIRED_COLUMNS),
        ("transfer.parquet", TRANSFER_COLUMNS),
    ]:
        schema = pq.read_schema(compared.out / name)
        assert schema.names == list(columns)
        assert [str(t) for t in schema.types] == [
            {"string": "string", "int64": "int64", "float64": "double", "bool": "bool"}[t]
            for t, _ in columns.values()
        ]
