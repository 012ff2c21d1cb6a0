"""The field tables of docs/formats/lm-polygraph.md and uqlm.md match what the exports write, and
the exports hold the run's values (a synthetic run written with the real storage writer)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hallulog.contracts.jsonl import iter_rows
from hallulog.exports.cli import main as export_main
from hallulog.exports.lm_polygraph import STAT_FIELDS, export_lm_polygraph, load_stats
from hallulog.exports.uqlm import ROW_FIELDS, export_uqlm, load_uqlm
from hallulog.storage import open_store
from hallulog.storage.attention_format import FEATURES, iter_generations, write_part

from tests.evaluation.synthetic import make_run

REPO = Path(__file__).resolve().parents[2]


def _table(doc: str, name: str) -> dict[str, str]:
    """``### Table: <name>`` → {first column: second column}."""
    out, inside = {}, False
    for line in (REPO / "docs" / "formats" / doc).read_text(encoding="utf-8").splitlines():
        if line.startswith("### Table: "):
            inside = line[len("### Table: ") :].strip() == name
            continue
        if inside and line.startswith("#"):
            break
        m = re.match(r"\| `([^`]+)` \| ([^|]+) \|", line)
        if inside and m:
            out[m.group(1)] = m.group(2).strip()
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("toolkits") / "run", n=12, k=3)


def test_lm_polygraph_export_matches_its_doc(run, tmp_path):
    dst = tmp_path / "lmp"
    manifest = export_lm_polygraph(run, dst)
    files = _table("lm-polygraph.md", "files")
    assert {p.name for p in dst.iterdir()} == set(files) - {"attention_all.npy"}  # no summaries
    fields = _table("lm-polygraph.md", "stats.jsonl")
    rows = list(iter_rows(dst / "stats.jsonl"))
    assert len(rows) == manifest["prompts"] == 12
    assert all(set(r) == set(fields) for r in rows)
    assert set(STAT_FIELDS) <= set(fields) and manifest["stats"] == list(STAT_FIELDS)
    gens = list(iter_rows(run / "consolidated" / "generations.jsonl"))
    first = [g for g in gens if g["prompt_id"] == rows[0]["prompt_id"]]
    assert rows[0]["greedy_log_likelihoods"] == [t["logprob"] for t in first[0]["logprobs"]]
    assert rows[0]["sample_texts"] == [g["text"] for g in first[1:]]
    assert rows[0]["sample_log_probs"] == pytest.approx(
        [sum(t["logprob"] for t in g["logprobs"]) for g in first[1:]]
    )


def test_lm_polygraph_arrays_are_the_stored_rows(run, tmp_path):
    dst = tmp_path / "lmp"
    export_lm_polygraph(run, dst, layer=2)
    stats = load_stats(dst)
    reader = open_store(run / "consolidated")
    try:
        assert stats["embeddings_decoder"].shape == (12, reader.hidden_size)
        assert stats["sample_embeddings"].shape == (12, 3, reader.hidden_size)
        pid = stats["prompt_id"][4]
        li, mid = reader.layer_ids.index(2), len(reader.layer_ids) // 2
        prim = reader.read(reader.index_of(f"{pid}_0"), li).astype(np.float32)
        np.testing.assert_allclose(stats["embeddings_decoder"][4], prim.mean(0), rtol=1e-6)
        s2 = reader.read(reader.index_of(f"{pid}_2"), mid)[-1].astype(np.float32)
        np.testing.assert_array_equal(stats["sample_embeddings"][4, 1], s2)
    finally:
        reader.close()
    assert stats["manifest"]["arrays"]["embeddings_decoder"]["layer"] == 2


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory) -> Path:
    """A synthetic run with attention summaries (random, by the real writer) for every
    generation but one primary, in two parts written in the reverse of the prompts' order."""
    root = make_run(tmp_path_factory.mktemp("toolkits") / "run", n=6, k=1)
    gens = list(iter_rows(root / "consolidated" / "generations.jsonl"))
    rng = np.random.default_rng(0)
    keys = [(g["prompt_id"], g["sample_id"], g.get("commit_id") or "c", 7) for g in gens]
    feats = [rng.random((len(g["token_ids"]), 3, 2, len(FEATURES))) for g in gens]
    keep = [
        i
        for i, g in enumerate(gens)
        if (g["prompt_id"], g["sample_id"]) != (gens[0]["prompt_id"], 0)
    ]
    keep.reverse()
    for half in (keep[: len(keep) // 2], keep[len(keep) // 2 :]):
        write_part(root, [keys[i] for i in half], [feats[i] for i in half])
    return root


def test_lm_polygraph_attention_is_lm_polygraphs_attention_all(attention_run, tmp_path):
    """attention_all[:, j, j-1] is the stored ``self`` of row j and [:, j, j-2] its
    ``previous`` (docs/formats/lm-polygraph.md); row 0, the diagonal and above 0, the rest NaN;
    a primary without summaries loads as NaN below the diagonal."""
    dst = tmp_path / "lmp"
    manifest = export_lm_polygraph(attention_run, dst, hidden=False)
    assert {p.name for p in dst.iterdir()} == set(_table("lm-polygraph.md", "files")) - {
        "embeddings_decoder.npy",
        "sample_embeddings.npy",
    }
    assert manifest["arrays"]["attention_all"]["layers"] == 3
    assert "attention_all" in manifest["approximations"]
    stats = load_stats(dst)
    by_key = {(g.prompt_id, g.sample_id): g for g in iter_generations(attention_run)}
    att = stats["attention_all"]
    assert len(att) == 6 and stats["attention_rows"][0] is None
    first = att[0]
    t = len(stats["greedy_tokens"][0])
    assert (
        first.shape == (6, t, t)
        and np.isnan(first[:, 1:, :][:, np.tril_indices(t - 1)[0], np.tril_indices(t - 1)[1]]).all()
    )
    for i in range(1, 6):
        f = by_key[(stats["prompt_id"][i], 0)].features  # [T, L, H, 5] (float16 values)
        m = att[i]
        t = len(f)
        assert m.shape == (3 * 2, t, t)
        j = np.arange(1, t)
        want_self = f[1:, :, :, FEATURES.index("self")].reshape(t - 1, -1).T
        np.testing.assert_array_equal(m[:, j, j - 1], want_self)
        want_prev = f[2:, :, :, FEATURES.index("previous")].reshape(t - 2, -1).T
        np.testing.assert_array_equal(m[:, j[1:], j[1:] - 2], want_prev)
        assert (m[:, 0] == 0).all() and (
            m[:, np.triu_indices(t)[0], np.triu_indices(t)[1]] == 0
        ).all()
        if t > 3:
            assert np.isnan(m[:, 3, 0]).all()  # not stored


def test_uqlm_export_matches_its_doc(run, tmp_path):
    dst = tmp_path / "uqlm"
    manifest = export_uqlm(run, dst)
    assert {p.name for p in dst.iterdir()} == set(_table("uqlm.md", "files"))
    fields = _table("uqlm.md", "uqlm.jsonl")
    rows = list(iter_rows(dst / "uqlm.jsonl"))
    assert all(set(r) == set(fields) == set(ROW_FIELDS) for r in rows)
    assert manifest["top_k"] == 1 and manifest["prompts"] == 12
    token = rows[0]["logprobs"][0]
    assert set(token) == {"token", "logprob", "top_logprobs"}
    assert set(token["top_logprobs"][0]) == {"token", "logprob"}
    loaded = load_uqlm(dst)
    assert len(loaded["sampled_logprobs_results"][0]) == 3 and loaded["top_k"] == 1


def test_cli_writes_both_and_refuses_a_non_empty_target(run, tmp_path, capsys):
    assert export_main(["uqlm", str(run), str(tmp_path / "u")]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "hallulog-uqlm"
    assert export_main(["lm-polygraph", "--no-hidden", str(run), str(tmp_path / "l")]) == 0
    assert not (tmp_path / "l" / "embeddings_decoder.npy").exists()
    capsys.readouterr()
    assert export_main(["uqlm", str(run), str(tmp_path / "u")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an empty directory" in err[0]
    assert export_main(["lm-polygraph", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2
    assert "consolidate" in capsys.readouterr().err
