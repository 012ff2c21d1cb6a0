"""The attention summaries' definitions on hand-computed attention matrices, and the detectors
that read them (RAUQ against LM-Polygraph's own estimator)."""

import numpy as np
import pytest
import torch
from hallulog.evaluation.attention import (
    attention_score,
    lap_topk,
    lookback_ratios,
    rauq_layers,
    rauq_score,
)
from hallulog.postrun.attention import summaries

# one head, n = 4 positions, P = 2 prompt tokens: rows q = 1, 2, 3 are the decode steps
A = [
    [1.0, 0.0, 0.0, 0.0],
    [0.6, 0.4, 0.0, 0.0],
    [0.5, 0.2, 0.3, 0.0],
    [0.1, 0.2, 0.3, 0.4],
]
# (context, generated, previous, self, laplacian) of q = 1, 2, 3, by hand:
# d_1 = (0.4 + 0.2 + 0.2) / 3, d_2 = (0.3 + 0.3) / 2, d_3 = 0.4 / 1
EXPECTED = [
    [1.0, 0.0, 0.6, 0.4, 0.8 / 3 - 0.4],
    [0.7, 0.3, 0.2, 0.3, 0.0],
    [0.3, 0.7, 0.3, 0.4, 0.0],
]


def test_summaries_of_a_hand_computed_matrix():
    (f,) = summaries([torch.tensor([[A]])], [2], [4])
    assert f.shape == (3, 1, 1, 5)
    np.testing.assert_allclose(f[:, 0, 0], EXPECTED, atol=1e-6)


def test_rows_from_the_prompts_last_token_on():
    """The pass's own layout: the prompt but its last token cached, rows from position P - 1."""
    (f,) = summaries([torch.tensor([[A[1:]]])], [2], [4], offset=1)
    np.testing.assert_allclose(f[:, 0, 0], EXPECTED, atol=1e-6)
    with pytest.raises(ValueError, match="keys"):
        summaries([torch.tensor([[A[1:]]])], [2], [4], offset=2)


def test_padding_rows_and_columns_are_left_out():
    """A right-padded shorter sequence: its padding query row (garbage) adds nothing to the
    in-degree, and its rows are its own."""
    short = [
        [1.0, 0.0, 0.0, 0.0],
        [0.25, 0.75, 0.0, 0.0],
        [0.1, 0.6, 0.3, 0.0],
        [0.0, 0.9, 0.0, 0.1],  # padding query: must not count
    ]
    maps = [torch.tensor([[A], [short]])]  # [batch 2, heads 1, 4, 4], one layer
    first, second = summaries(maps, [2, 1], [4, 3])
    np.testing.assert_allclose(first[:, 0, 0], EXPECTED, atol=1e-6)
    assert second.shape == (3, 1, 1, 5)
    d1 = (0.75 + 0.6) / 2
    np.testing.assert_allclose(
        second[:, 0, 0],
        [
            [1.0, 0.0, 0.0, 1.0, 1.35 / 3 - 1.0],
            [0.25, 0.75, 0.25, 0.75, d1 - 0.75],
            [0.1, 0.9, 0.6, 0.3, 0.0],
        ],
        atol=1e-6,
    )


def test_layers_and_heads_keep_their_axes():
    rng = np.random.default_rng(0)
    maps = []
    for _ in range(3):  # layers
        x = torch.tensor(rng.normal(size=(1, 2, 5, 5)))
        x = x.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
        maps.append(torch.softmax(x, -1))
    (f,) = summaries(maps, [3], [5])
    assert f.shape == (3, 3, 2, 5)
    np.testing.assert_allclose(f[1, 2, 1, 3], maps[2][0, 1, 3, 3].item(), atol=1e-6)
    np.testing.assert_allclose(f[..., 0] + f[..., 1], 1.0, atol=1e-6)


def test_lookback_ratio_attention_score_and_laplacian_topk():
    (f,) = summaries([torch.tensor([[A]])], [2], [4])
    # rows t = 1, 2: (0.7/2) / (0.7/2 + 0.3/1), (0.3/2) / (0.3/2 + 0.7/2)
    r1, r2 = 0.35 / 0.65, 0.15 / 0.5
    np.testing.assert_allclose(lookback_ratios(f, 2), [[(r1 + r2) / 2]], atol=1e-6)
    assert lookback_ratios(f[:1], 2).tolist() == [[1.0]]
    np.testing.assert_allclose(attention_score(f), -(np.log(0.3) + np.log(0.4)) / 2, atol=1e-6)
    top = lap_topk(f, k=4)
    np.testing.assert_allclose(top, [0.0, 0.0, 0.8 / 3 - 0.4, 0.0], atol=1e-6)


def test_rauq_layers_are_lm_polygraphs_middle_third():
    assert rauq_layers(30) == list(range(10, 21))
    assert rauq_layers(2) == [0, 1]


@pytest.mark.slow  # importing lm_polygraph takes ~10 s
@pytest.mark.parametrize("alpha", [0.2, 0.5])
def test_rauq_equals_lm_polygraph(alpha):
    """LM-Polygraph's RAUQ on the answer's attention among its own tokens (its
    ``attention_all``) and its greedy log-likelihoods equals ours on the summaries."""
    lmp = pytest.importorskip("lm_polygraph.estimators.rauq")
    rng = np.random.default_rng(1)
    layers, heads, T = 6, 3, 7
    f = rng.uniform(0.05, 0.95, size=(T, layers, heads, 5)).astype(np.float32)
    logprobs = np.log(rng.uniform(0.05, 1.0, size=T))
    m = T  # every token
    att = np.zeros((layers, heads, m, m))
    for j in range(1, m):  # the step choosing token j, to token j - 1 (its query): row j's ``self``
        att[:, :, j, j - 1] = f[j, :, :, 3]
    est = lmp.RAUQ(alpha=alpha, n_layers=layers, n_heads=heads)
    theirs = est(
        {
            "attention_all": [att.reshape(layers * heads, m, m)],
            "greedy_log_likelihoods": [logprobs[:m]],
        }
    )
    assert rauq_score(f, logprobs, alpha) == pytest.approx(float(theirs[0]), rel=1e-6)


def test_rauq_alpha_follows_the_models_name():
    """LM-Polygraph's defaults: 0.5 for an instruction-tuned model, 0.2 otherwise (the
    manifest's ``model``)."""
    from hallulog.evaluation.attention import _alpha

    class _Run:
        def __init__(self, model):
            self.model = model

        def manifest(self):
            return {"model": self.model}

    assert _alpha(_Run("SmolLM2-135M-Instruct")) == 0.5
    assert _alpha(_Run("Llama-3-8B")) == 0.2
