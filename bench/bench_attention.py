"""What ``--attention-features`` adds to a run: the default job's traffic on a slice (32 prompts,
K = 5, --max-tokens 64 on the embedded server, the real SmolLM2), the run's wall time against
the attention pass over its generations (a fresh process: model load included), measured in
one invocation. ``--both``: a second full run with the flag, its wall time against the first.

    python bench/bench_attention.py                 # ratio (run + pass) / run
    python bench/bench_attention.py --limit 8 --both

Last line: one JSON object (``overhead`` = pass / run; target <= 0.15).
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

REPO = Path(__file__).resolve().parents[1]

PASS = """
import json, sys, time
from hallulog.postrun.attention import attention_pass
from hallulog.serving.model_loader import default_model_dir
started = time.monotonic()
r = attention_pass(sys.argv[1], default_model_dir())
print(json.dumps({"seconds": time.monotonic() - started, "generations": r.generations,
                  "tokens": r.tokens}))
"""


def _run(root: Path, args: argparse.Namespace, *extra: str) -> float:
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--artifact-root",
        str(root),
        "--limit",
        str(args.limit),
        "--k-samples",
        str(args.k),
        "--max-tokens",
        str(args.max_tokens),
        "--progress",
        "false",
        *extra,
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"run failed:\n{proc.stderr[-3000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--both", action="store_true", help="also a full run with the flag")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-attention-") as tmp:
        plain = _run(Path(tmp) / "plain", args)
        proc = subprocess.run(
            [sys.executable, "-c", PASS, str(Path(tmp) / "plain")],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            sys.exit(f"attention pass failed:\n{proc.stderr[-3000:]}")
        passed = json.loads(proc.stdout.strip().splitlines()[-1])
        with_flag = (
            _run(Path(tmp) / "flag", args, "--attention-features", "true") if args.both else None
        )
    out = {
        "bench": "attention",
        "prompts": args.limit,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "run_s": round(plain, 1),
        "pass_s": round(passed["seconds"], 1),
        "generations": passed["generations"],
        "tokens": passed["tokens"],
        "overhead": round(passed["seconds"] / plain, 3),
        "run_with_flag_s": None if with_flag is None else round(with_flag, 1),
        "ratio_with_flag": None if with_flag is None else round(with_flag / plain, 3),
        "load": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
    }
    print(
        f"run {plain:.1f} s; attention pass {passed['seconds']:.1f} s over "
        f"{passed['generations']} generations ({passed['tokens']} tokens): "
        f"+{100 * out['overhead']:.1f} %"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
