"""``hallulog.open_run``: tables, labels and activation matrices; the example script runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hallulog.storage import open_store

import hallulog
from tests.evaluation.synthetic import make_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("face") / "run", n=30, k=2, seed=4)


def test_tables_and_labels(root):
    run = hallulog.open_run(root)
    prompts = run.prompts()
    assert len(prompts) == 30 and "prompt_id" in prompts.columns
    pl = run.generations("polars")
    assert pl.height == 30 * 3
    labels = run.labels()
    assert set(labels) == set(prompts["prompt_id"]) and set(labels.values()) == {0, 1}


def test_activation_matrices_equal_the_stored_rows(root):
    run = hallulog.open_run(root)
    ids, x = run.activations(2, "last", over="prompts", batch=7)
    assert x.shape == (30, 16) and x.dtype == np.float32 and len(ids) == 30
    reader = open_store(root / "consolidated")
    li = [int(v) for v in reader.layer_ids].index(2)
    for j, (pid, sid) in enumerate(ids):
        a = reader.read(reader.index_of(f"{pid}_{sid}"), li)
        np.testing.assert_array_equal(x[j], np.asarray(a[-1], np.float32))
    ids_g, xg = run.activations(2, "first", over="generations", batch=5)
    assert xg.shape == (90, 16) and {s for _, s in ids_g} == {0, 1, 2}
    pid, sid = ids_g[40]
    np.testing.assert_array_equal(xg[40], reader.read(reader.index_of(f"{pid}_{sid}"), li)[0])
    reader.close()
    _, tbg = run.activations(2, "tbg")
    assert np.isfinite(tbg).all() and not np.array_equal(tbg, x)
    with pytest.raises(ValueError, match="layer 9 is not stored"):
        run.activations(9)


def test_evaluate_and_the_example_script(root):
    run = hallulog.open_run(root)
    report = run.evaluate(methods=["logprob", "geometry"], n_boot=20, embeddings=False)
    assert report["methods"]["got_logistic_last"]["n"] == 30
    scores = run.scores()
    assert list(scores.columns[:4]) == ["prompt_id", "label", "fold", "test"]
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python_face.py"), "--artifact-root", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "30 prompts, 15 correct / 15 hallucinated" in out.stdout
    assert "out-of-fold AUROC" in out.stdout and "logprob_min: AUROC" in out.stdout
