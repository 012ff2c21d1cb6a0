"""``import``: a JSONL of questions, references and answers becomes a run root evaluate scores."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from hallulog.cli.app import main
from hallulog.evaluation import add_import_parser, run_import


def _import(argv):
    p = argparse.ArgumentParser()
    add_import_parser(p.add_subparsers(dest="command"))
    return run_import(p.parse_args(["import", *argv]))


def _rows(n=40, seed=0):
    rng = np.random.default_rng(seed)
    words = ["Paris", "Rome", "Berlin", "Madrid", "Oslo", "Vienna"]
    for i in range(n):
        ref = words[i % 6]
        right = i % 2 == 0
        prim = ref if right else words[(i + 1) % 6]
        lps = (-rng.exponential(0.1 if right else 1.0, 3)).tolist()
        tops = [
            [{"token": t, "logprob": lp}, {"token": "x", "logprob": lp - 2.0}]
            for t, lp in zip(["The", " city", f" {prim}"], lps)
        ]
        samples = [
            prim if (right or rng.random() < 0.3) else str(rng.choice(words)) for _ in range(4)
        ]
        yield {
            "id": f"q{i}",
            "question": f"Which city, {i}?",
            "reference": [ref],
            "answers": [
                {
                    "text": f"The city {prim}",
                    "token_logprobs": lps,
                    "tokens": ["The", " city", f" {prim}"],
                    "top_logprobs": tops,
                }
            ]
            + [{"text": s, "token_logprobs": (-rng.exponential(0.5, 2)).tolist()} for s in samples],
        }


def test_imported_answers_are_scored_by_the_text_and_logprob_methods(tmp_path, capsys):
    src = tmp_path / "answers.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    root = tmp_path / "run"
    assert main(["import", str(src), "--artifact-root", str(root), "--model", "m"]) == 0
    assert "imported 40 questions (40 labelled" in capsys.readouterr().out
    assert (
        main(
            [
                "evaluate",
                "--artifact-root",
                str(root),
                "--no-embeddings",
                "--no-plots",
                "--bootstrap",
                "20",
            ]
        )
        == 0
    )
    report = json.loads((root / "evaluation" / "report.json").read_text())
    assert report["labels"] == {"correct": 20, "hallucinated": 20, "unlabeled": 0}
    m = report["methods"]
    for name in (
        "logprob_min",
        "mean_token_entropy",
        "ccp_lexical",
        "selfcheck_unigram",
        "se_discrete_exact",
        "lexsim_rougeL",
        "eigval_laplacian_jaccard",
        "mc_sequence_entropy",
    ):
        assert m[name]["n"] == 40, name
    assert m["logprob_mean"]["auroc"] > 0.8
    assert "got_logistic_last" in report["skipped"] and "eigenscore" in report["skipped"]
    assert "imported run" in report["skipped"]["sep_tbg"]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question": "Q?", "answers": []}', "'answers' must be a non-empty list"),
        ('{"answer": "x"}', "'question' (a non-empty string) is missing"),
        (
            '{"question": "Q?", "answer": {"text": "x", "token_logprobs": [0.5]}}',
            "answers[0].token_logprobs must be a non-empty list of finite numbers <= 0",
        ),
        (
            '{"question": "Q?", "answer": {"text": "x", "token_logprobs": [-1], "tokens": ["a", "b"]}}',
            "answers[0].tokens needs token_logprobs and one entry per token (1)",
        ),
        ('{"question": "Q?", "answer": "x", "label": 2}', "'label' must be 0"),
        ('{"question": "Q?", "answer": "x"', "malformed JSON"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(tmp_path, capsys, line, message):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"question": "fine?", "answer": "yes", "reference": "yes"}\n\n' + line + "\n")
    assert _import([str(src), "--artifact-root", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {src}:3: ") and message in err[0], err
    assert not (tmp_path / "run" / "consolidated").exists()
