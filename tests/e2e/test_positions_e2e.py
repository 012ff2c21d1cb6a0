"""A real run with ``--positions`` and ``--layers``: it validates clean, its stored rows are the
named positions (checked against transformers), and exports and evaluate read them by name
(docs/alignment.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import REPO, read_jsonl, run_orchestrator

pytestmark = pytest.mark.e2e

NAMES = ["tbg", "slt", "exact_answer", "last"]
NUM_LAYERS = 30  # SmolLM2-135M


@pytest.fixture(scope="module")
def positions_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("positions")
    proc = run_orchestrator(
        root,
        "--positions",
        ",".join(NAMES),
        "--layers",
        "0,15,-1",
        "--limit",
        "4",
        "--k-samples",
        "1",
        "--max-tokens",
        "12",
        "--storage-format",
        "npy",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


def test_the_run_validates_clean_and_indexes_its_rows(positions_run: Path):
    out = positions_run / "consolidated"
    report = json.loads((out / "validation_report.json").read_text())
    assert report["ok"] and report["problems"] == [], report["problem_counts"]
    manifest = json.loads((positions_run / "run_manifest.json").read_text())
    assert manifest["layer_ids"] == [0, 15, NUM_LAYERS] and manifest["positions"] == NAMES
    prompts = {p["prompt_id"]: p for p in read_jsonl(out / "prompt_index.jsonl")}
    gens = {g["activation_key"]: g for g in read_jsonl(out / "generations.jsonl")}
    rows = read_jsonl(out / "activation_index.jsonl")
    assert len(rows) == 8
    for row in rows:
        p = len(prompts[row["prompt_id"]]["prompt_token_ids"])
        r = len(gens[row["activation_key"]]["token_ids"])
        at, named = row["token_positions"], row["positions"]
        assert row["sequence_mode"] == "positions" and list(named) == NAMES
        assert row["layers"] == [0, 15, NUM_LAYERS] and row["shape"][:2] == [3, len(at)]
        assert [at[j] for j in named["tbg"]] == [p - 1]
        assert [at[j] for j in named["last"]] == [p + r - 2]  # generation capture
        assert named["slt"] == (named["last"] if r >= 2 else [])
        span = row["exact_answer_span"]
        if span is not None:
            s, e = span["tokens"]
            assert [at[j] for j in named["exact_answer"]] == [
                x for x in range(p + s, p + e) if x < p + r - 1
            ]
        assert sorted({at[j] for idx in named.values() for j in idx}) == at


def test_stored_rows_are_the_named_positions(positions_run: Path):
    """Layer 0 against the embeddings of every row (the deep audit), layers 15 and 30 against
    transformers run over the recorded ids."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "validate",
            "--artifact-root",
            str(positions_run),
            "--deep",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    audit = json.loads((positions_run / "consolidated" / "alignment_audit.json").read_text())
    assert audit["ok"] and audit["mode"] == "embedding" and audit["checked"] == 8

    import torch
    from hallulog.serving.model_loader import default_model_dir
    from transformers import AutoModelForCausalLM

    out = positions_run / "consolidated"
    prompts = {p["prompt_id"]: p for p in read_jsonl(out / "prompt_index.jsonl")}
    gens = {g["activation_key"]: g for g in read_jsonl(out / "generations.jsonl")}
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32)
    model.eval()
    pre_norm = {}
    model.model.norm.register_forward_pre_hook(lambda m, a: pre_norm.__setitem__("x", a[0]))
    for row in read_jsonl(out / "activation_index.jsonl")[:2]:
        gen = gens[row["activation_key"]]
        ids = prompts[row["prompt_id"]]["prompt_token_ids"] + gen["token_ids"][:-1]
        with torch.no_grad():
            hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        ref = {0: hs[0][0], 15: hs[15][0], NUM_LAYERS: pre_norm["x"][0]}
        stored = np.load(out / row["file_path"])
        for k, layer in enumerate(row["layers"]):
            want = ref[layer].numpy()[row["token_positions"]]
            scale = max(1.0, float(np.abs(want).max()))
            err = float(np.abs(stored[k].astype(np.float32) - want).max())
            assert err <= 2e-3 * scale, (layer, err, scale)


def test_exports_and_evaluate_read_rows_by_name(positions_run: Path, tmp_path: Path):
    out = positions_run / "consolidated"
    acts = {r["activation_key"]: r for r in read_jsonl(out / "activation_index.jsonl")}
    for geo in read_jsonl(out / "exports" / "geometry_inputs.jsonl"):
        act = acts[geo["activation_key"]]
        assert geo["positions"] == act["positions"]
        assert geo["token_positions"] == act["token_positions"]
        assert geo["prompt_end_row"] == act["positions"]["tbg"][0]
        p = geo["prompt_end_position"] + 1
        assert [act["token_positions"][j] for j in geo["answer_token_rows"]] == [
            x for x in act["token_positions"] if x >= p
        ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "evaluate",
            "--artifact-root",
            str(positions_run),
            "--out",
            str(tmp_path / "ev"),
            "--no-embeddings",
            "--no-plots",
            "--bootstrap",
            "50",
            "--folds",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    if "AUROC needs both classes" in proc.stderr:  # 4 prompts may all be graded alike
        pytest.skip("the 4 prompts have one label class only")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    for probe in ("got_logistic_last", "sep_tbg", "sep_slt", "lkm_exact_answer"):
        assert probe in report["methods"] or "needs" not in report["skipped"].get(probe, ""), (
            report["skipped"]
        )
