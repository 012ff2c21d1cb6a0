"""Each docs/formats/*.md field table matches the code's constants and what the code writes."""

import base64
import json
import os
import re

import numpy as np
import pytest
from hallulog.exports import saelens, saev
from hallulog.storage import (
    SampleMeta,
    attention_format,
    multi,
    npy,
    open_store,
    open_writer,
    packed,
    write_multi_manifest,
    zarr_store,
)

DOCS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "formats"
)


def tables(doc: str) -> dict[str, dict[str, list[str]]]:
    """``### Table: <name>`` -> {field: other cells} from the markdown table that follows."""
    out, name = {}, None
    for line in open(os.path.join(DOCS, doc)):
        m = re.match(r"### Table: (.+)", line)
        if m:
            name = m.group(1).strip()
            out[name] = {}
            continue
        if line.startswith("#"):
            name = None
        if name and line.startswith("| `"):
            cells = [
                c.strip().strip("`").replace("\\|", "|")
                for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]
            ]
            out[name][cells[0]] = cells[1:]
    return out


CASES = [
    ("packed.md", "manifest.json", packed.MANIFEST_FIELDS),
    ("packed.md", "shards[]", packed.SHARD_FIELDS),
    ("packed.md", "index arrays", packed.INDEX_ARRAYS),
    ("packed.md", "commit.log header", packed.HEADER_FIELDS),
    ("packed.md", "commit.log records", packed.RECORD_FIELDS),
    ("packed.md", "writer location fields", packed.LOCATION_FIELDS),
    ("packed.md", "multi-store manifest.json", multi.MANIFEST_FIELDS),
    ("zarr.md", "global attrs", zarr_store.ATTR_FIELDS),
    ("zarr.md", "arrays", zarr_store.ARRAYS),
    ("zarr.md", "commit.log records", zarr_store.RECORD_FIELDS),
    ("zarr.md", "text/samples.jsonl", zarr_store.TEXT_FIELDS),
    ("zarr.md", "writer location fields", zarr_store.LOCATION_FIELDS),
    ("npy.md", "required index fields", npy.REQUIRED_FIELDS),
    ("npy.md", "optional index fields", npy.OPTIONAL_FIELDS),
    ("npy.md", "writer location fields", npy.LOCATION_FIELDS),
    ("saev.md", "metadata.json", saev.METADATA_FIELDS),
    ("saev.md", "shards.json", saev.SHARD_FIELDS),
    ("saev.md", "data", saev.DATA_FIELDS),
    ("saev.md", "hallulog_samples.jsonl", saev.SIDECAR_FIELDS),
    ("saev.md", "family", saev.SAEV_FAMILIES),
    ("saelens.md", "hallulog_saelens.json", saelens.SIDECAR_FIELDS),
    ("saelens.md", "hallulog_samples.jsonl", saelens.SAMPLE_FIELDS),
    ("attention.md", "tensors", attention_format.TENSORS),
    ("attention.md", "metadata", attention_format.METADATA_FIELDS),
    ("attention.md", "features", attention_format.FEATURES),
]


@pytest.mark.parametrize("doc,table,fields", CASES, ids=[f"{d}:{t}" for d, t, _ in CASES])
def test_doc_table_matches_code(doc, table, fields):
    documented = tables(doc)[table]
    assert list(documented) == list(fields), f"{doc} table {table!r} drifted from the code"
    if isinstance(fields, dict):  # dtype column
        assert {k: v[0] for k, v in documented.items()} == fields


def _sample(L=2, H=4, t=3):
    return np.ones((L, t, H), np.float16), SampleMeta(1, t - 1, 0)


def test_written_metadata_has_exactly_the_documented_keys(tmp_path):
    # packed
    w = open_writer("packed", tmp_path / "p", layer_ids=[0, 1], hidden_size=4)
    loc = w.write("a_0", *_sample())
    w.close()
    assert tuple(loc) == packed.LOCATION_FIELDS
    d = tmp_path / "p" / "activations"
    m = json.load(open(d / "manifest.json"))
    assert set(m) == set(packed.MANIFEST_FIELDS)
    assert set(m["shards"][0]) == set(packed.SHARD_FIELDS)
    assert set(m["index_arrays"]) == set(packed.INDEX_ARRAYS)
    for name, dt in packed.INDEX_ARRAYS.items():
        assert np.load(d / f"{name}.npy").dtype.str.startswith(dt)
    log = [json.loads(l) for l in open(d / "commit.log")]
    assert set(log[0]) == set(packed.HEADER_FIELDS) and set(log[1]) == set(packed.RECORD_FIELDS)
    # zarr
    w = open_writer("zarr", tmp_path / "z", layer_ids=[0, 1], hidden_size=4)
    loc = w.write("a_0", *_sample())
    w.close()
    assert tuple(loc) == zarr_store.LOCATION_FIELDS
    r = open_store(tmp_path / "z")
    assert set(r.attrs) == set(zarr_store.ATTR_FIELDS)
    g = r._zarr()
    for name, dt in zarr_store.ARRAYS.items():
        assert g[f"arrays/{name}"].dtype.str.startswith(dt)
    for name, cells in tables("zarr.md")["arrays"].items():  # fill values valid under the v2 spec
        fv = json.load(
            open(tmp_path / "z" / "activations" / "activations.zarr" / "arrays" / name / ".zarray")
        )["fill_value"]
        if cells[3] == "base64 of itemsize zero bytes":
            assert base64.b64decode(fv) == bytes(g[f"arrays/{name}"].dtype.itemsize), name
        else:
            assert fv == int(cells[3]), name
    zd = tmp_path / "z" / "activations"
    assert set(json.loads(open(zd / "commit.log").readline())) == set(zarr_store.RECORD_FIELDS)
    assert set(
        json.loads(open(zd / "activations.zarr" / "text" / "samples.jsonl").readline())
    ) == set(zarr_store.TEXT_FIELDS)
    # npy
    w = open_writer("npy", tmp_path / "n", layer_ids=[0, 1], hidden_size=4)
    assert tuple(w.write("a_0", *_sample())) == npy.LOCATION_FIELDS
    line = npy.index_line("a_0", open_store(tmp_path / "p").meta(0), [0, 1], 4, np.float16)
    assert set(line) <= set(npy.REQUIRED_FIELDS) | set(npy.OPTIONAL_FIELDS)
    # multi
    m = write_multi_manifest(tmp_path / "m", [tmp_path / "p"])
    assert set(m) == set(multi.MANIFEST_FIELDS)


def test_export_docs_name_the_tool_versions_they_were_checked_against():
    """Each export doc names the tool version its tests load it with; a pin bump must update the doc."""
    from importlib.metadata import version

    assert saev.SAEV_HEAD_COMMIT in open(os.path.join(DOCS, "saev.md")).read()
    assert f"sae-lens {saelens.SAELENS_VERSION}" in open(os.path.join(DOCS, "saelens.md")).read()
    assert version("sae-lens") == saelens.SAELENS_VERSION
    assert f"tensorstore {version('tensorstore')}" in open(os.path.join(DOCS, "zarr.md")).read()


def test_written_saev_export_has_exactly_the_documented_keys(tmp_path):
    w = open_writer("packed", tmp_path / "p", layer_ids=[0, 1], hidden_size=4)
    w.write("a_0", *_sample())
    w.write("a_1", *_sample(t=5))
    w.close()
    out = saev.export_saev(tmp_path / "p", tmp_path / "s")
    t = tables("saev.md")
    md = json.load(open(os.path.join(out, "metadata.json")))
    assert list(md) == list(t["metadata.json"])  # in saev's field order: its hash depends on it
    assert list(json.loads(md["data"])) == sorted(t["data"])
    assert [list(s) for s in json.load(open(os.path.join(out, "shards.json")))] == [
        list(t["shards.json"])
    ]
    assert [list(json.loads(l)) for l in open(os.path.join(out, saev.SIDECAR))] == [
        list(t["hallulog_samples.jsonl"])
    ] * 2
    assert md["family"] in t["family"] and md["content_tokens_per_example"] == 1
    assert not set(md) & {
        v[0] for v in t["renamed fields"].values()
    }  # the protocol doc's names are not written
