"""Objects a run into a bucket leaves, and holds at its peak, against the same run uncompacted.

A real run (``python -m orchestrator run --artifact-root s3://…``) of ``--generations``
generations (default 10^5: 20,000 prompts x K+1 = 5) against instant backends
(bench/instant_backend.py, light profile, packed store), into a versioned bucket of a moto
server (its own process, loopback). While it runs, the prefix is listed every ``--sample``
seconds: the peak number of objects (all of them, and the segments'). At the end: the objects
the prefix holds (the finished root's files and the run's own), and, as the baseline measured in
the same run, every distinct key the run ever wrote under ``.hallulog-run/segments/`` (a
versioned bucket keeps a deleted key's version): what the segments would hold uncompacted.
``--checkpoint-interval`` defaults to 1 s (30 s is the run's default) so that each worker's
chain takes well over ``COMPACT_EVERY`` (32) segments: the compaction path is exercised.

    python bench/bench_bucket_objects.py                      # 10^5 generations
    python bench/bench_bucket_objects.py --generations 10000  # quick

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.instant_run import REPO, InstantFleet, write_task  # noqa: E402
from tests.s3_server import MotoServer  # noqa: E402

BUCKET = "objects"
PREFIX = "run"


def _count(client) -> tuple[int, int]:
    """(objects under the prefix, of which segments)."""
    total = segments = 0
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/")
    for page in pages:
        for obj in page.get("Contents", []):
            total += 1
            segments += "/.hallulog-run/segments/" in obj["Key"]
    return total, segments


class _Sampler(threading.Thread):
    def __init__(self, client, every: float) -> None:
        super().__init__(daemon=True)
        self.client, self.every = client, every
        self.peak = self.peak_segments = 0
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                total, segments = _count(self.client)
            except Exception:  # the server busy: the next sample
                continue
            self.samples += 1
            self.peak = max(self.peak, total)
            self.peak_segments = max(self.peak_segments, segments)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--generations", type=int, default=100_000)
    p.add_argument("--k-samples", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--checkpoint-interval", type=float, default=1.0)
    p.add_argument("--sample", type=float, default=2.0, help="seconds between listings")
    args = p.parse_args()
    prompts = args.generations // (args.k_samples + 1)
    with tempfile.TemporaryDirectory() as tmp, MotoServer() as s3:
        tmp = Path(tmp)
        s3.create_bucket(BUCKET, versioned=True)
        client = s3.client()
        task = tmp / "task.jsonl"
        write_task(task, prompts)
        with InstantFleet(tmp / "fleet", servers=args.servers) as fleet:
            env = {
                **fleet.env,
                **s3.env,
                "HOME": str(tmp / "home"),
                "HALLULOG_CACHE_DIR": str(tmp / "cache"),
            }
            cmd = fleet.command(
                f"s3://{BUCKET}/{PREFIX}",
                task,
                k=args.k_samples,
                extra=[
                    "--checkpoint-interval",
                    str(args.checkpoint_interval),
                    "--groups-in-flight",
                    "8",
                    "--spool-root",
                    "/dev/shm" if Path("/dev/shm").is_dir() else str(tmp / "spool"),
                ],
            )
            sampler = _Sampler(client, args.sample)
            sampler.start()
            t0 = time.monotonic()
            done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
            wall = time.monotonic() - t0
            sampler.stop.set()
            sampler.join()
        if done.returncode != 0:
            sys.exit(f"the run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        final, final_segments = _count(client)
        pages = client.get_paginator("list_object_versions").paginate(
            Bucket=BUCKET, Prefix=f"{PREFIX}/.hallulog-run/segments/"
        )
        written = {v["Key"] for page in pages for v in page.get("Versions", [])}
        manifests = sum(k.endswith(".json") for k in written)
    result = {
        "generations": prompts * (args.k_samples + 1),
        "wall_s": round(wall, 1),
        "checkpoint_interval_s": args.checkpoint_interval,
        "segment_manifests_written": manifests,
        "segment_objects_written_uncompacted": len(written),
        "peak_objects": sampler.peak,
        "peak_segment_objects": sampler.peak_segments,
        "final_objects": final,
        "final_segment_objects": final_segments,
        "peak_over_uncompacted": round(sampler.peak_segments / max(1, len(written)), 3),
        "listings": sampler.samples,
    }
    print(
        f"{result['generations']} generations in {wall:.0f} s, checkpoint interval "
        f"{args.checkpoint_interval:g} s: {manifests} segment manifests, {len(written)} segment "
        f"objects written in all (uncompacted: the baseline)"
    )
    print(
        f"peak {sampler.peak} objects under the prefix ({sampler.peak_segments} of segments: "
        f"{result['peak_over_uncompacted']:.3f}x the uncompacted count), final {final} "
        f"({final_segments} of segments)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
