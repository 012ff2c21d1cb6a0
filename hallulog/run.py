"""``hallulog.open_run(root)``: a finished run's tables, labels and activations from Python.

Built on the same readers as ``hallulog evaluate`` (``hallulog.evaluation.data``, the activation store
through ``hallulog.storage.open_store``); nothing here contacts a server. Tables come from
``consolidated/*.parquet`` (or, where a run has none, e.g. an imported one, from the JSONL
files), as pandas (default), polars or pyarrow. Activation matrices are filled one
``read_pairs`` batch at a time: the peak is the ``(rows, hidden)`` float32 result plus one
batch of slices, never the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hallulog.contracts import layout
from hallulog.evaluation.data import Run as _Run
from hallulog.evaluation.data import iter_joined, iter_jsonl
from hallulog.evaluation.features import probe_rows

__all__ = ["open_run", "RunView"]

_TABLES = {
    "prompts": (layout.PROMPTS_PARQUET, layout.PROMPT_INDEX),
    "generations": (layout.GENERATIONS_PARQUET, layout.GENERATIONS),
    "activation_index": (layout.ACTIVATION_INDEX_PARQUET, layout.ACTIVATION_INDEX),
}
_POSITIONS = ("last", "first", "tbg", "slt", "exact")


def open_run(root: Path | str) -> RunView:
    """Open a run root (one ``hallulog run`` or ``import`` wrote)."""
    return RunView(root)


class RunView:
    def __init__(self, root: Path | str):
        self._run = _Run(root)
        self.root = self._run.root

    @property
    def manifest(self) -> dict:
        return self._run.manifest()

    # ---- tables -------------------------------------------------------------------------
    def table(self, name: str, backend: str = "pandas"):
        """``prompts``, ``generations`` or ``activation_index`` as a pandas / polars / pyarrow
        table."""
        if name not in _TABLES:
            raise ValueError(f"table {name!r}: choose from {sorted(_TABLES)}")
        pq_name, jsonl_name = _TABLES[name]
        path = self._run.consolidated / pq_name
        if path.is_file():
            import pyarrow.parquet as pq

            t = pq.read_table(path)
        else:
            import pyarrow as pa

            rows = (
                [r for _, r in iter_jsonl(self._run.consolidated / jsonl_name)]
                if (self._run.consolidated / jsonl_name).is_file()
                else []
            )
            t = pa.Table.from_pylist(rows)
        return _convert(t, backend)

    def prompts(self, backend: str = "pandas"):
        return self.table("prompts", backend)

    def generations(self, backend: str = "pandas"):
        return self.table("generations", backend)

    def labels(self) -> dict[str, int | None]:
        """``{prompt_id: 0 (correct) | 1 (hallucinated) | None}`` of the primary answers."""
        return {
            r["prompt_id"]: r.get("label") for _, r in iter_jsonl(self._run.export_path("logprob"))
        }

    def scores(self, backend: str = "pandas"):
        """``evaluation/scores.parquet`` (after ``evaluate``): one column per method."""
        import pyarrow.parquet as pq

        from hallulog.evaluation.scores import SCORES_FILE

        path = layout.evaluation_dir(self.root) / SCORES_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: run `hallulog evaluate --artifact-root "
                f"{self.root}` (or RunView.evaluate()) first"
            )
        return _convert(pq.read_table(path), backend)

    # ---- activations ----------------------------------------------------------------------
    def _targets(self, over: str, position: str | int) -> Iterator[tuple[str, int, str, int]]:
        """(prompt_id, sample_id, activation key, row) of every stored row wanted."""
        if over == "prompts":
            if position not in _POSITIONS:
                raise ValueError(f"position {position!r}: over prompts choose from {_POSITIONS}")
            for rows in iter_joined(self._run, ["logprob", "geometry"]):
                geo = rows.get("geometry") or {}
                if not geo.get("activation_key"):
                    continue
                if position == "first":
                    r = 0 if geo.get("num_rows") else -1
                else:
                    r = probe_rows(geo, rows["logprob"].get("tokens"))[position]
                yield rows["logprob"]["prompt_id"], 0, geo["activation_key"], r
        elif over == "generations":
            if position not in ("last", "first") and not isinstance(position, int):
                raise ValueError("over generations the position is 'last', 'first' or a row index")
            for _, r in self._run.iter_activation_index():
                n = int(r.get("num_rows") or 0)
                row = {"last": n - 1, "first": 0}.get(position, position)
                row = row + n if isinstance(row, int) and row < 0 else row
                yield (
                    r["prompt_id"],
                    int(r.get("sample_id", 0)),
                    r["activation_key"],
                    row if 0 <= row < n else -1,
                )
        else:
            raise ValueError("over: 'prompts' (primary answers) or 'generations' (every sample)")

    def activations(
        self, layer: int, position: str | int = "last", *, over: str = "prompts", batch: int = 256
    ):
        """``(ids, matrix)``: ``ids`` a list of (prompt_id, sample_id), ``matrix`` a
        ``(len(ids), hidden)`` float32 array of the stored row at ``position`` of layer id
        ``layer``; rows the run did not store are NaN."""
        from hallulog.storage import open_store
        from hallulog.storage.dtypes import BFLOAT16, to_float32

        if not self._run.has_activations():
            raise FileNotFoundError(f"{self._run.consolidated}: the run stores no activations")
        targets = list(self._targets(over, position))
        reader = open_store(self._run.consolidated)
        try:
            ids = [int(x) for x in reader.layer_ids]
            if layer not in ids:
                raise ValueError(f"layer {layer} is not stored; the run has layers {ids}")
            li = ids.index(layer)
            wide = to_float32 if reader.dtype == BFLOAT16 else (lambda a: a)
            out = np.full((len(targets), reader.hidden_size), np.nan, np.float32)
            todo = []
            for j, (_, _, key, row) in enumerate(targets):
                if row < 0:
                    continue
                try:
                    todo.append((j, reader.index_of(key), row))
                except KeyError:
                    continue
            for start in range(0, len(todo), batch):
                chunk = todo[start : start + batch]
                slices = reader.read_pairs([i for _, i, _ in chunk], [li] * len(chunk))
                for (j, _, row), a in zip(chunk, slices):
                    if row < len(a):
                        out[j] = wide(a[row])
                del slices
        finally:
            reader.close()
        return [(p, s) for p, s, _, _ in targets], out

    def attention(self) -> Iterator:
        """The attention summaries of ``--attention-features``, one generation at a time
        (``AttentionGeneration``: ``prompt_id``, ``sample_id``, ``features`` ``[tokens, layers,
        heads, 5]``; docs/formats/attention.md); nothing for a run without them."""
        from hallulog.storage.attention_format import iter_generations

        return iter_generations(self.root)

    # ---- evaluation -------------------------------------------------------------------------
    def evaluate(self, *, write: bool = True, **options) -> dict:
        """``hallulog evaluate`` on this run (options: methods, seed, folds, n_boot,
        embeddings, train_root); writes ``evaluation/`` unless ``write=False``."""
        from hallulog.evaluation.evaluate import evaluate
        from hallulog.evaluation.report import write_report
        from hallulog.evaluation.scores import SCORES_FILE, write_scores

        report = evaluate(self.root, **options)
        if write:
            out = layout.evaluation_dir(self.root)
            write_report(report, out, plots=False)
            write_scores(report["_scores"], out / SCORES_FILE)
        return {k: v for k, v in report.items() if not k.startswith("_")}


def _convert(table, backend: str):
    if backend == "arrow":
        return table
    if backend == "pandas":
        return table.to_pandas()
    if backend == "polars":
        import polars as pl

        return pl.from_arrow(table)
    raise ValueError(f"backend {backend!r}: pandas, polars or arrow")
