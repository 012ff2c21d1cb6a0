"""Transfer: probes fitted on one run (``--train-root``) and scored on another (``--artifact-root``).

The two runs must come from the same model and store the same layers with the same hidden size
(checked first: one line naming both roots on a mismatch). The probe's layer is chosen on the
training run alone (its k-fold out-of-fold AUROC); the SEP target on the training run is its
``se_discrete_exact`` (no embedding model is loaded for the training run).

:func:`transfer_scores` scores one training run's probes on several test runs (the transfer
matrices of ``hallulog compare``): the training run's store is read once in full to choose each
probe's layer, then at the chosen layers only, as is each test run's; the scores equal
``evaluate --train-root A --test-root B``'s for every pair.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.evaluation.data import EvaluationInputError, Run
from hallulog.evaluation.features import collect
from hallulog.evaluation.probes import (
    PROBES,
    fill_layer,
    fit_probe,
    run_transfer,
    store_index,
    upper_layers,
)
from hallulog.evaluation.protocol import Split, auroc, make_split
from hallulog.evaluation.semantic_entropy import binarize_threshold

__all__ = [
    "check_compatible",
    "transfer_probes",
    "run_shape",
    "ProbeCell",
    "open_probe_cell",
    "transfer_scores",
]


def run_shape(run: Run) -> dict:
    """``{model, layers, hidden}`` of a run: the model from its manifest, the stored layer ids
    and hidden size from its store (absent without one). Probes transfer only between runs of
    equal shape."""
    man = run.manifest()
    out = {"model": man.get("model")}
    if run.has_activations():
        from hallulog.storage import open_store

        reader = open_store(run.consolidated)
        try:
            out.update(layers=[int(x) for x in reader.layer_ids], hidden=int(reader.hidden_size))
        finally:
            reader.close()
    return out


def check_compatible(train: Run, test: Run) -> None:
    """Raise ``EvaluationInputError`` (one line) unless both runs share model and layer shapes."""
    a, b = run_shape(train), run_shape(test)
    for key, what in (("model", "model"), ("layers", "stored layers"), ("hidden", "hidden size")):
        if a.get(key) != b.get(key):
            raise EvaluationInputError(
                f"--train-root {train.root} and --artifact-root {test.root} differ in {what}: "
                f"{a.get(key)} vs {b.get(key)}; probes transfer only between runs of one model "
                "with the same stored layers"
            )


def transfer_probes(
    train: Run, reader, store_idx, rows, labels, probe_names, *, seed: int, folds: int
) -> dict[str, dict]:
    from hallulog.storage import open_store

    feats = collect(train, {"se_discrete_exact"})
    ya, scores_a, rows_a = feats.arrays()
    if len(np.unique(ya)) < 2:
        raise EvaluationInputError(
            f"--train-root {train.root}: the probes need both labels among its prompts"
        )
    reader_a = open_store(train.consolidated)
    try:
        idx_a = np.array([store_index(reader_a, k) for k in feats.activation_keys], np.int64)
        split_a = make_split(feats.prompt_ids, ya, seed=seed, k=folds)
        return run_transfer(
            {
                "reader": reader_a,
                "store_idx": idx_a,
                "rows": rows_a,
                "labels": ya,
                "se": scores_a.get("se_discrete_exact"),
                "split": split_a,
            },
            {"reader": reader, "store_idx": store_idx, "rows": rows, "labels": labels},
            probe_names,
        )
    finally:
        reader_a.close()


@dataclass
class ProbeCell:
    """One run's labelled prompts as the probes read them: labels, the stored row of each kind,
    the store index of each primary answer, the SEP target (``se_discrete_exact``) and the k-fold
    split that chooses the layers when the run trains. Holds no open store (a reader's key index
    is a dict of every activation key): :meth:`reader` opens one for a read."""

    name: str
    root: Path
    labels: np.ndarray
    rows: dict[str, np.ndarray]
    store_idx: np.ndarray
    se: np.ndarray | None
    split: Split

    def reader(self):
        """The run's store, open (close it: ``with closing(cell.reader()) as r``)."""
        from hallulog.storage import open_store

        return open_store(layout.consolidated_dir(self.root))


def open_probe_cell(
    name: str,
    root: Path | str,
    *,
    seed: int = 0,
    folds: int = 5,
    row_kinds: set[str] | None = None,
    with_se: bool = True,
) -> ProbeCell:
    """Read a run's exports once (labels, rows, semantic entropy) and its store's key index;
    ``row_kinds`` / ``with_se``: keep only the rows (and the SEP target) the probes read."""
    from hallulog.storage import open_store

    run = Run(root)
    feats = collect(run, {"se_discrete_exact"} if with_se else set())
    labels, scores, rows = feats.arrays()
    with closing(open_store(run.consolidated)) as reader:
        idx = np.array([store_index(reader, k) for k in feats.activation_keys], np.int64)
    split = make_split(feats.prompt_ids, labels, seed=seed, k=folds)
    del feats
    rows = {k: v.astype(np.int32) for k, v in rows.items() if row_kinds is None or k in row_kinds}
    return ProbeCell(
        name, run.root, labels.astype(np.int8), rows, idx, scores.get("se_discrete_exact"), split
    )


def _target(cell: ProbeCell, spec, mask: np.ndarray) -> np.ndarray:
    if spec.target == "se":
        return (cell.se[mask] > binarize_threshold(cell.se[mask])).astype(int)
    return cell.labels[mask]


def _usable(cell: ProbeCell, spec, x: np.ndarray) -> np.ndarray | None:
    """The training prompts a probe can use (finite rows, and a SEP target), None when none."""
    ok = np.isfinite(x).all(1)
    if spec.target == "se":
        if cell.se is None:
            return None
        ok &= np.isfinite(cell.se)
    return ok


def _select_layers(
    train: ProbeCell, reader, probes: list[str], batch: int
) -> dict[str, int | None]:
    """The stored layer (index) of each probe: the best pooled out-of-fold AUROC on ``train``."""
    specs = [PROBES[p] for p in probes]
    needed = {s.row: train.rows[s.row] for s in specs}
    L, n = reader.num_layers, len(train.labels)
    oof = {s.name: np.full((L, n), np.nan) for s in specs}
    upper = set(upper_layers(L))
    for layer in range(L):
        feats = fill_layer(reader, layer, train.store_idx, needed, batch)
        for s in specs:
            if s.layers == "upper" and layer not in upper:
                continue
            x = feats[s.row]
            ok = _usable(train, s, x)
            if ok is None:
                continue
            for tr, te in train.split.folds():
                tr, te = tr & ok, te & ok
                if te.any() and tr.any():
                    oof[s.name][layer, te] = fit_probe(s.kind, x[tr], _target(train, s, tr))(x[te])
        del feats
    best: dict[str, int | None] = {}
    y = train.labels
    for s in specs:
        sel = [auroc(y[np.isfinite(sc)], sc[np.isfinite(sc)]) for sc in oof[s.name]]
        best[s.name] = int(np.nanargmax(sel)) if np.isfinite(sel).any() else None
    return best


def transfer_scores(
    train: ProbeCell, tests: list[ProbeCell], probes: list[str], *, batch: int = 256
) -> Iterator[tuple[str, str, np.ndarray, int | None]]:
    """``(test cell, probe, scores of its labelled prompts, layer id)`` for every test cell and
    probe: each probe fitted on every labelled prompt of ``train`` at the layer its k-fold
    out-of-fold AUROC there chooses (``evaluate --train-root``'s protocol and numbers).

    Memory: one layer of ``train``'s rows and one of a test cell's at a time (as ``evaluate``);
    ``train``'s store is read whole once, every test store at the chosen layers only.
    """
    import sklearn.linear_model  # noqa: F401  (load BLAS first: threadpoolctl caps loaded libraries)
    from threadpoolctl import threadpool_limits

    with closing(train.reader()) as reader_a:
        with threadpool_limits(limits=1):
            best = _select_layers(train, reader_a, probes, batch)
        for p in probes:
            if best[p] is None:
                for test in tests:
                    yield test.name, p, np.full(len(test.labels), np.nan), None
        for layer in sorted({b for b in best.values() if b is not None}):
            specs = [PROBES[p] for p in probes if best[p] == layer]
            rows = {s.row for s in specs}
            fa = fill_layer(
                reader_a, layer, train.store_idx, {r: train.rows[r] for r in rows}, batch
            )
            fitted = {}
            with threadpool_limits(limits=1):
                for s in specs:
                    ok = _usable(train, s, fa[s.row])
                    fitted[s.name] = fit_probe(s.kind, fa[s.row][ok], _target(train, s, ok))
            del fa
            layer_id = int(reader_a.layer_ids[layer])
            for test in tests:
                with closing(test.reader()) as reader_b:
                    fb = fill_layer(
                        reader_b, layer, test.store_idx, {r: test.rows[r] for r in rows}, batch
                    )
                for s in specs:
                    x = fb[s.row]
                    ok = np.isfinite(x).all(1)
                    scores = np.full(len(test.labels), np.nan)
                    if ok.any():
                        with threadpool_limits(limits=1):
                            scores[ok] = fitted[s.name](x[ok])
                    yield test.name, s.name, scores, layer_id
                del fb
