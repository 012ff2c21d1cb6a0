"""saev export: what saev head's code reads (pinned), token-level examples, round trip, errors.

saev head = github.com/OSU-NLP-Group/saev at ``hallulog.exports.saev.SAEV_HEAD_COMMIT`` (2026-03-11). The
contract test below restates, as assertions, what these functions of that commit do on load:
``src/saev/data/shards.py`` ``Metadata.load`` (``disk.is_shards_dir``, ``Metadata(**json)``,
beartype-checked field types and ``Literal`` values), ``ShardInfo.load`` (the ``saev/shards``
path assertion), ``Metadata.shard_shape`` and the ``np.memmap(..., shape=md.shard_shape)`` calls
of ``indexed.Dataset.__getitem__``, ``ordered._manager_main`` and ``shuffled._io_worker`` (plus
their ``examples_per_shard`` assertion on every shard but the last). Where saev's protocol.md
and its code disagree, this pins the code. ``test_saev_head_readers`` runs the real readers when
``HALLULOG_SAEV_SRC`` points at a checkout's ``src`` (see saev_head.py).
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from hallulog.exports import saev
from hallulog.storage import ManifestError, StorageError, open_store

from tests.exports.saev_head import ENV, load_saev_head
from tests.exports.test_wds import H, L, make_store
from tests.storage.test_storage_docs import DOCS, tables

LAYERS = [0, 3, 7, 12]
LENGTHS = [(2, 3), (0, 4), (5, 6), (0, 0), (1, 1), (3, 0), (4, 4), (2, 2)]  # 37 real token rows

#: saev head, src/saev/data/shards.py, ``Metadata`` field types and ``Literal`` values
HEAD_METADATA = {
    "family": str,
    "ckpt": str,
    "layers": list,
    "content_tokens_per_example": int,
    "cls_token": bool,
    "d_model": int,
    "n_examples": int,
    "max_tokens_per_shard": int,
    "data": str,
    "dataset": str,
    "pixel_agg": str,
    "dtype": str,
    "protocol": str,
}
HEAD_LITERALS = {
    "family": (
        "bird-mae",
        "clip",
        "dinov2",
        "dinov3",
        "fake-clip",
        "pe-core",
        "pe-spatial",
        "siglip",
    ),
    "pixel_agg": ("majority", "prefer-fg"),
    "dtype": ("float32",),
    "protocol": ("1.0.0", "1.1", "2.1"),
}


def head_load(shards_dir: pathlib.Path) -> dict:
    """What saev head's loaders do before returning a single activation; returns the metadata."""
    assert shards_dir.is_dir() and shards_dir.parts[-3:-1] == (
        "saev",
        "shards",
    )  # disk.is_shards_dir
    md = json.load(open(shards_dir / "metadata.json"))
    assert list(md) == list(HEAD_METADATA)  # Metadata(**dct): no missing key, no unknown key
    for k, typ in HEAD_METADATA.items():
        assert isinstance(md[k], typ), k
    for k, allowed in HEAD_LITERALS.items():
        assert md[k] in allowed, (k, md[k])
    tokens_per_example = md["content_tokens_per_example"] + int(md["cls_token"])
    per_shard = md["max_tokens_per_shard"] // (tokens_per_example * len(md["layers"]))
    assert per_shard >= 1  # Metadata.__post_init__
    shape = (
        per_shard,
        len(md["layers"]),
        tokens_per_example,
        md["d_model"],
    )  # Metadata.shard_shape
    shards = json.load(
        open(shards_dir / "shards.json")
    )  # ShardInfo.load: [Shard(name, n_examples)]
    assert [set(s) for s in shards] == [{"name", "n_examples"}] * len(shards)
    assert all(s["n_examples"] == per_shard for s in shards[:-1])  # ordered._manager_main
    assert sum(s["n_examples"] for s in shards) == md["n_examples"]
    for k, s in enumerate(shards):
        assert s["name"] == f"acts{k:06}.bin"
        np.memmap(
            shards_dir / s["name"], mode="r", dtype=np.float32, shape=shape
        )  # raises if short
    return md


@pytest.fixture
def exported(tmp_path):
    want = make_store(tmp_path / "run", n=len(LENGTHS), lengths=LENGTHS)
    out = saev.export_saev(
        tmp_path / "run", tmp_path / "dump", max_tokens_per_shard=10 * L, ckpt="smollm2"
    )
    return tmp_path, want, pathlib.Path(out)


def test_head_contract_and_token_examples(exported):
    tmp, want, out = exported
    assert out.parent == tmp / "dump" / "saev" / "shards" and out.name == saev.saev_hash(
        json.load(open(out / "metadata.json"))
    )
    md = head_load(out)
    assert (md["content_tokens_per_example"], md["cls_token"], md["family"]) == (
        1,
        False,
        saev.FAMILY,
    )
    assert md["layers"] == LAYERS and md["d_model"] == H and md["ckpt"] == "smollm2"
    rows = np.concatenate(
        [a for a, _ in want.values()], axis=1
    )  # (L, 37, H): every real token, in order
    assert md["n_examples"] == rows.shape[1] == 37
    shards = json.load(open(out / "shards.json"))
    per = md["max_tokens_per_shard"] // L
    assert per == 10 and [s["n_examples"] for s in shards] == [
        10,
        10,
        10,
        7,
    ]  # 4 shards of <= 10, even
    data = json.loads(md["data"])
    assert list(data) == sorted(saev.DATA_FIELDS) and data["example"] == "token"
    got = np.concatenate(
        [
            np.memmap(out / s["name"], mode="r", dtype=np.float32, shape=(per, L, 1, H))[
                : s["n_examples"]
            ]
            for s in shards
        ]
    )
    np.testing.assert_array_equal(
        got[:, :, 0, :].transpose(1, 0, 2), rows.astype(np.float32)
    )  # no padding row
    assert not np.any(np.all(got == 0, axis=-1))


def test_store_side_round_trip(exported):
    tmp, want, out = exported
    r = open_store(tmp / "run")
    rd = saev.SaevReader(out)
    assert len(rd) == len(want) and rd.layer_ids == LAYERS
    for i, (acts, sm) in enumerate(want.values()):
        m = rd.meta(i)
        assert m == {
            "sample_key": r.meta(i)["sample_key"],
            "seq_len": acts.shape[1],
            "prompt_len": sm.prompt_len,
            "response_len": sm.response_len,
            "label": sm.label,
        }
        for li in range(L):
            np.testing.assert_array_equal(
                rd.read(i, li), acts[li].astype(np.float32)
            )  # f16 -> f32 is exact
    ex = 0
    for i, (acts, _) in enumerate(want.values()):
        for j in range(acts.shape[1]):
            assert rd.example_of(ex) == (i, j)
            path, off = rd.locate(ex, 7)
            with open(path, "rb") as f:
                f.seek(off)
                np.testing.assert_array_equal(
                    np.frombuffer(f.read(H * 4), np.float32), acts[2, j].astype(np.float32)
                )
            ex += 1
    side = [json.loads(line) for line in open(out / saev.SIDECAR)]
    assert [list(s) for s in side] == [list(saev.SIDECAR_FIELDS)] * len(want)


def test_one_layer_exact_single_shard(tmp_path):
    make_store(tmp_path / "run", n=3, lengths=[(1, 2), (2, 2), (0, 3)])
    (tmp_path / "d").mkdir()  # an existing empty directory is a valid target
    out = pathlib.Path(saev.export_saev(tmp_path / "run", tmp_path / "d", layers=[12]))
    md = head_load(out)
    assert (
        md["layers"] == [12] and md["max_tokens_per_shard"] == 10
    )  # budget shrunk to the data: exact
    assert os.path.getsize(out / "acts000000.bin") == 10 * H * 4


@pytest.mark.skipif(
    not os.environ.get(ENV), reason=f"set {ENV} to saev head's src/ to run its readers"
)
def test_saev_head_readers(exported):
    """saev head's own Metadata.load, indexed Dataset, ordered and shuffled DataLoaders, unchanged."""
    tmp, want, out = exported
    s = load_saev_head()
    md = s.shards.Metadata.load(out)
    assert md.hash == out.name and md.shard_shape == (10, L, 1, H)
    rows = np.concatenate([a for a, _ in want.values()], axis=1).astype(np.float32)
    for layer in (0, 12):
        li = LAYERS.index(layer)
        ds = s.indexed.Dataset(s.indexed.Config(shards=out, layer=layer))
        assert len(ds) == 37
        np.testing.assert_array_equal(
            np.stack([ds[i]["act"].numpy() for i in range(len(ds))]), rows[li]
        )
    ol = s.ordered.DataLoader(
        s.ordered.Config(shards=out, layer=3, batch_size=8, batch_timeout_s=20.0)
    )
    np.testing.assert_array_equal(np.concatenate([b["act"].numpy() for b in ol]), rows[1])
    ol.shutdown()
    sl = s.shuffled.DataLoader(
        s.shuffled.Config(shards=out, layer=7, batch_size=5, n_threads=1, buffer_size=4)
    )
    seen = {}
    for b in sl:
        for a, e in zip(b["act"].numpy(), b["example_idx"].tolist()):
            seen[e] = a
    assert sorted(seen) == list(range(37))
    np.testing.assert_array_equal(np.stack([seen[e] for e in range(37)]), rows[2])


def test_errors(tmp_path, exported):
    _, _, out = exported
    make_store(tmp_path / "run2", n=2)
    with pytest.raises(StorageError, match="layers: \\[99\\] not stored"):
        saev.export_saev(tmp_path / "run2", tmp_path / "x", layers=[99])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(
        StorageError, match="dst: export target exists and is not an empty directory"
    ):
        saev.export_saev(tmp_path / "run2", tmp_path / "full")
    with pytest.raises(ValueError, match="family"):
        saev.export_saev(tmp_path / "run2", tmp_path / "x", family="llm")
    with pytest.raises(ValueError, match="max_tokens_per_shard"):
        saev.export_saev(tmp_path / "run2", tmp_path / "x", max_tokens_per_shard=3)
    make_store(tmp_path / "empty", n=0)
    with pytest.raises(StorageError, match="src: store has no activations"):
        saev.export_saev(tmp_path / "empty", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(KeyError, match="layer 5 is not in"):
        saev.SaevReader(out).locate(0, 5)
    mpath = out / "metadata.json"
    md = json.load(open(mpath))
    for bad, match in (
        ({"data": "gASVCAAAAAAAAAB9lC4="}, "never unpickled"),
        ({"family": "llm"}, "family"),
        ({"ckpt": "other"}, "hash"),
        ({"patches_per_ex": 1}, "extra"),
    ):
        json.dump({**md, **bad}, open(mpath, "w"))
        with pytest.raises(ManifestError, match=match):
            saev.SaevReader(out)
    json.dump(md, open(mpath, "w"))
    moved = tmp_path / "elsewhere" / out.name
    os.renames(out, moved)
    with pytest.raises(ManifestError, match="saev/shards"):
        saev.SaevReader(moved)


def test_half_written_export_never_looks_complete(tmp_path):
    """A crash (SIGKILL) mid-export leaves only a hidden .partial sibling; dst never appears."""
    make_store(tmp_path / "run", n=4)
    code = (
        "import os; from hallulog.exports import saev; from hallulog.storage import open_store\n"
        f"r = open_store({str(tmp_path / 'run')!r}); orig = type(r).read_pairs\n"
        "def read_pairs(self, s, l):\n    if s[0] == 2: os._exit(9)\n    return orig(self, s, l)\n"
        "type(r).read_pairs = read_pairs\n"
        f"saev.export_saev(r, {str(tmp_path / 'dst')!r}, max_tokens_per_shard=8)\n"
    )
    repo = pathlib.Path(__file__).resolve().parents[2]  # `python -c` imports from its cwd
    assert subprocess.run([sys.executable, "-c", code], cwd=repo).returncode == 9
    assert not (tmp_path / "dst").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".dst.partial-")]
    out = saev.export_saev(tmp_path / "run", tmp_path / "dst")  # a fresh export is unaffected
    assert saev.SaevReader(out).n_examples == sum(
        open_store(tmp_path / "run").seq_len(i) for i in range(4)
    )


def test_doc_tables_match_code():
    t = tables("saev.md")
    assert list(t["metadata.json"]) == list(saev.METADATA_FIELDS)
    assert {k: v[0] for k, v in t["renamed fields"].items()} == saev.PROTOCOL_DOC_NAMES
    assert list(t["shards.json"]) == list(saev.SHARD_FIELDS)
    assert list(t["data"]) == list(saev.DATA_FIELDS)
    assert list(t["hallulog_samples.jsonl"]) == list(saev.SIDECAR_FIELDS)
    assert list(t["family"]) == list(saev.SAEV_FAMILIES) and saev.FAMILY in saev.SAEV_FAMILIES
    doc = open(os.path.join(DOCS, "saev.md")).read()
    assert saev.SAEV_HEAD_COMMIT in doc


def test_export_cli(tmp_path, capsys):
    from hallulog.exports.cli import main

    make_store(tmp_path / "run", n=3)
    assert main(["saev", str(tmp_path / "run"), str(tmp_path / "dump"), "--layers", "3,7"]) == 0
    out = json.loads(capsys.readouterr().out)["path"]
    assert saev.SaevReader(out).layers == [3, 7]
    assert main(["saev", str(tmp_path / "run"), str(tmp_path / "dump2"), "--layers", "99"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "layers: [99] not stored" in err
    assert main(["saev", str(tmp_path / "run"), str(tmp_path / "dump")]) == 2
    assert "dst: export target exists" in capsys.readouterr().err
