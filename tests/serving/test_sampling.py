"""The batched sampler: each row's draw is exact (the renormalised nucleus at its temperature),
seeded rows repeat, and a row's draw does not depend on the other rows of the batch."""

import concurrent.futures

import hallulog.serving.sampling as sampling
import pytest
import torch
from hallulog.serving.sampling import candidates_needed, choose_tokens
from hallulog.serving.sequences import SamplingParams, SequenceState


def _rows(n, seed0=0, **params):
    params = {"max_tokens": 1, **params}
    return [
        SequenceState(
            [1],
            SamplingParams(**params),
            concurrent.futures.Future(),
            None if params.get("temperature", 1.0) < 1e-5 else torch.Generator().manual_seed(s),
        )
        for s in range(seed0, seed0 + n)
    ]


def _nucleus(logits, temperature, top_p):
    """vLLM's top-p by the definition: sort, keep the smallest prefix reaching top_p."""
    probs = torch.softmax(logits / temperature, dim=-1)
    values, order = torch.sort(probs, descending=True)
    keep = (torch.cumsum(values, -1) - values) <= top_p
    want = torch.zeros_like(probs)
    want[order[keep]] = values[keep]
    return want / want.sum()


@pytest.mark.parametrize("scale", [0.3, 3.0])  # flat (nucleus past the candidates) and peaked
@pytest.mark.parametrize("top_p", [0.5, 0.95, 1.0])
def test_draws_follow_the_renormalised_nucleus(monkeypatch, scale, top_p):
    monkeypatch.setattr(sampling, "NUCLEUS_CANDIDATES", 16)  # a flat row needs the full sort
    torch.manual_seed(1)
    logits = torch.randn(200) * scale
    draws = 6000
    rows = _rows(draws, temperature=0.7, top_p=top_p)
    batch = logits.expand(draws, -1).contiguous()
    top = torch.topk(batch, max(candidates_needed(rows), 1), dim=-1)
    tokens = choose_tokens(batch, rows, top)
    want = _nucleus(logits, 0.7, top_p)
    seen = torch.bincount(tokens, minlength=200).float() / draws
    assert (seen[want == 0] == 0).all()  # nothing outside the nucleus
    sigma = (want * (1 - want) / draws).sqrt()
    assert ((seen - want).abs() <= 5 * sigma + 1e-3).all()


def test_a_rows_draw_depends_on_its_seed_only():
    torch.manual_seed(2)
    logits = torch.randn(6, 300) * 2
    params = dict(temperature=0.7, top_p=0.9)
    alone = [
        choose_tokens(logits[i : i + 1], _rows(1, seed0=10 + i, **params))[0] for i in range(6)
    ]
    together = choose_tokens(logits, _rows(6, seed0=10, **params))
    assert together.tolist() == [int(t) for t in alone]
    mixed = _rows(3, seed0=10, **params) + _rows(2, temperature=0.0) + _rows(1, seed0=15, **params)
    tokens = choose_tokens(logits, mixed)
    assert tokens[:3].tolist() == together[:3].tolist() and tokens[5] == together[5]
    assert tokens[3:5].tolist() == torch.argmax(logits[3:5], -1).tolist()  # greedy rows
    other_seeds = {
        tuple(choose_tokens(logits, _rows(6, seed0=s, **params)).tolist()) for s in range(5)
    }
    assert len(other_seeds) > 1


def _mixed_rows(n):
    """Greedy, top-p and plain sampled rows, interleaved, each with top-5 logprobs."""
    kinds = [{"temperature": 0.0}, {"temperature": 0.7, "top_p": 0.95}, {"temperature": 1.0}]
    rows = []
    for i in range(n):
        params = SamplingParams(max_tokens=50, top_logprobs=5, **kinds[i % 3])
        generator = None if i % 3 == 0 else torch.Generator().manual_seed(i)
        rows.append(SequenceState([1], params, concurrent.futures.Future(), generator))
    return rows


def test_rows_taken_in_passes_get_what_one_pass_of_the_batch_gets(monkeypatch):
    """take_tokens cuts the batch into passes of ROWS_PER_PASS rows (bounded temporaries): the
    tokens, logprobs, logits and top-5 of every row are those of the batch in one pass."""
    import hallulog.serving.token_step as token_step

    logits = torch.randn(100, 4000) * 3
    runs = {}
    for rows_per_pass in (1000, 32, 7):
        monkeypatch.setattr(token_step, "ROWS_PER_PASS", rows_per_pass)
        active = _mixed_rows(100)
        token_step.take_tokens(active, logits, eos_ids=set(), tokenizer=None, max_model_len=99)
        runs[rows_per_pass] = [(s.out_ids, [vars(lp) for lp in s.logprobs]) for s in active]
    assert runs[32] == runs[1000] and runs[7] == runs[1000]
