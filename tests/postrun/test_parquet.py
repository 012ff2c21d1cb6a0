"""The consolidated Parquet tables: the doc's field tables match the written schemas, and the
tables load in pandas, pyarrow, DuckDB, polars and datasets with the JSONL rows' values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hallulog.contracts import layout
from hallulog.postrun.consolidate import consolidate
from hallulog.postrun.parquet import PARQUET_FILES, SCHEMAS

from tests.postrun.postrun_fixtures import build_run

DOC = Path(__file__).resolve().parents[2] / "docs" / "formats" / "parquet.md"


def doc_tables() -> dict[str, dict[str, str]]:
    """``### Table: NAME`` → {column: Arrow type} from the markdown table that follows."""
    out: dict[str, dict[str, str]] = {}
    name = None
    for line in DOC.read_text().splitlines():
        m = re.match(r"### Table: (.+)", line)
        if m:
            name = m.group(1).strip()
            out[name] = {}
        elif line.startswith("#"):
            name = None
        elif name and line.startswith("| `"):
            cells = [c.strip().strip("`") for c in line.strip().split("|")[1:-1]]
            out[name][cells[0]] = cells[1]
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parquet") / "run"
    build_run(root, prompts=5, k=2, workers=2, fmt="packed")
    consolidate(root)
    return root


def test_doc_tables_match_the_code_and_the_files(run: Path):
    documented = doc_tables()
    assert list(documented) == list(PARQUET_FILES)
    for name, schema in SCHEMAS.items():
        assert documented[name] == {f.name: str(f.type) for f in schema}, name
        written = pq.read_schema(layout.consolidated_dir(run) / name)
        assert written.remove_metadata() == schema, name


def test_values_match_the_jsonl_rows(run: Path):
    import pandas as pd

    out = layout.consolidated_dir(run)
    gens = pd.read_parquet(out / "generations.parquet")
    rows = [json.loads(x) for x in (out / layout.GENERATIONS).read_text().splitlines()]
    assert len(gens) == len(rows) == 15
    for rec, row in zip(gens.to_dict("records"), rows):
        assert (rec["prompt_id"], rec["sample_id"]) == (row["prompt_id"], row["sample_id"])
        assert list(rec["token_ids"]) == row["token_ids"]
        assert list(rec["tokens"]) == [t["token"] for t in row["logprobs"]]
        assert [list(x) for x in rec["top_logprob_tokens"]] == [
            [a["token"] for a in t["top_logprobs"]] for t in row["logprobs"]
        ]
        assert [v for x in rec["top_logprobs"] for v in x] == pytest.approx(
            [a["logprob"] for t in row["logprobs"] for a in t["top_logprobs"]]
        )
        assert json.loads(rec["extra_json"])["request_params"]["model"] == "m"
    prompts = pq.read_table(out / "prompts.parquet").to_pylist()
    assert [p["prompt_id"] for p in prompts] == [
        json.loads(x)["prompt_id"] for x in (out / layout.PROMPT_INDEX).read_text().splitlines()
    ]
    labels = pq.read_table(out / "labels.parquet").to_pylist()
    assert [x["label"] for x in labels] == [p["label"] for p in prompts]
    acts = pq.read_table(out / "activation_index.parquet").to_pylist()
    assert all(a["byte_offset"] is not None and a["shape"] == [2, 2, 8] for a in acts)


def test_loads_in_duckdb_polars_and_datasets(run: Path):
    out = layout.consolidated_dir(run)
    duckdb = pytest.importorskip("duckdb")
    (n,) = duckdb.sql(
        f"SELECT count(*) FROM '{out / 'generations.parquet'}' WHERE sample_id = 0"
    ).fetchall()[0]
    assert n == 5
    pl = pytest.importorskip("polars")
    df = pl.read_parquet(out / "activation_index.parquet")
    assert df.height == 15 and df["layers"].to_list()[0] == [3, 4]
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "parquet", data_files=str(out / "labels.parquet"), cache_dir=str(run.parent / "hf-cache")
    )["train"]
    assert len(ds) == 5 and set(ds.column_names) == {f.name for f in SCHEMAS["labels.parquet"]}


def test_a_value_of_another_type_is_null_not_a_failed_consolidation(tmp_path: Path):
    build_run(tmp_path, prompts=2, k=1, workers=1)
    path = tmp_path / "worker_0" / layout.GENERATIONS
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[1]["request_params"]["seed"] = "not a number"
    rows[1]["logprobs"][0]["token"] = 7
    rows[1]["logprobs"][1]["logprob"] = {"odd": True}  # the exports cannot sum this one
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    consolidate(tmp_path)
    gens = pq.read_table(layout.consolidated_dir(tmp_path) / "generations.parquet").to_pylist()
    assert gens[1]["seed"] is None and gens[0]["seed"] is not None
    assert gens[1]["tokens"][0] is None and gens[1]["tokens"][1] is not None
    assert gens[1]["token_logprobs"][1] is None and gens[1]["token_logprobs"][0] is not None
    # the exports step fails as it did before, on its own, after the consolidation
    from hallulog.exports.methods import write_exports

    with pytest.raises(TypeError):
        write_exports(tmp_path)
