"""``--attention-features`` on the real SmolLM2: the summaries the embedded server captures
during generation (through its C kernel, and through matmul attention), with prompts shared by
their answers' rows (the prefix store), their file, their values against an independent eager
pass of transformers, ``evaluate``'s attention methods, a second pass that finds everything
done, a lost part filled by the attention pass, a default run that stores none of it (and gets
them from ``hallulog consolidate --attention-features true`` afterwards, the attention pass a
vLLM run uses)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hallulog.contracts import layout
from hallulog.storage.attention_format import FEATURES, iter_generations, part_paths

from hallulog import open_run
from tests.e2e.conftest import REPO, read_jsonl, run_orchestrator

pytestmark = pytest.mark.e2e

ARGS = ("--limit", "4", "--max-tokens", "12", "--k-samples", "1")


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("attention")
    proc = run_orchestrator(root, *ARGS, "--attention-features", "true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


def _reference(model, prompt_ids, answer_ids):
    """The summaries from one unpadded eager pass, written out from the definitions."""
    ids = torch.tensor([list(prompt_ids) + list(answer_ids[:-1])])
    with torch.no_grad():
        maps = model(input_ids=ids, output_attentions=True).attentions
    P, n = len(prompt_ids), ids.shape[1]
    out = np.zeros((n - P + 1, len(maps), maps[0].shape[1], 5))
    for layer, a in enumerate(maps):
        a = a[0].double().numpy()  # [heads, n, n]
        for row, q in enumerate(range(P - 1, n)):
            out[row, layer, :, 0] = a[:, q, :P].sum(-1)
            out[row, layer, :, 1] = a[:, q, P : q + 1].sum(-1)
            out[row, layer, :, 2] = a[:, q, q - 1]
            out[row, layer, :, 3] = a[:, q, q]
            out[row, layer, :, 4] = a[:, q:, q].sum(-1) / (n - q) - a[:, q, q]
    return out


def _eager_model():
    from hallulog.serving.model_loader import default_model_dir
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(default_model_dir()), attn_implementation="eager", dtype=torch.float32
    ).eval()


def _captured_in_pass(root) -> None:
    """The workers kept a file per generation, and the run took every one into its parts."""
    folders = list(root.glob(f"worker_*/{layout.ATTENTION}"))
    assert folders and not [p for f in folders for p in f.iterdir()]


def test_every_generation_has_its_summaries(attention_run):
    _captured_in_pass(attention_run)
    consolidated = layout.consolidated_dir(attention_run)
    gens = {
        (r["prompt_id"], r["sample_id"]): r for r in read_jsonl(consolidated / layout.GENERATIONS)
    }
    prompts = {r["prompt_id"]: r for r in read_jsonl(consolidated / layout.PROMPT_INDEX)}
    assert part_paths(attention_run)
    stored = {(g.prompt_id, g.sample_id): g for g in iter_generations(attention_run)}
    assert set(stored) == set(gens) and len(stored) == 8
    assert len(list(open_run(attention_run).attention())) == 8
    model = _eager_model()
    for key, g in stored.items():
        row = gens[key]
        f = g.features
        assert f.shape == (len(row["token_ids"]), 30, 9, len(FEATURES))
        assert g.commit_id == row["commit_id"]
        assert g.prompt_tokens == len(prompts[key[0]]["prompt_token_ids"])
        assert np.isfinite(f).all()
        assert (f[..., :4] >= 0).all() and (f[..., :4] <= 1.001).all()
        np.testing.assert_allclose(f[..., 0] + f[..., 1], 1.0, atol=2e-3)
        assert (f[0, ..., 1] == 0).all()  # the first step's query is the prompt's last token
    for key in sorted(stored)[:3]:  # an independent eager pass, unpadded, one at a time
        want = _reference(model, prompts[key[0]]["prompt_token_ids"], gens[key]["token_ids"])
        np.testing.assert_allclose(stored[key].features, want, atol=1e-3)


def test_without_the_kernel_the_same_summaries(tmp_path, monkeypatch):
    """Matmul attention (no C kernel) captures the same summaries, from its explicit weights."""
    monkeypatch.setenv("HALLULOG_ATTENTION_KERNEL", "0")
    proc = run_orchestrator(tmp_path, *ARGS, "--attention-features", "true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    _captured_in_pass(tmp_path)
    consolidated = layout.consolidated_dir(tmp_path)
    gens = {
        (r["prompt_id"], r["sample_id"]): r for r in read_jsonl(consolidated / layout.GENERATIONS)
    }
    prompts = {r["prompt_id"]: r for r in read_jsonl(consolidated / layout.PROMPT_INDEX)}
    stored = {(g.prompt_id, g.sample_id): g.features for g in iter_generations(tmp_path)}
    assert set(stored) == set(gens) and len(stored) == 8
    model = _eager_model()
    for key in sorted(stored)[:4]:
        want = _reference(model, prompts[key[0]]["prompt_token_ids"], gens[key]["token_ids"])
        np.testing.assert_allclose(stored[key], want, atol=1e-3)


def test_evaluate_scores_the_attention_methods(attention_run):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hallulog",
            "evaluate",
            "--artifact-root",
            str(attention_run),
            "--methods",
            "attention",
            "--no-plots",
            "--no-embeddings",
            "--bootstrap",
            "20",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((layout.evaluation_dir(attention_run) / layout.REPORT_JSON).read_text())
    assert {"lookback_lens", "rauq", "attention_score", "lap_eigvals"} <= set(report["methods"])
    assert not report["skipped"]
    scores = pq.read_table(layout.evaluation_dir(attention_run) / layout.SCORES).to_pydict()
    for name in ("rauq", "attention_score"):  # unsupervised: a score for every prompt
        assert len(scores[name]) == 4 and np.isfinite(scores[name]).all()


def test_a_second_pass_redoes_nothing(attention_run):
    from hallulog.postrun.attention import attention_pass
    from hallulog.serving.model_loader import default_model_dir

    before = [p.stat().st_mtime_ns for p in part_paths(attention_run)]
    result = attention_pass(attention_run, default_model_dir())
    assert (result.generations, result.already) == (0, 8)
    assert [p.stat().st_mtime_ns for p in part_paths(attention_run)] == before


def test_a_part_killed_before_its_rename_is_redone(attention_run):
    """A part lost (SIGKILLed before its rename, its generations' captured files gone): the
    attention pass (the run started again) writes its generations, the same values."""
    from hallulog.postrun.attention import attention_pass
    from hallulog.serving.model_loader import default_model_dir

    before = {(g.prompt_id, g.sample_id): g.features for g in iter_generations(attention_run)}
    (part,) = part_paths(attention_run)
    part.rename(part.with_name(f".{part.name}.partial"))
    result = attention_pass(attention_run, default_model_dir())
    assert (result.generations, result.already) == (8, 0)
    after = {(g.prompt_id, g.sample_id): g.features for g in iter_generations(attention_run)}
    assert set(after) == set(before)
    for key, f in before.items():  # captured in the pass, then computed after it
        np.testing.assert_allclose(after[key], f, atol=1e-3)


def test_a_default_run_stores_no_attention(tmp_path):
    proc = run_orchestrator(tmp_path, "--limit", "2", "--max-tokens", "4", "--k-samples", "1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not layout.attention_dir(tmp_path).exists()
    assert "attention" not in proc.stderr.lower()
    # added afterwards to the finished run (a vLLM run's way too): hallulog consolidate
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hallulog",
            "consolidate",
            "--artifact-root",
            str(tmp_path),
            "--limit",
            "2",
            "--attention-features",
            "true",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "attention features: 4 generations" in proc.stdout
    assert len(list(iter_generations(tmp_path))) == 4
