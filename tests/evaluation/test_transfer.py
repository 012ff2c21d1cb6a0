"""``evaluate --train-root A --test-root B``: probes fitted on one run, scored on another."""

from __future__ import annotations

import json

import pytest
from hallulog.cli.app import main

from tests.evaluation.synthetic import make_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("transfer")
    # same seed: the same vocabulary embeddings and label direction (one "model"); other prompts
    a = make_run(base / "a", n=40, k=2, seed=0)
    b = make_run(base / "b", n=50, k=2, seed=0, labels=[(i // 3) % 2 for i in range(50)])
    return a, b, base


def test_probes_fitted_on_one_run_score_another(runs, capsys):
    a, b, base = runs
    out = base / "eval_ab"
    assert (
        main(
            [
                "evaluate",
                "--train-root",
                str(a),
                "--test-root",
                str(b),
                "--out",
                str(out),
                "--no-embeddings",
                "--no-plots",
                "--bootstrap",
                "30",
                "--methods",
                "geometry",
                "saplma",
                "logprob",
            ]
        )
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert report["protocol"]["scheme"] == "transfer"
    assert report["protocol"]["train_root"] == str(a)
    assert report["protocol"]["test_prompts"] == 50
    m = report["methods"]
    assert m["got_logistic_last"]["n"] == 50 and m["got_logistic_last"]["auroc"] > 0.9
    assert len(m["got_logistic_last"]["selected_layers"]) == 1
    assert m["logprob_min"]["n"] == 50  # unsupervised methods score B alone
    assert (out / "scores.parquet").is_file()


def test_probes_do_not_transfer_across_layer_shapes(runs, capsys):
    a, _, base = runs
    c = make_run(base / "c", n=20, k=2, seed=0, layers=(0, 1, 2))
    assert (
        main(
            [
                "evaluate",
                "--train-root",
                str(a),
                "--test-root",
                str(c),
                "--no-plots",
                "--no-embeddings",
                "--bootstrap",
                "10",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differ in stored layers" in err[0] and str(c) in err[0]
    assert not (c / "evaluation" / "report.json").exists()
