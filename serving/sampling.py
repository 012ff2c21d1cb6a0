"""Choosing each row's next token: greedy by argmax, or a draw from the row's own generator
(temperature, vLLM's top-p), so a row's draw never depends on what else is in the batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from serving.sequences import SequenceState

__all__ = ["SAMPLING_EPS", "NUCLEUS_CANDIDATES", "choose_tokens", "draw_top_p"]

SAMPLING_EPS = 1e-5  # temperatures below this are greedy, as in vLLM
NUCLEUS_CANDIDATES = 256  # top-p looks at the most likely tokens first (a full sort when short)


def draw_top_p(probs: torch.Tensor, top_p: float, generator: torch.Generator | None) -> int:
    """vLLM's top-p draw: ``multinomial`` over the probabilities sorted high to low with every
    token past the nucleus zeroed, without sorting the whole vocabulary.

    ``torch.multinomial(x, 1)`` picks ``argmax(x / q)`` with ``q ~ Exp(1)`` drawn for every
    entry of ``x``. The nucleus is found in the top ``NUCLEUS_CANDIDATES`` (``topk``; the full
    sort only when they hold less than ``top_p``), and ``q`` is drawn over the full vocabulary,
    so the generator advances and the token drawn are those of the full sort.
    """
    vocab = probs.shape[-1]
    values, order = torch.topk(probs, min(NUCLEUS_CANDIDATES, vocab))
    cumulative = torch.cumsum(values, dim=-1)
    if values.shape[-1] < vocab and cumulative[-1] <= top_p:  # the nucleus is larger
        values, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(values, dim=-1)
    values = values.masked_fill((cumulative - values) > top_p, 0.0)
    q = torch.empty(vocab, dtype=probs.dtype).exponential_(generator=generator)
    return int(order[torch.argmax(values / q[: values.shape[-1]])])


def choose_tokens(logits: torch.Tensor, active: list[SequenceState]) -> list[int]:
    """One token per row: greedy rows by argmax; sampled rows share one batched softmax,
    then draw with their own generator (so a row's draw never depends on the batch)."""
    chosen = torch.argmax(logits, dim=-1).tolist()
    rows = [r for r, seq in enumerate(active) if seq.params.temperature >= SAMPLING_EPS]
    if not rows:
        return chosen
    temps = torch.tensor(
        [active[r].params.temperature for r in rows], dtype=logits.dtype, device=logits.device
    ).unsqueeze(1)
    probs = torch.softmax(logits[rows] / temps, dim=-1).cpu()
    for i, r in enumerate(rows):
        params, generator = active[r].params, active[r].generator
        if params.top_p < 1.0:
            chosen[r] = draw_top_p(probs[i], params.top_p, generator)
        else:
            chosen[r] = int(torch.multinomial(probs[i], 1, generator=generator))
    return chosen
