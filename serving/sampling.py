"""Choosing each row's next token for a whole batch at once: greedy rows by argmax, sampled rows
by one draw from the row's own generator (temperature, vLLM's top-p), so a row's draw never
depends on what else is in the batch.

A sampled row draws one uniform number ``u`` from its ``torch.Generator`` per step and takes the
token where the cumulative probability of its candidates passes ``u`` times their mass (inverse
transform sampling: exact for the renormalised nucleus). With top-p the candidates are the
nucleus, found among the row's ``NUCLEUS_CANDIDATES`` most likely tokens (one ``topk`` for the
batch, shared with the top-k logprobs; a full sort only for a row whose candidates hold less
than ``top_p``); without it, the whole vocabulary in token order. Everything but the one draw
per row is a batched tensor op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hallulog.serving.sequences import SequenceState

__all__ = ["SAMPLING_EPS", "NUCLEUS_CANDIDATES", "candidates_needed", "choose_tokens"]

SAMPLING_EPS = 1e-5  # temperatures below this are greedy, as in vLLM
NUCLEUS_CANDIDATES = 64  # top-p looks at the most likely tokens first (a full sort when short)


def candidates_needed(active: list[SequenceState]) -> int:
    """How many top tokens per row ``choose_tokens`` wants (0: none)."""
    nucleus = any(
        seq.params.temperature >= SAMPLING_EPS and seq.params.top_p < 1.0 for seq in active
    )
    return NUCLEUS_CANDIDATES if nucleus else 0


def choose_tokens(
    logits: torch.Tensor,
    active: list[SequenceState],
    top: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One token per row (``[rows]`` int64).

    ``top``: ``torch.topk(logits, k)`` with ``k >= candidates_needed(active)`` when top-p rows
    are present (computed here otherwise).
    """
    chosen = torch.empty(logits.shape[0], dtype=torch.long)
    greedy, nucleus, plain = [], [], []
    for r, seq in enumerate(active):
        params = seq.params
        if params.temperature < SAMPLING_EPS:
            greedy.append(r)
        elif params.top_p < 1.0:
            nucleus.append(r)
        else:
            plain.append(r)
    if greedy:
        chosen[greedy] = torch.argmax(logits[greedy], dim=-1)
    if nucleus:
        if top is None or top[1].shape[-1] < min(NUCLEUS_CANDIDATES, logits.shape[-1]):
            top = torch.topk(logits, min(NUCLEUS_CANDIDATES, logits.shape[-1]), dim=-1)
        count = min(NUCLEUS_CANDIDATES, logits.shape[-1])
        chosen[nucleus] = _draw_nucleus(
            logits[nucleus], top[1][nucleus, :count], [active[r] for r in nucleus]
        )
    if plain:
        rows = [active[r] for r in plain]
        probs = torch.softmax(logits[plain] / _temperatures(rows, logits), dim=-1)
        chosen[plain] = _draw(probs, rows)
    return chosen


def _temperatures(rows: list[SequenceState], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([seq.params.temperature for seq in rows], dtype=like.dtype).unsqueeze(1)


def _draw(probs: torch.Tensor, rows: list[SequenceState]) -> torch.Tensor:
    """Index of each row's draw from ``probs`` ``[n, k]`` (unnormalised, in any order)."""
    cumulative = torch.cumsum(probs, dim=-1)
    u = torch.cat([torch.rand(1, generator=seq.generator, dtype=probs.dtype) for seq in rows])
    target = (u * cumulative[:, -1]).unsqueeze(1)
    index = torch.searchsorted(cumulative, target, right=True)
    return index.squeeze(1).clamp_(max=probs.shape[-1] - 1)


def _draw_nucleus(
    logits: torch.Tensor, order: torch.Tensor, rows: list[SequenceState]
) -> torch.Tensor:
    """vLLM's top-p: the smallest set of most likely tokens whose probability (at the row's
    temperature) reaches ``top_p``, renormalised; ``order`` holds each row's top token ids."""
    probs = torch.softmax(logits / _temperatures(rows, logits), dim=-1)
    top_p = torch.tensor([seq.params.top_p for seq in rows], dtype=probs.dtype).unsqueeze(1)
    values = probs.gather(1, order)
    chosen = torch.empty(len(rows), dtype=torch.long)
    short = torch.cumsum(values, dim=-1)[:, -1] <= top_p.squeeze(1)
    if order.shape[-1] >= probs.shape[-1]:
        short[:] = False  # the candidates are the whole vocabulary
    within = (~short).nonzero().flatten().tolist()
    if within:
        picked = _draw(_nucleus(values[within], top_p[within]), [rows[r] for r in within])
        chosen[within] = order[within].gather(1, picked.unsqueeze(1)).squeeze(1)
    for r in short.nonzero().flatten().tolist():  # the nucleus is larger: sort the whole row
        values_r, order_r = torch.sort(probs[r : r + 1], descending=True)
        chosen[r] = order_r[0, _draw(_nucleus(values_r, top_p[r : r + 1]), [rows[r]])[0]]
    return chosen


def _nucleus(values: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Probabilities sorted high to low with every token past the nucleus zeroed."""
    cumulative = torch.cumsum(values, dim=-1)
    return values.masked_fill((cumulative - values) > top_p, 0.0)
