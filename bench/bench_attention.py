"""What ``--attention-features`` adds to a run: the default job's traffic on a slice (32
prompts, K = 5, --max-tokens 64 on the embedded server, the real SmolLM2), the same run with
and without the flag (the summaries captured during generation), measured in one invocation,
alternating ``--repeat`` times (the fastest of each kept). ``--post-pass``: instead, the
attention pass after a run without the flag (a fresh process: model load included), the cost a
vLLM run pays.

    python bench/bench_attention.py                 # ratio run with flag / run without
    python bench/bench_attention.py --post-pass     # ratio attention pass / run

Last line: one JSON object (``overhead`` = extra time / run without the flag; target <= 0.15).
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
    parser.add_argument("--repeat", type=int, default=1, help="alternating pairs of runs")
    parser.add_argument("--post-pass", action="store_true", help="the pass after the run instead")
    args = parser.parse_args()
    out = {"bench": "attention", "prompts": args.limit, "k": args.k, "max_tokens": args.max_tokens}
    with tempfile.TemporaryDirectory(prefix="bench-attention-") as tmp:
        if args.post_pass:
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
            extra = passed["seconds"]
            out.update(mode="post_pass", run_s=round(plain, 1), pass_s=round(extra, 1))
            out.update(generations=passed["generations"], tokens=passed["tokens"])
            what = f"attention pass {extra:.1f} s over {passed['generations']} generations"
        else:
            plains, flags = [], []
            for i in range(args.repeat):
                plains.append(_run(Path(tmp) / f"plain{i}", args))
                flags.append(_run(Path(tmp) / f"flag{i}", args, "--attention-features", "true"))
            plain, with_flag = min(plains), min(flags)
            extra = with_flag - plain
            out.update(mode="in_pass", run_s=round(plain, 1), run_with_flag_s=round(with_flag, 1))
            out.update(
                runs_s=[round(x, 1) for x in plains], runs_with_flag_s=[round(x, 1) for x in flags]
            )
            what = f"run with --attention-features {with_flag:.1f} s"
    out.update(overhead=round(extra / plain, 3), load=round(os.getloadavg()[0], 1))
    out["cpus"] = os.cpu_count()
    print(f"run {plain:.1f} s; {what}: +{100 * out['overhead']:.1f} %")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
