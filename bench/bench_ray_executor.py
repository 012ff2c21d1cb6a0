"""``--executor ray`` against the local executor on the same prompts, measured in the same run,
and what a node loss costs.

Starts a local Ray cluster (``ray.cluster_utils``: a head without CPUs for the driver and
``--nodes`` nodes of ``--cpus-per-node`` CPUs), then runs the same job three times with the real
embedded server: local executor (one server, ``--nodes`` workers), Ray (one actor + server per
node), Ray with one node removed after the first commit. Prints generations/s of each over the
generation phase (first request → last commit, server start-up excluded) and over the whole
command, their ratio to the local run, and the groups the node loss made redo.

    python bench/bench_ray_executor.py --limit 8 --k-samples 1 --max-tokens 8 --nodes 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rows(path: Path) -> list[dict]:
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    )


def _committed(root: Path) -> int:
    return sum(len(_rows(w / "prompt_index.jsonl")) for w in root.glob("worker_*"))


def _gen_phase(root: Path) -> tuple[int, float]:
    gens = _rows(root / "consolidated" / "generations.jsonl")
    prompts = _rows(root / "consolidated" / "prompt_index.jsonl")
    first = min(datetime.fromisoformat(g["request_params"]["timestamp"]) for g in gens)
    last = max(datetime.fromisoformat(p["completed_at"]) for p in prompts)
    return len(gens), (last - first).total_seconds()


def run(
    root: Path,
    args: argparse.Namespace,
    extra: list[str],
    cluster=None,
    remove_after_first_commit: bool = False,
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--artifact-root",
        str(root),
        "--progress",
        "false",
        "--limit",
        str(args.limit),
        "--k-samples",
        str(args.k_samples),
        "--max-tokens",
        str(args.max_tokens),
        "--storage-format",
        "npy",
        "--groups-in-flight",
        str(args.groups_in_flight),
        *extra,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    removed = False
    while proc.poll() is None:
        if remove_after_first_commit and not removed and _committed(root):
            cluster.remove_node(cluster.bench_nodes[-1])
            removed = True
        time.sleep(0.5)
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out[-3000:]}")
    wall = time.monotonic() - started
    gens, phase = _gen_phase(root)
    manifest = json.loads((root / "run_manifest.json").read_text())
    return {
        "generations": gens,
        "gen_phase_s": phase,
        "wall_s": wall,
        "gen_per_s": gens / phase if phase > 0 else float("nan"),
        "gen_per_s_wall": gens / wall,
        "executor": manifest.get("executor"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--k-samples", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--cpus-per-node", type=int, default=1)
    p.add_argument("--groups-in-flight", type=int, default=2)
    args = p.parse_args()

    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    cluster.bench_nodes = [cluster.add_node(num_cpus=args.cpus_per_node) for _ in range(args.nodes)]
    cluster.wait_for_nodes()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
            tmp = Path(tmp)
            local = run(tmp / "local", args, ["--num-workers", str(args.nodes)])
            ray_args = [
                "--executor",
                "ray",
                "--ray-address",
                cluster.address,
                "--ray-actors",
                str(args.nodes),
                "--ray-cpus-per-actor",
                str(args.cpus_per_node),
            ]
            on_ray = run(tmp / "ray", args, ray_args)
            lossy = run(
                tmp / "ray-loss", args, ray_args, cluster=cluster, remove_after_first_commit=True
            )
    finally:
        cluster.shutdown()
    print(
        f"{args.limit} prompts x {args.k_samples + 1} generations, {args.max_tokens} tokens, "
        f"{args.nodes} node(s)"
    )
    for name, r in (("local", local), ("ray", on_ray), ("ray, node lost", lossy)):
        print(
            f"  {name:15s} {r['gen_per_s']:7.2f} gen/s generation phase "
            f"({r['gen_per_s'] / local['gen_per_s']:.2f}x local), "
            f"{r['gen_per_s_wall']:6.2f} gen/s whole command "
            f"({r['gen_per_s_wall'] / local['gen_per_s_wall']:.2f}x), wall {r['wall_s']:.0f} s"
        )
    ex = lossy["executor"] or {}
    print(
        f"  node loss: {ex.get('slots_lost')} slot(s) lost, {ex.get('groups_redone')} group(s) "
        f"redone, {ex.get('recovered_committed')} found committed; wall "
        f"+{lossy['wall_s'] - on_ray['wall_s']:.0f} s vs the ray run without loss"
    )


if __name__ == "__main__":
    main()
