"""The attention pass of ``--attention-features``: per generated token, layer and query head,
five summaries of the attention weights, computed after the run by one transformers forward
pass (``attn_implementation="eager"``, ``output_attentions=True``) over each generation's prompt
and answer, for any backend (vLLM's and the embedded server's fused kernels expose no weights).

Row ``t`` of a generation of ``T`` tokens is the decode step that chose token ``t``: its query is
the token at position ``q = P - 1 + t`` (``P`` prompt tokens; ``t = 0`` is the prompt's last
token, the prefill's last position). The pass reads prompt + answer without its last token
(``n = P + T - 1`` positions: exactly the queries the decode steps computed). With ``A`` the
head's attention matrix (rows queries, columns keys, rows summing to 1):

- ``context`` = sum_{k < P} A[q, k]: the mass on the prompt (Lookback Lens' context);
- ``generated`` = sum_{P <= k <= q} A[q, k]: the mass on the answer so far (its new tokens;
  0 at ``t = 0``); ``context + generated = 1``;
- ``previous`` = A[q, q - 1] (RAUQ's attention to the previous token);
- ``self`` = A[q, q] (AttentionScore's diagonal);
- ``laplacian`` = d_q - A[q, q] with d_q = sum_{u = q}^{n - 1} A[u, q] / (n - q): the diagonal
  of LapEigvals' Laplacian L = D - A (in-degree over the tokens that can attend to q,
  normalised by their count). L is lower triangular, so these are its eigenvalues.

Committed in parts (``hallulog.storage.attention_format``): a SIGKILLed pass loses at most the
batch in flight, and the next pass does only the generations no part holds.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.contracts.jsonl import iter_lines
from hallulog.storage.attention_format import done_keys, write_part

__all__ = ["summaries", "attention_pass", "AttentionPassResult", "load_eager_model"]

logger = logging.getLogger(__name__)

MAP_BUDGET = 256 * 2**20  # bytes of attention maps one batch may hold (every layer)
PART_GENERATIONS = 256  # generations per committed part


def summaries(attentions, prompt_lens, lengths) -> list[np.ndarray]:
    """The summaries of a right-padded batch: ``attentions`` one ``[batch, heads, N, N]`` per
    layer (rows sum to 1), ``prompt_lens[b]`` = P, ``lengths[b]`` = n real positions of row b.
    Returns per sequence ``[n - P + 1, layers, heads, 5]`` float32 (rows q = P - 1 .. n - 1)."""
    batch, _, width, _ = attentions[0].shape
    keys = torch.arange(width)
    prompt_lens_t = torch.as_tensor(prompt_lens)
    lengths_t = torch.as_tensor(lengths)
    in_prompt = (keys[None, :] < prompt_lens_t[:, None]).to(attentions[0].dtype)[:, None, None]
    real_query = (keys[None, :] < lengths_t[:, None]).to(attentions[0].dtype)[:, None, :, None]
    count = (lengths_t[:, None] - keys[None, :]).clamp(min=1)[:, None, :]  # n - q
    layers = []
    for a in attentions:
        a = a.float()
        context = (a * in_prompt).sum(-1)  # [B, H, N]
        generated = (a * (1 - in_prompt)).sum(-1)
        diag = torch.diagonal(a, dim1=-2, dim2=-1)
        previous = torch.nn.functional.pad(torch.diagonal(a, offset=-1, dim1=-2, dim2=-1), (1, 0))
        indegree = (a * real_query).sum(-2) / count
        layers.append(torch.stack((context, generated, previous, diag, indegree - diag), -1))
    stacked = torch.stack(layers, 1).permute(0, 3, 1, 2, 4)  # [B, N, L, H, 5]
    return [
        stacked[b, prompt_lens[b] - 1 : lengths[b]].numpy().astype(np.float32) for b in range(batch)
    ]


def load_eager_model(model_path: str | Path, device: str = "cpu"):
    """The model with transformers' eager attention (its weights are returned)."""
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path), attn_implementation="eager", dtype=dtype
    )
    return model.to(device).eval()


@torch.inference_mode()
def _batch_features(model, batch) -> list[np.ndarray]:
    """``batch``: ``(prompt_ids, answer_ids)`` pairs; their summaries."""
    device = next(model.parameters()).device
    seqs = [list(p) + list(a[:-1]) for p, a in batch]
    lengths = [len(s) for s in seqs]
    width = max(lengths)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        output_attentions=True,
        use_cache=False,
        logits_to_keep=1,
    )
    maps = [a.to("cpu") for a in out.attentions]
    return summaries(maps, [len(p) for p, _ in batch], lengths)


def _generations(root: Path):
    """``(prompt_ids, generation rows)`` per prompt of ``consolidated/``, streamed in lockstep
    (both files list the prompts in the same order)."""
    consolidated = layout.consolidated_dir(root)
    prompts = (line.row for line in iter_lines(consolidated / layout.PROMPT_INDEX))
    rows = (line.row for line in iter_lines(consolidated / layout.GENERATIONS))
    for prompt_id, group in itertools.groupby(rows, key=lambda r: r["prompt_id"]):
        for prompt in prompts:
            if prompt["prompt_id"] == prompt_id:
                break
        else:
            raise ArtifactError(
                f"{consolidated / layout.GENERATIONS}: prompt {prompt_id} is not in "
                f"{layout.PROMPT_INDEX} in the same order; re-consolidate with --consolidate-only"
            )
        yield prompt["prompt_token_ids"], list(group)


@dataclass
class AttentionPassResult:
    generations: int = 0
    tokens: int = 0
    skipped: int = 0
    already: int = 0
    seconds: float = 0.0


def attention_pass(root: str | Path, model_path: str | Path, *, device: str = "cpu", model=None):
    """Write the summaries of every consolidated generation of ``root`` no committed part holds
    (``model``: an eager model already loaded)."""
    started = time.monotonic()
    root = Path(root)
    result = AttentionPassResult()
    done = done_keys(root)
    model = model if model is not None else load_eager_model(model_path, device)
    config = model.config
    cell = config.num_hidden_layers * config.num_attention_heads * 4
    batch, keys, part_keys, part_feats = [], [], [], []

    def run_batch() -> None:
        if batch:
            part_feats.extend(_batch_features(model, batch))
            part_keys.extend(keys)
            batch.clear()
            keys.clear()
        if len(part_keys) >= PART_GENERATIONS:
            commit()

    def commit() -> None:
        if part_keys:
            write_part(root, list(part_keys), list(part_feats))
            part_keys.clear()
            part_feats.clear()

    for prompt_ids, rows in _generations(root):
        for row in rows:
            key = (row["prompt_id"], int(row["sample_id"]), row["commit_id"])
            answer = row.get("token_ids") or []
            if key in done:
                result.already += 1
                continue
            if not answer or not prompt_ids:
                result.skipped += 1
                continue
            n = len(prompt_ids) + len(answer) - 1
            widest = max([n, *(len(p) + len(a) - 1 for p, a in batch)])
            if batch and (len(batch) + 1) * widest * widest * cell > MAP_BUDGET:
                run_batch()
            batch.append((prompt_ids, answer))
            keys.append((*key, len(prompt_ids)))
            result.generations += 1
            result.tokens += len(answer)
    run_batch()
    commit()
    result.seconds = time.monotonic() - started
    logger.info(
        "attention pass: %d generations, %d tokens in %.1f s (%d already stored, %d empty)",
        result.generations,
        result.tokens,
        result.seconds,
        result.already,
        result.skipped,
    )
    return result
