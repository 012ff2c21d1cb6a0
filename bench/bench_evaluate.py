"""``orchestrator evaluate`` on a large synthetic run: wall time and peak memory.

Builds a run of N prompts x (K+1) generations with the real packed writer, real JSONL and the
real exports (tests/evaluation/synthetic.py: 4 layers, hidden 16, 4 response rows), then runs
``python -m orchestrator evaluate`` in a subprocess and reports its wall time and peak RSS next
to the store's and the exports' sizes (the baseline: what loading them whole would take).

    python bench/bench_evaluate.py --prompts 16667 --k-samples 5     # 10^5 generations
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.evaluation.synthetic import make_run  # noqa: E402


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16667)
    ap.add_argument("--k-samples", type=int, default=5)
    ap.add_argument("--dir", type=Path, help="Build here (kept) instead of a temp dir.")
    ap.add_argument("--no-embeddings", action="store_true")
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench_evaluate_"))
    root = base / "run"
    t0 = time.monotonic()
    if not (root / "consolidated" / "exports").is_dir():
        make_run(root, n=args.prompts, k=args.k_samples)
    built = time.monotonic() - t0
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "evaluate",
        "--artifact-root",
        str(root),
        "--bootstrap",
        "200",
    ] + (["--no-embeddings"] if args.no_embeddings else [])
    t1 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    wall = time.monotonic() - t1
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    report = json.loads((root / "evaluation" / "report.json").read_text())
    gens = args.prompts * (args.k_samples + 1)
    print(
        json.dumps(
            {
                "generations": gens,
                "prompts": args.prompts,
                "build_s": round(built, 1),
                "evaluate_wall_s": round(wall, 1),
                "evaluate_peak_rss_mib": round(peak),
                "store_mib": round(_size(root / "consolidated" / "activations") / 2**20),
                "exports_mib": round(_size(root / "consolidated" / "exports") / 2**20),
                "protocol": report["protocol"],
                "timings_s": report["timings_s"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
