"""``orchestrator evaluate``'s report against an independent implementation from the docs.

Reads a finished run's exports with tests/evaluation/independent.py (written from
docs/evaluation.md alone, nothing imported from the evaluate package), scores every text method
with scikit-learn's AUROC and prints it next to ``evaluation/report.json``'s AUROC and bootstrap
interval; exits 1 when a figure falls outside the report's interval.

    python -m orchestrator evaluate --artifact-root R
    python bench/bench_evaluate_independent.py --artifact-root R
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.evaluation.independent import independent_aurocs, independent_eigenscore  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact-root", type=Path, required=True)
    ap.add_argument("--report", type=Path, help="Default: ARTIFACT_ROOT/evaluation/report.json.")
    args = ap.parse_args()
    report = json.loads(
        (args.report or args.artifact_root / "evaluation" / "report.json").read_text()
    )["methods"]
    outside = 0
    print("| method | independent | ours [95% CI] | inside |\n|---|---|---|---|")
    aurocs = independent_aurocs(args.artifact_root)
    if "eigenscore" in report:
        from sklearn.metrics import roc_auc_score

        ids, es = independent_eigenscore(args.artifact_root)
        labels = {}
        path = args.artifact_root / "consolidated" / "exports" / "logprob_inputs.jsonl"
        for line in path.read_text().splitlines():
            row = json.loads(line)
            labels[row["prompt_id"]] = row["label"]
        aurocs["eigenscore"] = float(roc_auc_score([labels[p] for p in ids], es))
    for m, v in aurocs.items():
        if m not in report:
            print(f"| {m} | {v:.3f} | (not in the report) | |")
            continue
        a, (lo, hi) = report[m]["auroc"], report[m]["ci95"]
        inside = lo <= v <= hi
        outside += not inside
        print(f"| {m} | {v:.3f} | {a:.3f} [{lo:.3f}, {hi:.3f}] | {'yes' if inside else 'NO'} |")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
