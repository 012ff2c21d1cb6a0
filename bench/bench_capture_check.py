"""The worker's capture check against the cast it follows (same process, same captures).

    python bench/bench_capture_check.py [--rows 16,64,300] [--layers 31] [--hidden 576]
                                        [--store-dtype float16,float32,bfloat16] [--rounds 7]

Per sample, the thread CPU time of ``select_rows`` (the worker's slice and cast of a float32
capture into the store dtype: the baseline) and of ``check_captured`` on its output (the check
a worker runs before it stores: ``workers/capture_check.py``), on clean captures (random rows:
the check's usual path, one pass over the bits plus a look at each row's first 8 bytes). The
two alternate sample by sample; each round times every sample of every shape; the figures are
the rounds' medians. Reports the check's CPU as a share of the cast's, and of the default job's
CPU per generation (2 cores × 72 s / 1,446 generations = 100 ms, README). Shapes: ``--rows``
stored rows (the default job's response rows are 1..64; ``full`` stores prompt + response) ×
``--layers`` × ``--hidden`` (SmolLM2-135M: 31 layer ids × 576). The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hallulog.workers.capture import select_rows  # noqa: E402
from hallulog.workers.capture_check import check_captured  # noqa: E402

#: the default job's CPU per generation: 2 cores x ~72 s for 241 x 6 generations (README)
DEFAULT_JOB_CPU_MS = 2 * 72_000 / 1446


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="16,64,300")
    ap.add_argument("--layers", type=int, default=31)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--store-dtype", default="float16,float32,bfloat16")
    ap.add_argument("--samples", type=int, default=20, help="captures per shape")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    layer_ids = tuple(range(args.layers))
    prompt = 40
    cases = []
    for rows in (int(r) for r in args.rows.split(",")):
        for dtype in args.store_dtype.split(","):
            captures = []
            for _ in range(args.samples):
                n = prompt + rows - 1  # generation capture: prompt + response - 1 positions
                hidden = rng.standard_normal((n, args.layers, args.hidden)).astype(np.float32)
                ids = rng.integers(0, 49152, n).tolist()
                captures.append((hidden, ids))
            cases.append((rows, dtype, captures))
    for rows, dtype, captures in cases:  # warm-up: torch's import, scratch buffers
        _time_case(rows, dtype, captures[:2], layer_ids, prompt)
    per = {(r, d): ([], []) for r, d, _ in cases}
    for _ in range(args.rounds):
        for rows, dtype, captures in cases:
            cast, check = _time_case(rows, dtype, captures, layer_ids, prompt)
            per[(rows, dtype)][0].append(cast)
            per[(rows, dtype)][1].append(check)
    print(
        f"{args.layers} layers x {args.hidden}, float32 captures, {args.samples} samples a "
        f"shape, {args.rounds} rounds, cpus={os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
    )
    out = {}
    for (rows, dtype), (cast, check) in per.items():
        c, k = statistics.median(cast), statistics.median(check)
        out[f"{rows}x{dtype}"] = {
            "cast_ms": round(c, 4),
            "check_ms": round(k, 4),
            "check_over_cast": round(k / c, 3),
            "check_share_of_default_job_cpu": round(k / DEFAULT_JOB_CPU_MS, 5),
        }
        print(
            f"  {rows:4d} rows -> {dtype:9s}: cast {c:7.3f} ms, check {k:7.3f} ms a sample "
            f"(x{k / c:.2f} of the cast; {100 * k / DEFAULT_JOB_CPU_MS:.3f} % of the default "
            f"job's CPU per generation)"
        )
    print(
        json.dumps(
            {
                "bench": "capture_check",
                "layers": args.layers,
                "hidden": args.hidden,
                "rounds": args.rounds,
                "per_shape": out,
            }
        )
    )


def _time_case(rows, dtype, captures, layer_ids, prompt) -> tuple[float, float]:
    """Mean thread CPU ms per sample of the cast and of the check over ``captures``."""
    cast = check = 0.0
    for hidden, ids in captures:
        t0 = time.thread_time()
        stored = select_rows(
            hidden,
            prompt_len=prompt,
            response_len=rows,
            sequence_mode="response",
            layer_index=None,
            dtype=dtype,
        )
        t1 = time.thread_time()
        check_captured(stored, token_ids=ids, layer_ids=layer_ids)
        t2 = time.thread_time()
        cast, check = cast + (t1 - t0), check + (t2 - t1)
    return 1e3 * cast / len(captures), 1e3 * check / len(captures)


if __name__ == "__main__":
    main()
