"""Attention summaries captured during generation (a request's ``hallulog_attention``): the five
summaries of ``hallulog.postrun.attention`` per generated token, layer and query head, taken
from the attention weights the fused decoder computes anyway, so no second pass is needed.

Row ``t`` of a sequence is the forward pass that chose token ``t``: the prefill's last query
(``t = 0``; one row of weights per layer computed from the prompt's keys, ``prefill_row``) and
then each decode step, whose query is the token fed at position ``q = P - 1 + t``. A pass's rows
go to a ``StepSummaries``: per layer and query head ``context``, ``generated``, ``previous``
(weight of column ``q - 1``), ``self`` (column ``q``), written by the C kernel
(``hallulog.serving.attention_kernel``) or, on the matmul path, from the explicit weights
(``from_weights``); and each weight on a column ``c >= P - 1``, which ``SequenceSummaries`` adds
up over the steps (the in-degree of column ``c``). When the sequence ends (``n = P + T - 1``
positions fed), ``laplacian`` = in-degree / (n - q) - self, as the post pass defines it.

A finished sequence's ``[T, layers, heads, 5]`` float32 goes to a safetensors file in the
server's spool directory (``features`` and the sequence's ``token_ids``, prompt then answer),
named in the response's ``kv_transfer_params.attention_paths``; the worker moves it beside its
directory and the run stores it in ``attention/`` parts (``hallulog.postrun.attention_gather``).
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Sequence

import torch

__all__ = [
    "StepSummaries",
    "SequenceSummaries",
    "AttentionCapture",
    "column_positions",
    "prefill_row",
]

FIRST_CAPACITY = 64  # rows a sequence's buffers hold before they grow (doubling)


def column_positions(mask: torch.Tensor) -> torch.Tensor:
    """The position of each column of ``mask`` ``[rows, columns]`` (True = a token of the row,
    in order), -1 where there is none."""
    mask = mask.bool()
    return torch.where(mask, mask.long().cumsum(-1) - 1, -1)


class StepSummaries:
    """One forward pass's summaries: ``feat`` ``[rows, layers, heads, 5]`` (the laplacian
    entry 0) and ``deg`` ``[rows, width, layers, heads]``, the weight on column ``P - 1 + i``
    at ``i`` (``plen``: each row's prompt length P; ``n``: its positions, the query's
    included)."""

    def __init__(self, layers: int, heads: int, plen: Sequence[int], n: Sequence[int]):
        self.plen = torch.tensor(list(plen), dtype=torch.int64)
        self.n = torch.tensor(list(n), dtype=torch.int64)
        rows, width = len(self.plen), int((self.n - self.plen).max()) + 1
        self.feat = torch.empty((rows, layers, heads, 5), dtype=torch.float32)
        self.deg = torch.empty((rows, width, layers, heads), dtype=torch.float32)

    def kernel_args(self, layer: int) -> tuple:
        return self.feat, self.deg, self.plen, layer

    def from_weights(self, layer: int, weights: torch.Tensor, positions: torch.Tensor) -> None:
        """Layer ``layer``'s summaries from explicit ``weights`` ``[rows, heads, columns]``
        (each row sums to 1) over columns at ``positions`` ``[rows, columns]`` (-1: none)."""
        w = weights.float()
        pos = positions[:, None, :]
        plen, n = self.plen[:, None, None], self.n[:, None, None]
        real = pos >= 0
        context = (w * (real & (pos < plen))).sum(-1)
        generated = (w * (pos >= plen)).sum(-1)
        previous = (w * (pos == n - 2)).sum(-1)
        own = (w * (pos == n - 1)).sum(-1)
        zero = torch.zeros_like(own)
        self.feat[:, layer] = torch.stack((context, generated, previous, own, zero), -1)
        width = self.deg.shape[1]
        index = pos - (plen - 1)
        index = torch.where(real & (index >= 0), index, width).expand_as(w)
        degree = torch.zeros((*w.shape[:2], width + 1), dtype=torch.float32)
        degree.scatter_add_(2, index, w)
        self.deg[:, :, layer] = degree[..., :width].transpose(1, 2)


def prefill_row(
    summaries: StepSummaries,
    layer: int,
    query: torch.Tensor,
    keys: torch.Tensor,
    real: torch.Tensor,
    scaling: float,
) -> None:
    """The prefill's last query of each prompt: ``query`` ``[prompts, heads, head_dim]``,
    ``keys`` ``[prompts, kv_heads, width, head_dim]`` (left-padded; ``real`` ``[prompts,
    width]`` True = a token): its weights, then ``from_weights``."""
    prompts, heads, _ = query.shape
    groups = heads // keys.shape[1]
    keys = keys.repeat_interleave(groups, dim=1) if groups > 1 else keys
    scores = torch.einsum("phd,phwd->phw", query.float(), keys.float()) * scaling
    scores = scores.masked_fill(~real.bool()[:, None, :], float("-inf"))
    summaries.from_weights(layer, torch.softmax(scores, -1), column_positions(real))


class SequenceSummaries:
    """One sequence's rows so far and each column's in-degree (``[capacity, layers,
    heads]``, column ``P - 1 + i`` at ``i``)."""

    def __init__(self, layers: int, heads: int, capacity: int = FIRST_CAPACITY):
        self.feat = torch.zeros((capacity, layers, heads, 5), dtype=torch.float32)
        self.deg = torch.zeros((capacity, layers, heads), dtype=torch.float32)
        self.rows = 0

    def add(self, feat: torch.Tensor, deg: torch.Tensor) -> None:
        """Row ``self.rows``: its summaries ``feat`` ``[layers, heads, 5]`` and its weights on
        columns ``P - 1 ..`` ``deg`` ``[rows + 1, layers, heads]``."""
        if self.rows + 1 > self.feat.shape[0]:
            grown = 2 * self.feat.shape[0]
            self.feat = torch.cat((self.feat, torch.zeros_like(self.feat)))[:grown]
            self.deg = torch.cat((self.deg, torch.zeros_like(self.deg)))[:grown]
        self.feat[self.rows] = feat
        self.deg[: deg.shape[0]] += deg
        self.rows += 1

    def finish(self) -> torch.Tensor:
        """``[T, layers, heads, 5]`` with the laplacian: in-degree / (n - q) - self."""
        rows = self.rows
        feat = self.feat[:rows].clone()
        count = (rows - torch.arange(rows, dtype=torch.float32))[:, None, None]
        feat[..., 4] = self.deg[:rows] / count - feat[..., 3]
        return feat


class AttentionCapture:
    """An engine's summaries: which rows of a pass want them, and their files (``spool_dir``:
    the server's spool directory)."""

    def __init__(self, config, spool_dir: str | os.PathLike[str] | None):
        """``config``: the model's; ``spool_dir`` None: no summaries (the engine has no fused
        decoder or no spool)."""
        self.layers, self.heads = config.num_hidden_layers, config.num_attention_heads
        self.spool_dir = None if spool_dir is None else pathlib.Path(spool_dir)
        self.live = 0  # sequences given summaries and not yet written (a step without: no work)

    def for_prefill(self, batch, lengths) -> StepSummaries | None:
        """The prefill's summaries when a sequence of ``batch`` wants them (``lengths``: the
        prompts' lengths)."""
        if self.spool_dir is None or not any(seq.params.attention for seq in batch):
            return None
        return StepSummaries(self.layers, self.heads, lengths, lengths)

    def admitted(self, batch, source, summaries: StepSummaries | None) -> None:
        """Row 0 of each sequence of ``batch`` that wants it."""
        if summaries is None:
            return
        for seq, row in zip(batch, source):
            if seq.params.attention:
                seq.summaries = SequenceSummaries(self.layers, self.heads)
                self.live += 1
                seq.summaries.add(summaries.feat[row], summaries.deg[row, :1])

    def for_step(self, active) -> StepSummaries | None:
        """A decode step's summaries when a running sequence wants them."""
        if not self.live or not any(seq.summaries is not None for seq in active):
            return None
        plen = [len(seq.prompt_ids) for seq in active]
        n = [p + len(seq.out_ids) for p, seq in zip(plen, active)]
        return StepSummaries(self.layers, self.heads, plen, n)

    def stepped(self, active, summaries: StepSummaries | None) -> None:
        if summaries is None:
            return
        for row, seq in enumerate(active):
            if seq.summaries is not None:
                width = int(summaries.n[row] - summaries.plen[row]) + 1
                seq.summaries.add(summaries.feat[row], summaries.deg[row, :width])

    def write(self, seq) -> str | None:
        """The finished ``seq``'s file (its path), or None when it has no summaries."""
        if seq.summaries is None:
            return None
        from safetensors.torch import save_file

        features = seq.summaries.finish()
        seq.summaries = None
        self.live -= 1
        name = f"attention-{uuid.uuid4().hex}.safetensors"
        final, tmp = self.spool_dir / name, self.spool_dir / f".{name}.partial"
        tokens = torch.tensor(seq.prompt_ids + seq.out_ids, dtype=torch.int64)
        save_file({"features": features, "token_ids": tokens}, str(tmp))
        os.replace(tmp, final)
        return str(final)
