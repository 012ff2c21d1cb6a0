"""LM-Polygraph's own ``RAUQ`` on the ``attention_all`` of ``hallulog export lm-polygraph``.

A real run of the embedded SmolLM2 with the ``full`` logging profile (which turns the attention
summaries on): the export's ``attention_all`` must give LM-Polygraph 0.7.0's ``RAUQ`` what the
model's own attention weights give it — the same estimator on ``attention_all`` built from an
independent eager transformers pass over prompt + answer (as LM-Polygraph's
``GreedyProbsCalculator`` builds it from the generate call's weights) — to float16's precision.
``evaluate``'s ``rauq`` follows the same definition and must give the same scores.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows
from hallulog.storage.attention_format import part_paths
from scipy.stats import spearmanr

from tests.e2e.conftest import REPO, run_orchestrator

pytestmark = pytest.mark.e2e

ARGS = ("--limit", "4", "--k-samples", "2", "--max-tokens", "16", "--logging-profile", "full")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmp-attention") / "run"
    proc = run_orchestrator(root, *ARGS)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert part_paths(root), "the full profile stores the attention summaries"
    dst = root.parent / "lmp"
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", "export", "lm-polygraph", str(root), str(dst)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return root, dst


def _model_attention_all(model, prompt_ids, answer_ids) -> np.ndarray:
    """LM-Polygraph's ``attention_all`` of one answer from the model's weights: row j the
    attention of the query at position P + j - 1 over the answer's tokens 0 .. j - 1."""
    ids = torch.tensor([list(prompt_ids) + list(answer_ids)])
    with torch.no_grad():
        maps = model(input_ids=ids, output_attentions=True).attentions
    p, t = len(prompt_ids), len(answer_ids)
    out = np.zeros((len(maps) * maps[0].shape[1], t, t))
    for layer, a in enumerate(maps):
        a = a[0].double().numpy()  # [heads, n, n]
        for j in range(1, t):
            rows = slice(layer * a.shape[0], (layer + 1) * a.shape[0])
            out[rows, j, :j] = a[:, p + j - 1, p : p + j]
    return out


def test_lm_polygraphs_rauq_scores_the_export_as_the_models_weights(exported):
    from hallulog.evaluation.attention import rauq_score
    from hallulog.exports.lm_polygraph import load_stats
    from hallulog.serving.model_loader import default_model_dir
    from hallulog.storage.attention_format import iter_generations
    from transformers import AutoModelForCausalLM

    from tests.evaluation.lm_polygraph_ref import estimator

    root, dst = exported
    stats = load_stats(dst)
    arrays = stats["manifest"]["arrays"]["attention_all"]
    assert (arrays["layers"], arrays["heads"]) == (30, 9)
    assert all(r is not None for r in stats["attention_rows"])
    rauq = estimator("rauq").RAUQ
    theirs = rauq(n_layers=30, n_heads=9, instruct=True)(stats)

    prompts = {
        r["prompt_id"]: r["prompt_token_ids"]
        for r in iter_rows(layout.consolidated_dir(root) / layout.PROMPT_INDEX)
    }
    model = AutoModelForCausalLM.from_pretrained(
        str(default_model_dir()), attn_implementation="eager", dtype=torch.float32
    ).eval()
    reference = dict(stats)
    reference["attention_all"] = [
        _model_attention_all(model, prompts[pid], tokens)
        for pid, tokens in zip(stats["prompt_id"], stats["greedy_tokens"])
    ]
    want = rauq(n_layers=30, n_heads=9, instruct=True)(reference)
    assert np.isfinite(theirs).all()
    np.testing.assert_allclose(theirs, want, rtol=2e-3)
    assert spearmanr(theirs, want).statistic == pytest.approx(1.0)

    # evaluate's rauq follows LM-Polygraph's definition (row j's ``self`` is its a_j): the same
    # scores up to float16's rounding of the stored summaries, the same ranking
    feats = {g.prompt_id: g.features for g in iter_generations(root) if g.sample_id == 0}
    ours = [
        rauq_score(feats[pid], np.asarray(lp), 0.5)
        for pid, lp in zip(stats["prompt_id"], stats["greedy_log_likelihoods"])
    ]
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, theirs, rtol=2e-3)
    assert spearmanr(ours, theirs).statistic >= 0.999
