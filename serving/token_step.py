"""One decode step's tokens: each row's token chosen, its logprobs recorded, its stop rules
applied.

One ``topk`` serves both the top-k logprobs and the top-p candidates; logprobs are gathered
from one ``log_softmax`` of the batch and moved to Python in one call each. Logprobs are vLLM's
default ``raw_logprobs`` (before temperature and top-p), clamped to ``LOGPROB_FLOOR``.
"""

from __future__ import annotations

import torch
from hallulog.serving.sampling import candidates_needed, choose_tokens
from hallulog.serving.sequences import SequenceState, TokenLogprob

__all__ = ["LOGPROB_FLOOR", "ROWS_PER_PASS", "check_stop", "take_tokens"]

LOGPROB_FLOOR = -9999.0  # JSON has no -inf; vLLM clamps the same way
ROWS_PER_PASS = 32  # rows of logits processed together (see take_tokens)


def take_tokens(
    active: list[SequenceState], logits: torch.Tensor, eos_ids, tokenizer, max_model_len: int
) -> list[SequenceState]:
    """Choose one token per row of ``logits``, record logprobs, apply stop rules; return the
    rows that finished. The rows go ``ROWS_PER_PASS`` at a time: every operation here is row by
    row, so the results are those of the whole batch at once, and the temporaries of a pass
    (each a copy of the logits: softmax, log-softmax, the sampled rows') stay a few MB where
    the batch's would be ~20 MB each (96 rows of a 49k vocabulary)."""
    logits = logits.cpu()  # the rows' generators are CPU generators
    want_top = max((seq.params.top_logprobs or 0 for seq in active), default=0)
    want_lp = any(seq.params.top_logprobs is not None for seq in active)
    k = min(max(want_top, candidates_needed(active)), logits.shape[-1])
    finished: list[SequenceState] = []
    for lo in range(0, len(active), ROWS_PER_PASS):
        rows = slice(lo, lo + ROWS_PER_PASS)
        finished += _take(
            active[rows], logits[rows], k, want_top, want_lp, eos_ids, tokenizer, max_model_len
        )
    return finished


def _take(
    active: list[SequenceState],
    logits: torch.Tensor,
    k: int,
    want_top: int,
    want_lp: bool,
    eos_ids,
    tokenizer,
    max_model_len: int,
) -> list[SequenceState]:
    """``take_tokens`` on some rows (``k``: the batch's top count, so that ties are ordered as
    in one ``topk`` of the batch)."""
    top = torch.topk(logits, k, dim=-1) if k else None
    chosen_t = choose_tokens(logits, active, top)
    chosen = chosen_t.tolist()
    if want_lp:
        logprobs = torch.log_softmax(logits, dim=-1)
        index = chosen_t.unsqueeze(1)
        chosen_lp = logprobs.gather(1, index).squeeze(1).clamp_(min=LOGPROB_FLOOR).tolist()
        chosen_logit = logits.gather(1, index).squeeze(1).tolist()
        if want_top:
            ids = top[1][:, :want_top]
            top_values = logprobs.gather(1, ids).clamp_(min=LOGPROB_FLOOR).tolist()
            top_ids = ids.tolist()
    finished = []
    for row, seq in enumerate(active):
        token = chosen[row]
        seq.out_ids.append(token)
        k = seq.params.top_logprobs
        if k is not None:
            top_k = list(zip(top_ids[row][:k], top_values[row][:k])) if k else []
            seq.logprobs.append(TokenLogprob(token, chosen_lp[row], chosen_logit[row], top_k))
        if check_stop(seq, eos_ids, tokenizer, max_model_len):
            finished.append(seq)
    return finished


def check_stop(seq: SequenceState, eos_ids, tokenizer, max_model_len: int) -> bool:
    """Whether ``seq`` stops after its last token (EOS, a stop string, its length); sets its
    finish reason and text."""
    token = seq.out_ids[-1]
    params = seq.params
    if token in eos_ids:
        seq.finish_reason = "stop"
    if params.stop:
        previous = len(seq.text)
        seq.text = tokenizer.decode(seq.out_ids, skip_special_tokens=True)
        if seq.finish_reason is None:
            longest = max(len(s) for s in params.stop)
            start = max(0, previous - longest + 1)
            hits = [(seq.text.find(s, start), s) for s in params.stop]
            hits = [(at, s) for at, s in hits if at >= 0]
            if hits:
                at, stop = min(hits)
                seq.text = seq.text[:at]
                seq.finish_reason, seq.stop_reason = "stop", stop
    if seq.finish_reason is None and (
        len(seq.out_ids) >= params.max_tokens
        or len(seq.prompt_ids) + len(seq.out_ids) >= max_model_len
    ):
        seq.finish_reason = "length"
    return seq.finish_reason is not None
