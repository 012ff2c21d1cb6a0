"""``--executor ray`` against the local executor on the same prompts, measured in the same run,
and what a node loss costs.

Starts a local Ray cluster (``ray.cluster_utils``: a head without CPUs for the driver and
``--nodes`` nodes of ``--cpus-per-node`` CPUs), then runs the same job three times with the real
embedded server: local executor (one server, ``--nodes`` workers), Ray (one actor + server per
node), Ray with one node removed after the first commit; with ``--bucket`` a fourth: Ray with the
root in a bucket (an S3 server on loopback, moto: ``tests/s3_server.py``) and every node staging
in its own directory, nothing shared but the bucket. Prints generations/s of each over the
generation phase (first request → last commit, server start-up excluded) and over the whole
command, their ratio to the local run, and the groups the node loss made redo.

    python bench/bench_ray_executor.py --limit 8 --k-samples 1 --max-tokens 8 --nodes 2 [--bucket]
"""

from __future__ import annotations

import argparse
import contextlib
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
    url: str | None = None,
    env_extra: dict | None = None,
) -> dict:
    """One run; with ``url`` the root is that bucket prefix and ``root`` the driver's staging."""
    where = [url, "--staging-dir", str(root)] if url else [str(root)]
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--artifact-root",
        *where,
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
        **(env_extra or {}),
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
    p.add_argument(
        "--bucket", action="store_true", help="add a Ray run with the root in a bucket (moto)"
    )
    args = p.parse_args()

    from ray.cluster_utils import Cluster

    with contextlib.ExitStack() as stack:
        s3 = None
        if args.bucket:
            sys.path.insert(0, str(REPO))
            from tests.s3_server import MotoServer

            s3 = stack.enter_context(MotoServer())
            s3.create_bucket("bench")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-ray-")))
        results = _runs(args, Cluster, s3, tmp)
    _report(args, *results)


def _runs(args, Cluster, s3, tmp: Path):
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    cluster.bench_nodes = [
        cluster.add_node(
            num_cpus=args.cpus_per_node,
            # a node's own disk (where its actors stage) and the bucket's endpoint
            env_vars={**s3.env, "HALLULOG_CACHE_DIR": str(tmp / f"node-{i}")} if s3 else None,
        )
        for i in range(args.nodes)
    ]
    cluster.wait_for_nodes()
    bucket = None
    try:
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
        if s3 is not None:  # before the node loss: on every node
            bucket = run(tmp / "ray-bucket", args, ray_args, url="s3://bench/ray", env_extra=s3.env)
        lossy = run(
            tmp / "ray-loss", args, ray_args, cluster=cluster, remove_after_first_commit=True
        )
    finally:
        cluster.shutdown()
    return local, on_ray, lossy, bucket


def _report(args, local, on_ray, lossy, bucket) -> None:
    print(
        f"{args.limit} prompts x {args.k_samples + 1} generations, {args.max_tokens} tokens, "
        f"{args.nodes} node(s)"
    )
    runs = [("local", local), ("ray", on_ray), ("ray, node lost", lossy)]
    for name, r in runs + ([("ray, bucket", bucket)] if bucket else []):
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
    if bucket:
        print(
            f"  bucket: {bucket['gen_per_s'] / on_ray['gen_per_s']:.2f}x the shared-volume ray "
            f"run's generation phase, {bucket['gen_per_s_wall'] / on_ray['gen_per_s_wall']:.2f}x "
            "its whole command"
        )
    print(
        json.dumps(
            {
                "bench": "ray_executor",
                **{name: r for name, r in runs},
                **({"ray_bucket": bucket} if bucket else {}),
            }
        )
    )


if __name__ == "__main__":
    main()
