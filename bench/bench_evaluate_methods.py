"""Every detector against the seed-003 set on one run: methods scored, wall and CPU time.

Runs ``python -m orchestrator evaluate`` twice on the same run in this process's session:
first with the 18 seed-003 methods only (the baseline: what evaluate scored before the
LM-Polygraph/TruthTorchLM methods and the metrics beyond AUROC), then with every method
available; prints both and their ratio. CPU time (user + system of the child processes, the
embedding process included) is the figure to compare on a shared machine; wall time depends on
the load.

    python bench/bench_evaluate_methods.py --artifact-root artifacts/run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SEED_003 = [
    "logprob_min",
    "logprob_mean",
    "logprob_sum",
    "logprob_last",
    "perplexity",
    "selfcheck_unigram",
    "selfcheck_unigram_max",
    "selfcheck_embedding",
    "se_discrete_exact",
    "se_weighted_exact",
    "se_discrete_embedding",
    "se_weighted_embedding",
    "semantic_energy_exact",
    "semantic_energy_embedding",
    "got_logistic_last",
    "got_massmean_last",
    "sep_tbg",
    "sep_slt",
    "lkm_exact_answer",
]


def _evaluate(root: Path, out: Path, methods: list[str] | None, n_boot: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "evaluate",
        "--artifact-root",
        str(root),
        "--out",
        str(out),
        "--no-plots",
        "--bootstrap",
        str(n_boot),
    ]
    if methods:
        cmd += ["--methods", *methods]
    before = os.times()
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    wall = time.monotonic() - t0
    after = os.times()
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    report = json.loads((out / "report.json").read_text())
    return {
        "methods": len(report["methods"]),
        "wall_s": round(wall, 1),
        "cpu_s": round(
            (after.children_user - before.children_user)
            + (after.children_system - before.children_system),
            1,
        ),
        "metrics_per_method": len(next(iter(report["methods"].values())).get("metrics") or {}) or 1,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact-root", type=Path, required=True)
    ap.add_argument("--bootstrap", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_methods_") as tmp:
        base = _evaluate(args.artifact_root, Path(tmp) / "base", SEED_003, args.bootstrap)
        full = _evaluate(args.artifact_root, Path(tmp) / "full", None, args.bootstrap)
    load = os.getloadavg()[0]
    print(
        json.dumps(
            {
                "baseline_seed003": base,
                "all_methods": full,
                "methods_ratio": round(full["methods"] / base["methods"], 2),
                "cpu_ratio": round(full["cpu_s"] / max(base["cpu_s"], 1e-9), 2),
                "wall_ratio": round(full["wall_s"] / max(base["wall_s"], 1e-9), 2),
                "cores": os.cpu_count(),
                "load_avg_1m": round(load, 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
