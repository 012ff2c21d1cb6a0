"""Training reads straight from a bucket: the packed reader against the same S3 server's raw GETs
and against the local-disk reader, all in one run.

    python bench/bench_s3_reads.py [--samples 48] [--layers 8] [--hidden 512] [--batch 16]

A real S3 server (moto in server mode, its own process, loopback) holds a packed store of
``--samples`` samples x ``--layers`` layers x T tokens (uniform in [64, 384], seeded) x
``--hidden``, float16, in shards of ``--shard-mb``. Reported, each the median of ``--repeats``:

1. raw GET MB/s: whole-object GETs of every shard (``--concurrency`` at once) — the most this
   server delivers, no ranges, no planning; and the same bytes the reader fetches, as one
   plain ranged GET per (sample, layer) extent, ``--concurrency`` at once;
2. reader MB/s: batches of ``--batch`` random samples x 2 random layers through
   ``open_store("s3://...").read_pairs_into`` (ranged GETs, coalesced and concurrent) until as
   many bytes as the shards hold have been read; its shares of (1) are the first ratios;
3. seconds per batch, bucket vs the local packed reader on the same store (page cached): the
   second ratio (what a training step pays per batch for reading from the bucket);
4. the same bucket batches with coalescing off (``HALLULOG_READ_GAP_BYTES=0``) and one range in
   flight (``HALLULOG_READ_CONCURRENCY=1``): what the planner buys.

The last line is one JSON object with every figure. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hallulog.remote.client import Bucket  # noqa: E402
from hallulog.remote.sync import scan_tree, upload_tree  # noqa: E402
from hallulog.storage import SampleMeta, open_store, open_writer  # noqa: E402

from tests.s3_server import MotoServer  # noqa: E402


def build_store(root: str, args) -> int:
    w = open_writer(
        "packed",
        root,
        layer_ids=list(range(args.layers)),
        hidden_size=args.hidden,
        shard_bytes=args.shard_mb << 20,
    )
    rng = np.random.default_rng(0)
    for i in range(args.samples):
        t = int(rng.integers(64, 385))
        w.write(
            f"p{i:04d}_0",
            rng.standard_normal((args.layers, t, args.hidden)).astype(np.float16),
            SampleMeta(prompt_len=16, response_len=t - 16),
        )
    w.close()
    return sum(
        os.path.getsize(os.path.join(root, "activations", f))
        for f in os.listdir(os.path.join(root, "activations"))
        if f.endswith(".bin")
    )


def batches(reader, args, total_bytes: int, seed: int):
    """Random (samples, layers) batches until ``total_bytes`` of payload."""
    rng = np.random.default_rng(seed)
    out, got = [], 0
    while got < total_bytes:
        s = np.repeat(rng.choice(len(reader), args.batch, replace=False), 2)
        l = np.concatenate(
            [rng.choice(reader.num_layers, 2, replace=False) for _ in range(args.batch)]
        )
        out.append((s, l))
        got += sum(reader.seq_len(int(i)) for i in s) * reader.hidden_size * 2
    return out, got


def read_batches(reader, plan) -> float:
    t0 = time.perf_counter()
    for s, l in plan:
        outs = [np.empty((reader.seq_len(int(i)), reader.hidden_size), reader.dtype) for i in s]
        reader.read_pairs_into(s, l, outs)
    return time.perf_counter() - t0


def raw_gets(bucket: Bucket, keys, concurrency: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        sizes = list(pool.map(lambda k: len(bucket.get_bytes(k)), keys))
    assert all(sizes)
    return time.perf_counter() - t0


def raw_extent_gets(bucket: Bucket, reader, keys, plan, concurrency: int) -> float:
    """The plan's extents as independent ranged GETs (no planning, no copy into buffers)."""
    jobs = []
    for s, l in plan:
        for i, layer in zip(s, l):
            file_no, off = reader._extent(int(i), int(layer))
            jobs.append((keys[file_no], off, reader.seq_len(int(i)) * reader.hidden_size * 2))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda j: bucket.get_ranges(j[0], [j[1]], [j[2]], coalesce=0), jobs))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--shard-mb", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="hallulog-s3-bench-")
    root = os.path.join(tmp, "worker_0")
    shard_bytes = build_store(root, args)
    figures: dict = {"shard_bytes_total": shard_bytes, "args": vars(args)}
    with MotoServer() as s3:
        os.environ.update(s3.env)
        os.environ["HALLULOG_CACHE_DIR"] = os.path.join(tmp, "cache")
        s3.create_bucket("bench")
        url = "s3://bench/run"
        upload_tree(tmp, Bucket(url), scan_tree(tmp, lambda rel: rel.startswith("cache")))
        local = open_store(root)
        remote = open_store(f"{url}/worker_0")
        shard_keys = [f"worker_0/activations/{s['file']}" for s in remote.manifest["shards"]]
        plan, payload = batches(remote, args, shard_bytes, seed=1)
        read_batches(remote, plan[:2])  # connections and the metadata cache warm
        read_batches(local, plan)  # page cache warm
        bucket = Bucket(url)
        raw = [raw_gets(bucket, shard_keys, args.concurrency) for _ in range(args.repeats)]
        rng_raw = [
            raw_extent_gets(bucket, remote, shard_keys, plan, args.concurrency)
            for _ in range(args.repeats)
        ]
        bkt = [read_batches(remote, plan) for _ in range(args.repeats)]
        loc = [read_batches(local, plan) for _ in range(args.repeats)]
        os.environ["HALLULOG_READ_GAP_BYTES"] = "0"
        os.environ["HALLULOG_READ_CONCURRENCY"] = "1"
        serial = open_store(f"{url}/worker_0")
        ser = [read_batches(serial, plan) for _ in range(args.repeats)]
    raw_mbs = shard_bytes / statistics.median(raw) / 1e6
    bkt_mbs = payload / statistics.median(bkt) / 1e6
    rng_mbs = payload / statistics.median(rng_raw) / 1e6
    n = len(plan)
    figures.update(
        {
            "raw_get_MBps": round(raw_mbs, 1),
            "reader_MBps": round(bkt_mbs, 1),
            "reader_share_of_raw": round(bkt_mbs / raw_mbs, 3),
            "raw_ranged_MBps": round(rng_mbs, 1),
            "reader_share_of_raw_ranged": round(bkt_mbs / rng_mbs, 3),
            "batches": n,
            "batch_MB": round(payload / n / 1e6, 2),
            "bucket_s_per_batch": round(statistics.median(bkt) / n, 4),
            "local_s_per_batch": round(statistics.median(loc) / n, 5),
            "bucket_vs_local_per_batch": round(statistics.median(bkt) / statistics.median(loc), 1),
            "serial_uncoalesced_s_per_batch": round(statistics.median(ser) / n, 4),
            "planner_speedup": round(statistics.median(ser) / statistics.median(bkt), 2),
        }
    )
    print(
        f"store: {args.samples} samples x {args.layers} layers x H={args.hidden}, "
        f"{shard_bytes / 1e6:.1f} MB in {len(shard_keys)} shard objects; "
        f"{n} batches of {args.batch} samples x 2 layers ({figures['batch_MB']} MB each)"
    )
    print(f"raw GET (whole shards, {args.concurrency} at once): {raw_mbs:8.1f} MB/s   1.00x")
    print(f"raw ranged GETs of the same extents:    {rng_mbs:8.1f} MB/s   {rng_mbs / raw_mbs:.2f}x")
    print(
        f"bucket reader (ranged, planned):        {bkt_mbs:8.1f} MB/s   "
        f"{figures['reader_share_of_raw']:.2f}x of whole-object GETs, "
        f"{figures['reader_share_of_raw_ranged']:.2f}x of the same ranged GETs"
    )
    print(
        f"per batch: bucket {figures['bucket_s_per_batch'] * 1e3:.1f} ms, local disk "
        f"{figures['local_s_per_batch'] * 1e3:.2f} ms ({figures['bucket_vs_local_per_batch']}x); "
        f"bucket without coalescing, one range at a time "
        f"{figures['serial_uncoalesced_s_per_batch'] * 1e3:.1f} ms "
        f"(planner {figures['planner_speedup']}x)"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
