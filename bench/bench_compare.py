"""``hallulog compare`` over a study of many large cells against ``evaluate`` on one: peak memory.

Builds a study root of ``--cells`` cells of ``--prompts`` prompts each: every cell a real
``python -m orchestrator run`` against an instant backend (bench/instant_run.py, ``--vary-rows``:
captures differ between prompts; light profile, 2 layer ids x hidden 64, K=``--k``, each cell
its own ``--seed``; all cells ask the same prompts, the worst case of the paired bootstrap: every
pair of cells shares them), then ``hallulog evaluate --no-embeddings --no-plots`` on every cell
(real scores files). Then, in this run: ``evaluate --no-embeddings`` once more on cell 0 (into a
scratch directory, its plots included: the baseline; the sentence-embedding model would only
add its own child process, ~0.6-0.9 GiB) and ``hallulog compare STUDY`` (the table and the
paired bootstrap over every method, the transfer matrices of ``--transfer-methods``, the
heatmaps), each in its own process under a wrapper that reports the process tree's peak RSS
(``ru_maxrss`` of its waited children).

Prints both peaks, their ratio (compare / evaluate), the wall times and the sizes of compare's
tables; the last line is one JSON object. ``--dir`` keeps the built study for a rerun (built
cells and their evaluations are reused; the two measurements always run).

    python -m bench.bench_compare                              # 20 cells x 10^4 prompts
    python -m bench.bench_compare --cells 3 --prompts 500      # a quick look
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

from hallulog.study import make_cell, write_study

from bench.instant_run import REPO, InstantFleet, write_task

#: runs ``argv`` and prints its process tree's peak RSS (KiB) on stderr's last line
_WRAPPER = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
    "file=sys.stderr); sys.exit(rc)"
)


def measured(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(peak RSS MiB, wall s, stdout) of ``cmd`` and everything it waited for."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *cmd], capture_output=True, text=True, env=env, cwd=REPO
    )
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    kib = int(proc.stderr.strip().splitlines()[-1].split()[1])
    return kib / 1024.0, wall, proc.stdout


def hallulog(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


def build(
    study: Path, work: Path, cells: int, prompts: int, k: int, env: dict
) -> tuple[list, float]:
    """The study's cells, run where not yet consolidated; returns (cells, seconds)."""
    task = work / "questions.jsonl"
    if not task.is_file():
        write_task(task, prompts)
    made, t0 = [], time.monotonic()
    with InstantFleet(work, servers=1, vary_rows=True) as fleet:
        for i in range(cells):
            cell = make_cell({"model": fleet.model.name, "seed": i})
            root = cell.path(study)
            if not (root / "consolidated" / "exports").is_dir():
                cmd = fleet.command(
                    root, task, k=k, extra=["--seed", str(i), "--log-level", "ERROR"]
                )
                proc = subprocess.run(cmd, capture_output=True, text=True, env=fleet.env, cwd=REPO)
                if proc.returncode != 0:
                    sys.exit(f"cell {cell.name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
            manifest = json.loads((root / "run_manifest.json").read_text())
            made.append(make_cell(cell.values, fingerprint=manifest.get("config_fingerprint")))
            print(f"cell {i + 1}/{cells} run", file=sys.stderr)
    return made, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=1, help="samples per prompt (default 1)")
    ap.add_argument(
        "--transfer-methods",
        nargs="+",
        default=["got_logistic_last", "got_massmean_last"],
        help="probes of the transfer matrices (default: the logistic and mass-mean probes)",
    )
    ap.add_argument("--dir", type=Path, help="Build here (kept, reused) instead of a temp dir.")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench_compare_"))
    work.mkdir(parents=True, exist_ok=True)
    study = work / "study"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cells, built_s = build(study, work, args.cells, args.prompts, args.k, env)
    write_study(study, cells)
    t0 = time.monotonic()
    evaluate_peaks = []
    for i, cell in enumerate(cells):
        root = cell.path(study)
        if not (root / "evaluation" / "scores.parquet").is_file():
            peak, _, _ = measured(
                hallulog("evaluate", "--artifact-root", str(root), "--no-embeddings", "--no-plots"),
                env,
            )
            evaluate_peaks.append(peak)
        print(f"cell {i + 1}/{len(cells)} evaluated", file=sys.stderr)
    evaluated_s = time.monotonic() - t0
    # the baseline, in this run: evaluate on one cell
    scratch = Path(tempfile.mkdtemp(prefix="bench_compare_eval_", dir=work))
    root0 = cells[0].path(study)
    eval_peak, eval_wall, _ = measured(
        hallulog(
            "evaluate",
            "--artifact-root",
            str(root0),
            "--out",
            str(scratch),
            "--no-embeddings",
        ),
        env,
    )
    cmp_peak, cmp_wall, out = measured(
        hallulog("compare", str(study), "--transfer-methods", *args.transfer_methods), env
    )
    import pyarrow.parquet as pq

    rows = {
        name: pq.read_metadata(study / "compare" / f"{name}.parquet").num_rows
        for name in ("table", "paired", "transfer")
    }
    report = (study / "compare" / "report.md").read_text()
    per_pair = next((ln for ln in report.splitlines() if "ordered pairs" in ln), "")
    result = {
        "cells": len(cells),
        "prompts_per_cell": args.prompts,
        "k": args.k,
        "evaluate_peak_rss_mib": round(eval_peak, 1),
        "compare_peak_rss_mib": round(cmp_peak, 1),
        "compare_over_evaluate": round(cmp_peak / eval_peak, 3),
        "evaluate_wall_s": round(eval_wall, 1),
        "compare_wall_s": round(cmp_wall, 1),
        "evaluate_peaks_while_building_mib": [round(p) for p in evaluate_peaks],
        "rows": rows,
        "transfer_methods": args.transfer_methods,
        "transfer": per_pair,
        "build_s": round(built_s, 1),
        "evaluate_all_s": round(evaluated_s, 1),
        "load_average": os.getloadavg(),
        "dir": str(work),
    }
    print(out.strip())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
