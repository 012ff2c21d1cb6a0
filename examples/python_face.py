"""hallulog from Python: a run's tables, labels and one layer's activations, then evaluate.

    python examples/python_face.py --artifact-root artifacts/run [--layer 15]

Prints the label counts, fits a logistic probe on the last stored row of one layer (5-fold,
out-of-fold AUROC) and scores the logprob baselines with ``evaluate`` (docs/evaluation.md,
"Python").
"""

from __future__ import annotations

import argparse

import numpy as np

import hallulog


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact-root", required=True)
    ap.add_argument("--layer", type=int, help="layer id (default: the middle stored one)")
    args = ap.parse_args()

    run = hallulog.open_run(args.artifact_root)
    prompts = run.prompts()
    labels = run.labels()
    print(
        f"{len(prompts)} prompts, {sum(v == 0 for v in labels.values())} correct / "
        f"{sum(v == 1 for v in labels.values())} hallucinated"
    )
    layers = run.table("activation_index", "arrow").column("layers")[0].as_py()
    layer = args.layer if args.layer is not None else layers[len(layers) // 2]
    ids, x = run.activations(layer, "last", over="prompts")
    y = np.array([labels[p] if labels[p] is not None else -1 for p, _ in ids])
    keep = (y >= 0) & np.isfinite(x).all(1)
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import cross_val_predict

    oof = cross_val_predict(
        LogisticRegression(C=0.05, max_iter=500), x[keep], y[keep], cv=5, method="decision_function"
    )
    print(
        f"layer {layer}: last-row logistic probe, out-of-fold AUROC "
        f"{roc_auc_score(y[keep], oof):.3f} over {keep.sum()} prompts ({x.shape[1]} dims)"
    )
    report = run.evaluate(methods=["logprob"], n_boot=100, embeddings=False, write=False)
    for name, r in report["methods"].items():
        print(f"{name}: AUROC {r['auroc']:.3f}, PRR {r['metrics']['prr']:.3f}")


if __name__ == "__main__":
    main()
