"""Transfer: probes fitted on one run (``--train-root``) and scored on another (``--artifact-root``).

The two runs must come from the same model and store the same layers with the same hidden size
(checked first: one line naming both roots on a mismatch). The probe's layer is chosen on the
training run alone (its k-fold out-of-fold AUROC); the SEP target on the training run is its
``se_discrete_exact`` (no embedding model is loaded for the training run).
"""

from __future__ import annotations

import numpy as np
from hallulog.evaluation.data import EvaluationInputError, Run
from hallulog.evaluation.features import collect
from hallulog.evaluation.probes import run_transfer, store_index
from hallulog.evaluation.protocol import make_split

__all__ = ["check_compatible", "transfer_probes"]


def _shape(run: Run) -> dict:
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
    a, b = _shape(train), _shape(test)
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
