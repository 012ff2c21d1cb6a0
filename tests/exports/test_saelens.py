"""SAELens export: loaded by the real sae-lens (pinned in pyproject's dev extra) and batches drawn.

The store is built the way SAELens' own ``ActivationsStore.from_cache_activations`` builds it
(``dataset=None``, ``cached_activations_path=...``), with a small buffer; ``model`` is unused when
activations are cached. Importing sae_lens takes several seconds (transformer_lens, datasets).
"""

import fnmatch
import json
import os
import subprocess
import sys
from importlib.metadata import version

import numpy as np
import pytest
from hallulog.exports import saelens
from hallulog.storage import StorageError

from tests.exports.test_wds import H, make_store
from tests.storage.test_storage_docs import DOCS, tables

LENGTHS = [(2, 3), (0, 4), (5, 6), (1, 1), (3, 0), (4, 4), (2, 2)]  # 37 token rows
C = 4  # context_size: 9 rows, 1 token dropped


def consolidated(root, want):
    """A consolidated/ directory around the store: prompt, generation and activation index lines."""
    rng = np.random.default_rng(1)
    with (
        open(root / "prompt_index.jsonl", "w") as p,
        open(root / "generations.jsonl", "w") as g,
        open(root / "activation_index.jsonl", "w") as a,
    ):
        ids = {}
        for key, (acts, sm) in want.items():
            pid, sid = key.rsplit("_", 1)
            prompt = rng.integers(
                0, 50000, sm.prompt_len + 2
            ).tolist()  # 2 more prompt tokens than rows
            resp = rng.integers(0, 50000, sm.response_len).tolist()
            p.write(json.dumps({"prompt_id": pid, "prompt_token_ids": prompt}) + "\n")
            g.write(json.dumps({"prompt_id": pid, "sample_id": int(sid), "token_ids": resp}) + "\n")
            a.write(
                json.dumps({"activation_key": key, "row0_position": 2, "num_rows": acts.shape[1]})
                + "\n"
            )
            ids[key] = (prompt + resp)[2:]
    return ids


def sae_lens_store(path, side, batch_prompts=3, train_batch=5):
    """SAELens' own cached-activations ActivationsStore over ``path``."""
    import torch
    from sae_lens.training.activations_store import ActivationsStore

    return ActivationsStore(
        model=None,
        dataset=None,
        streaming=False,
        hook_name=side["hook_name"],
        hook_head_index=None,
        context_size=side["context_size"],
        d_in=side["d_in"],
        n_batches_in_buffer=2,
        total_training_tokens=side["num_tokens"],
        store_batch_size_prompts=batch_prompts,
        train_batch_size_tokens=train_batch,
        prepend_bos=False,
        normalize_activations="none",
        device=torch.device("cpu"),
        dtype=side["dtype"],
        cached_activations_path=str(path),
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("saelens")
    want = make_store(tmp, n=len(LENGTHS), lengths=LENGTHS)
    ids = consolidated(tmp, want)
    side = saelens.export_saelens(
        tmp, tmp / "cache", layer=7, context_size=C
    )  # tmp is a consolidated dir
    return tmp, want, ids, side


def test_installed_version_is_the_pinned_one():
    assert version("sae-lens") == saelens.SAELENS_VERSION
    assert f"sae-lens {saelens.SAELENS_VERSION}" in open(os.path.join(DOCS, "saelens.md")).read()


def test_sae_lens_reads_every_token_in_order(exported):
    tmp, want, ids, side = exported
    assert side["hook_name"] == "blocks.6.hook_resid_post" and side["token_ids"] is True
    assert (side["num_rows"], side["num_tokens"], side["dropped_tokens"]) == (9, 36, 1)
    rows = np.concatenate([a[2] for a, _ in want.values()]).astype(np.float32)[
        :36
    ]  # layer 7, real tokens
    toks = np.concatenate([ids[k] for k in want])[:36]
    st = sae_lens_store(tmp / "cache", side)
    got_a, got_t = [], []
    for _ in range(3):  # 3 batches of 3 rows of 4 tokens: the whole dataset, in order
        a, t = st.get_raw_llm_batch(raise_on_epoch_end=True)
        got_a.append(a.numpy())
        got_t.append(t.numpy())
    np.testing.assert_array_equal(np.concatenate(got_a), rows)
    np.testing.assert_array_equal(np.concatenate(got_t).astype(np.int64), toks)
    with pytest.raises(StopIteration):
        st.get_raw_llm_batch(raise_on_epoch_end=True)
    b = st.next_batch()  # the shuffled training stream SAELens' trainer draws from
    assert tuple(b.shape) == (5, H)
    assert all(any(np.array_equal(r, x) for x in rows) for r in b.numpy())


def test_written_files_match_the_doc(exported):
    tmp, want, ids, side = exported
    t = tables("saelens.md")
    assert list(t["hallulog_saelens.json"]) == list(saelens.SIDECAR_FIELDS)
    assert list(t["hallulog_samples.jsonl"]) == list(saelens.SAMPLE_FIELDS)
    assert (
        list(json.load(open(tmp / "cache" / saelens.SIDECAR)))
        == list(saelens.SIDECAR_FIELDS)
        == list(side)
    )
    lines = [json.loads(x) for x in open(tmp / "cache" / saelens.SAMPLES)]
    assert [list(x) for x in lines] == [list(saelens.SAMPLE_FIELDS)] * len(want)
    info = json.load(open(tmp / "cache" / "dataset_info.json"))["features"]
    assert ["<hook_name>" if k == side["hook_name"] else k for k in info] == list(t["columns"])
    assert info[side["hook_name"]] == {"shape": [C, H], "dtype": "float32", "_type": "Array2D"}
    assert (info["token_ids"]["feature"]["dtype"], info["token_ids"]["length"]) == ("int32", C)
    files = sorted(os.listdir(tmp / "cache"))
    assert all(any(fnmatch.fnmatch(f, pat) for pat in t["files"]) for f in files)
    assert all(any(fnmatch.fnmatch(f, pat) for f in files) for pat in t["files"])


def test_without_token_ids_and_float16(tmp_path):
    want = make_store(tmp_path / "run", n=3, lengths=[(2, 2), (1, 3), (0, 4)])
    side = saelens.export_saelens(
        tmp_path / "run",
        tmp_path / "c",
        layer=0,
        context_size=6,
        dtype="float16",
        hook_name="blocks.0.hook_resid_pre",
    )
    assert side["token_ids"] is False and side["num_rows"] == 2
    st = sae_lens_store(tmp_path / "c", side, batch_prompts=2)
    a, t = st.get_raw_llm_batch(raise_on_epoch_end=True)
    assert t is None
    np.testing.assert_array_equal(a.numpy(), np.concatenate([x[0] for x, _ in want.values()])[:12])


def test_bad_input(tmp_path):
    make_store(tmp_path / "run", n=2, lengths=[(1, 1), (1, 1)])
    with pytest.raises(StorageError, match="layer: 5 is not stored"):
        saelens.export_saelens(tmp_path / "run", tmp_path / "x", layer=5)
    with pytest.raises(ValueError, match="context_size: 8 is more than the store's 4 tokens"):
        saelens.export_saelens(tmp_path / "run", tmp_path / "x", layer=3, context_size=8)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(StorageError, match="dst: export target exists"):
        saelens.export_saelens(tmp_path / "run", tmp_path / "full", layer=3, context_size=2)
    make_store(tmp_path / "empty", n=0)
    with pytest.raises(StorageError, match="src: store has no activations"):
        saelens.export_saelens(tmp_path / "empty", tmp_path / "x", layer=3)
    with pytest.raises(StorageError, match="tokens: no prompt_index.jsonl"):
        saelens.export_saelens(
            tmp_path / "run", tmp_path / "x", layer=3, context_size=2, tokens=tmp_path / "run"
        )
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_cli(tmp_path):
    make_store(tmp_path / "run", n=3, lengths=[(2, 2), (1, 3), (0, 4)])
    cmd = [
        sys.executable,
        "-m",
        "hallulog.exports.cli",
        "saelens",
        str(tmp_path / "run"),
        str(tmp_path / "c"),
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    ok = subprocess.run(
        cmd + ["--layer", "12", "--context-size", "3"], capture_output=True, text=True, env=env
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["num_rows"] == 4
    bad = subprocess.run(
        cmd[:-1] + [str(tmp_path / "d"), "--layer", "99"], capture_output=True, text=True, env=env
    )
    assert (
        bad.returncode == 2
        and bad.stderr.strip().count("\n") == 0
        and "layer: 99 is not stored" in bad.stderr
    )
