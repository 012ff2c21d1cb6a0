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

Per prompt, the prompt but its last token goes through the model once; its keys and values
serve up to ``GROUP_ROWS`` of its answers in one pass (the prompt is not recomputed per
answer). Committed in parts (``hallulog.storage.attention_format``): a SIGKILLed pass loses at most the
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
import torch.nn.functional as F
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.contracts.jsonl import iter_lines
from hallulog.storage.attention_format import done_keys, write_part

__all__ = [
    "summaries",
    "attention_pass",
    "AttentionPassResult",
    "load_eager_model",
    "consolidated_generations",
]

logger = logging.getLogger(__name__)

GROUP_ROWS = 16  # answers of one prompt in one forward pass
PART_GENERATIONS = 256  # generations per committed part


def summaries(attentions, prompt_lens, lengths, offset: int = 0) -> list[np.ndarray]:
    """The summaries of a right-padded batch: ``attentions`` one ``[batch, heads, rows, keys]``
    per layer (rows sum to 1), row ``i`` the query at position ``offset + i``, key ``k`` position
    ``k``; ``prompt_lens[b]`` = P, ``lengths[b]`` = n real positions of sequence b. Returns per
    sequence ``[n - P + 1, layers, heads, 5]`` float32 (queries q = P - 1 .. n - 1)."""
    batch, _, rows, width = attentions[0].shape
    if width != offset + rows:
        raise ValueError(f"attention over {width} keys, expected {offset} + {rows}")
    keys, queries = torch.arange(width), offset + torch.arange(rows)
    prompt_lens_t = torch.as_tensor(prompt_lens)
    lengths_t = torch.as_tensor(lengths)
    dtype = attentions[0].dtype
    in_prompt = (keys[None, :] < prompt_lens_t[:, None]).to(dtype)[:, None, None]
    real_query = (queries[None, :] < lengths_t[:, None]).to(dtype)[:, None, :, None]
    count = (lengths_t[:, None] - queries[None, :]).clamp(min=1)[:, None, :]  # n - q
    layers = []
    for a in attentions:
        a = a.float()
        context = (a * in_prompt).sum(-1)  # [B, H, rows]
        generated = (a * (1 - in_prompt)).sum(-1)
        diag = torch.diagonal(a, offset=offset, dim1=-2, dim2=-1)
        if offset:
            previous = torch.diagonal(a, offset=offset - 1, dim1=-2, dim2=-1)
        else:
            previous = F.pad(torch.diagonal(a, offset=-1, dim1=-2, dim2=-1), (1, 0))
        indegree = (a[..., offset:] * real_query).sum(-2) / count  # keys q = offset + i
        layers.append(torch.stack((context, generated, previous, diag, indegree - diag), -1))
    stacked = torch.stack(layers, 1).permute(0, 3, 1, 2, 4)  # [B, rows, L, H, 5]
    return [
        stacked[b, prompt_lens[b] - 1 - offset : lengths[b] - offset].numpy().astype(np.float32)
        for b in range(batch)
    ]


def load_eager_model(model_path: str | Path, device: str | None = None):
    """The model with transformers' eager attention (its weights are returned); ``device``
    None: the first GPU where torch sees one (bfloat16), else the CPU (float32)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path), attn_implementation="eager", dtype=dtype
    )
    return model.to(device).eval()


@torch.inference_mode()
def _group_features(model, prompt_ids, answers) -> list[np.ndarray]:
    """The summaries of the ``answers`` of one prompt: the prompt but its last token goes
    through the model once, its keys and values are shared by the answers' rows, which start
    at the prompt's last token (the first decode step's query)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    prefix = len(prompt_ids) - 1
    cache = DynamicCache(config=model.config)
    if prefix:
        model(
            input_ids=torch.tensor([prompt_ids[:-1]], device=device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_repeat_interleave(len(answers))
    seqs = [[prompt_ids[-1], *a[:-1]] for a in answers]
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), prefix + width), dtype=torch.long)
    mask[:, :prefix] = 1
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, prefix : prefix + len(s)] = 1
    positions = (prefix + torch.arange(width))[None].expand(len(seqs), -1)
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        past_key_values=cache if prefix else None,
        use_cache=bool(prefix),
        output_attentions=True,
        logits_to_keep=1,
    )
    maps = [a.to("cpu") for a in out.attentions]
    lengths = [prefix + len(s) for s in seqs]
    return summaries(maps, [len(prompt_ids)] * len(seqs), lengths, offset=prefix)


def consolidated_generations(root: Path):
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


def attention_pass(
    root: str | Path, model_path: str | Path, *, device: str | None = None, model=None
):
    """Write the summaries of every consolidated generation of ``root`` no committed part holds
    (``model``: an eager model already loaded; else loaded at the first such generation, so a
    run whose summaries are all stored loads none)."""
    started = time.monotonic()
    root = Path(root)
    result = AttentionPassResult()
    done = done_keys(root)
    part_keys, part_feats = [], []
    for prompt_ids, rows in consolidated_generations(root):
        todo = []
        for row in rows:
            key = (row["prompt_id"], int(row["sample_id"]), row["commit_id"])
            if key in done:
                result.already += 1
            elif not row.get("token_ids") or not prompt_ids:
                result.skipped += 1
            else:
                todo.append((key, row["token_ids"]))
        if todo and model is None:
            model = load_eager_model(model_path, device)
        for at in range(0, len(todo), GROUP_ROWS):
            chunk = todo[at : at + GROUP_ROWS]
            part_feats.extend(_group_features(model, prompt_ids, [a for _, a in chunk]))
            part_keys.extend((*key, len(prompt_ids)) for key, _ in chunk)
            result.generations += len(chunk)
            result.tokens += sum(len(a) for _, a in chunk)
        if len(part_keys) >= PART_GENERATIONS:
            write_part(root, part_keys, part_feats)
            part_keys, part_feats = [], []
    if part_keys:
        write_part(root, part_keys, part_feats)
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
