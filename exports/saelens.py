"""``saelens``: one layer of a store as SAELens' cached activations (a Hugging Face dataset).

Normative description: docs/formats/saelens.md. SAELens' ``CacheActivationsRunner`` writes, and
``ActivationsStore`` (``use_cached_activations`` / ``cached_activations_path``) reads back, a
dataset saved with ``Dataset.save_to_disk`` whose rows are fixed-length token windows:

    <hook_name>: Array2D(shape=(context_size, d_in), dtype)   token_ids: Sequence(int32, context_size)

Our samples are ragged, so the real token rows of every sample are concatenated in store order
and cut into rows of ``context_size`` tokens (no padding: the incomplete last window is dropped
and counted). ``token_ids`` is written when the token ids are known (``tokens``: a
``consolidated/`` directory; found automatically when ``src`` is one). ``datasets`` is imported
only here, when exporting.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.errors import MalformedLineError
from hallulog.contracts.jsonl import iter_lines, read_row_at
from hallulog.exports._export_dir import staged_dir
from hallulog.storage._io import atomic_write_bytes
from hallulog.storage.base import ActivationReader
from hallulog.storage.dtypes import BFLOAT16, to_float32
from hallulog.storage.errors import ManifestError, StorageError
from hallulog.storage.registry import open_store

log = logging.getLogger(__name__)

__all__ = ["export_saelens", "hook_name_for", "SAELENS_VERSION", "SIDECAR", "SAMPLES"]

#: the sae-lens release the format was checked against (tests load it with this version)
SAELENS_VERSION = "6.54.12"
SIDECAR = "hallulog_saelens.json"
SAMPLES = "hallulog_samples.jsonl"
DTYPES = ("float32", "float16")
#: hallulog_saelens.json keys (docs table "hallulog_saelens.json")
SIDECAR_FIELDS = (
    "format",
    "source",
    "layer",
    "hook_name",
    "context_size",
    "d_in",
    "dtype",
    "num_rows",
    "num_tokens",
    "dropped_tokens",
    "num_samples",
    "token_ids",
    "checked_with",
)
#: hallulog_samples.jsonl lines (table "hallulog_samples.jsonl")
SAMPLE_FIELDS = (
    "sample",
    "sample_key",
    "token_start",
    "seq_len",
    "prompt_len",
    "response_len",
    "label",
)
#: dataset columns besides the hook column (table "columns")
TOKEN_COLUMN = "token_ids"


def hook_name_for(layer_id: int) -> str:
    """TransformerLens' name of our layer id: 0 is the embedding output, k the residual after block k-1."""
    return "blocks.0.hook_resid_pre" if layer_id == 0 else f"blocks.{layer_id - 1}.hook_resid_post"


class ConsolidatedTokenIds:
    """Token ids of each stored row, from ``consolidated/`` (offsets kept, lines re-read on demand)."""

    def __init__(self, root):
        self.root = os.fspath(root)
        self.prompts = self._offsets(layout.PROMPT_INDEX, lambda r: r["prompt_id"])
        self.gens = self._offsets(
            layout.GENERATIONS, lambda r: f"{r['prompt_id']}_{r['sample_id']}"
        )
        self.acts = self._offsets(layout.ACTIVATION_INDEX, lambda r: r["activation_key"])

    def _offsets(self, name: str, key) -> dict[str, int]:
        path = os.path.join(self.root, name)
        if not os.path.exists(path):
            raise StorageError(
                f"tokens: no {name} (token ids come from a consolidated/ directory)", path
            )
        out, n = {}, 0
        try:
            for line in iter_lines(path):
                n = line.lineno
                out[key(line.row)] = line.start
        except (MalformedLineError, KeyError, TypeError) as exc:
            n = getattr(exc, "line", n)
            raise ManifestError("unparsable line or missing id fields", path, line=n) from None
        return out

    def _line(self, name: str, offsets: dict, key: str, arg: str) -> dict:
        if key not in offsets:
            raise StorageError(
                f"tokens: {arg} {key} is not in {name}", os.path.join(self.root, name)
            )
        with open(os.path.join(self.root, name), "rb") as f:
            return read_row_at(f, offsets[key])

    def rows(self, key: str, seq_len: int) -> np.ndarray:
        """``(seq_len,)`` int32: the input token at each stored row of activation ``key``."""
        act = self._line(layout.ACTIVATION_INDEX, self.acts, key, "activation")
        gen = self._line(layout.GENERATIONS, self.gens, key, "generation")
        prompt = self._line(layout.PROMPT_INDEX, self.prompts, key.rsplit("_", 1)[0], "prompt")
        seq = list(prompt.get("prompt_token_ids") or []) + list(gen.get("token_ids") or [])
        start, n = int(act.get("row0_position", 0)), int(act.get("num_rows", seq_len))
        if n != seq_len or start + n > len(seq):
            raise ManifestError(
                f"activation {key}: rows {start}..{start + n} do not fit {len(seq)} token ids "
                f"or the store's {seq_len} rows",
                os.path.join(self.root, layout.ACTIVATION_INDEX),
            )
        at = act.get("token_positions")  # --positions runs: row j is at token_positions[j]
        if at is not None:
            if len(at) != n or (at and max(at) >= len(seq)):
                raise ManifestError(
                    f"activation {key}: token_positions do not fit {len(seq)} token ids",
                    os.path.join(self.root, layout.ACTIVATION_INDEX),
                )
            return np.asarray([seq[p] for p in at], np.int32)
        return np.asarray(seq[start : start + n], np.int32)


def _token_source(src, tokens) -> ConsolidatedTokenIds | None:
    if tokens is not None:
        return ConsolidatedTokenIds(tokens)
    if isinstance(src, (str, os.PathLike)) and all(
        os.path.isfile(os.path.join(src, f)) for f in layout.CONSOLIDATED_JSONL_FILES
    ):
        return ConsolidatedTokenIds(src)
    return None


def _windows(
    reader: ActivationReader,
    pos: int,
    context_size: int,
    dtype,
    ids: ConsolidatedTokenIds | None,
    batch_rows: int,
):
    """Yield ``(acts (k, C, D), token ids (k, C) or None)`` batches of full windows, in store order."""
    D = reader.hidden_size
    acts_buf = np.empty((batch_rows * context_size, D), dtype)
    tok_buf = np.empty(batch_rows * context_size, np.int32)
    fill = 0
    for i in range(len(reader)):
        m = reader.meta(i)
        t = int(m["seq_len"])
        if not t:
            continue
        a = to_float32(reader.read(i, pos)) if reader.dtype == BFLOAT16 else reader.read(i, pos)
        tk = ids.rows(m["sample_key"], t) if ids is not None else None
        k = 0
        while k < t:
            take = min(t - k, len(acts_buf) - fill)
            acts_buf[fill : fill + take] = a[k : k + take]
            if tk is not None:
                tok_buf[fill : fill + take] = tk[k : k + take]
            fill, k = fill + take, k + take
            if fill == len(acts_buf):
                yield (
                    acts_buf.reshape(batch_rows, context_size, D),
                    (tok_buf.reshape(batch_rows, context_size) if ids is not None else None),
                )
                fill = 0
    full = fill // context_size
    if full:
        n = full * context_size
        yield (
            acts_buf[:n].reshape(full, context_size, D),
            (tok_buf[:n].reshape(full, context_size) if ids is not None else None),
        )


def export_saelens(
    src,
    dst,
    layer: int,
    context_size: int = 128,
    hook_name: str | None = None,
    dtype: str = "float32",
    tokens=None,
    batch_rows: int = 256,
) -> dict:
    """Write model layer ``layer`` of the store at ``src`` as SAELens cached activations in ``dst``.

    ``dst`` must be new or empty; the dataset is built in a temporary sibling and renamed at the
    end. ``hook_name`` defaults to ``hook_name_for(layer)``; use the same one (and the same
    ``context_size``, ``d_in``) in SAELens' config. Returns the sidecar dict.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {DTYPES}")
    if int(context_size) < 1:
        raise ValueError(f"context_size: must be >= 1, got {context_size}")
    reader = src if isinstance(src, ActivationReader) else open_store(src)
    if int(layer) not in reader.layer_ids:
        raise StorageError(
            f"layer: {layer} is not stored (stored: {list(reader.layer_ids)})", reader.path
        )
    pos = reader.layer_ids.index(int(layer))
    lengths = [int(reader.meta(i)["seq_len"]) for i in range(len(reader))]
    total = sum(lengths)
    if total == 0:
        raise StorageError("src: store has no activations (no sample has a token row)", reader.path)
    num_rows = total // int(context_size)
    if num_rows == 0:
        raise ValueError(f"context_size: {context_size} is more than the store's {total} tokens")
    try:
        from datasets import Array2D, Dataset, Features, Sequence, Value
        from datasets.arrow_writer import ArrowWriter
    except ImportError:
        raise StorageError(
            "the saelens export needs the `datasets` package (pip install datasets)"
        ) from None
    ids = _token_source(src, tokens)
    hook = hook_name or hook_name_for(int(layer))
    C, D = int(context_size), int(reader.hidden_size)
    cols = {hook: Array2D(shape=(C, D), dtype=dtype)}
    if ids is not None:
        cols[TOKEN_COLUMN] = Sequence(Value(dtype="int32"), length=C)
    features = Features(cols)
    side = {
        "format": "hallulog.saelens",
        "source": os.path.abspath(reader.path),
        "layer": int(layer),
        "hook_name": hook,
        "context_size": C,
        "d_in": D,
        "dtype": dtype,
        "num_rows": num_rows,
        "num_tokens": num_rows * C,
        "dropped_tokens": total - num_rows * C,
        "num_samples": len(lengths),
        "token_ids": ids is not None,
        "checked_with": f"sae-lens=={SAELENS_VERSION}",
    }
    with staged_dir(dst) as tmp:
        arrow = os.path.join(tmp, ".build.arrow")
        with ArrowWriter(features=features, path=arrow) as w:
            for acts, tok in _windows(
                reader, pos, C, np.dtype(dtype), ids, max(1, int(batch_rows))
            ):
                batch = {hook: list(acts)}
                if tok is not None:
                    batch[TOKEN_COLUMN] = tok.tolist()
                w.write_batch(batch)
            w.finalize()
        out = os.path.join(tmp, "dataset")
        Dataset.from_file(arrow).save_to_disk(out)
        os.unlink(arrow)
        for name in os.listdir(
            out
        ):  # the dataset's files sit at the top of dst, as SAELens writes them
            os.replace(os.path.join(out, name), os.path.join(tmp, name))
        os.rmdir(out)
        rows, start = [], 0
        for i, t in enumerate(lengths):
            m = reader.meta(i)
            rows.append(
                json.dumps(
                    {
                        "sample": i,
                        "sample_key": m["sample_key"],
                        "token_start": start,
                        "seq_len": t,
                        "prompt_len": m["prompt_len"],
                        "response_len": m["response_len"],
                        "label": m["label"],
                    }
                )
                + "\n"
            )
            start += t
        atomic_write_bytes(os.path.join(tmp, SAMPLES), "".join(rows).encode())
        atomic_write_bytes(os.path.join(tmp, SIDECAR), (json.dumps(side, indent=2) + "\n").encode())
    log.info(
        "wrote %d rows of %d tokens (%d dropped) of layer %d to %s",
        num_rows,
        C,
        side["dropped_tokens"],
        layer,
        dst,
    )
    return side
