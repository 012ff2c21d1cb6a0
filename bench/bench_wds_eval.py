"""Seed 002's evaluation: Zarr (seed 000 store) vs packed vs WebDataset Option A streaming.

    python bench/bench_wds_eval.py [--samples 160] [--layers 32] [--hidden 1024] [--dir /tmp/hallulog_wds_eval]

One data set (seeded: prompt lengths U[16, 64], response lengths U[8, 64] = seed 002's R_max,
float16, L layers x H hidden) is written once as a packed store, converted to zarr with
``convert_store`` and exported to WDS with ``export_wds``; then each format is read with the
training pattern (every sample once in random order, 2 random layers, all tokens) through its
Dataset (``ActivationPairsDataset`` for zarr/packed, ``WdsPairsDataset`` for WDS), single
process. Reported per format, page cache warm and cold (``posix_fadvise(DONTNEED)`` on every
file of the store before the pass):

- samples/s, and the ratio to zarr (seed 002's baseline) measured in the same run;
- read latency p50 / p95 per item (for WDS: time to get the next item off the stream);
- file opens per 1,000 samples, counted with a ``sys.addaudithook`` on the ``open`` event
  (``open``/``io.open``/``os.open``), construction excluded — the network-filesystem cost seed
  002 is about; and bytes read through syscalls per sample (``/proc/self/io`` rchar; memmaps
  don't count).

Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore", message=".*worker processes in total.*")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hallulog.exports.wds import export_wds  # noqa: E402
from hallulog.exports.wds_dataset import WdsPairsDataset  # noqa: E402
from hallulog.storage import (  # noqa: E402
    ActivationPairsDataset,
    SampleMeta,
    convert_store,
    open_store,
    open_writer,
)

OPENS = [0]


def _audit(event, args):
    if event == "open":
        OPENS[0] += 1


sys.addaudithook(_audit)


def rchar() -> int:
    with open("/proc/self/io") as f:  # counted as one open; subtracted below
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def evict(path: str) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def write_packed(root, n, L, H, seed=0):
    rng = np.random.default_rng(seed)
    plen, rlen = rng.integers(16, 65, n), rng.integers(8, 65, n)
    buf = rng.standard_normal(L * 128 * H, dtype=np.float32).astype(np.float16)
    w = open_writer("packed", root, layer_ids=list(range(L)), hidden_size=H)
    for i in range(n):
        t = int(plen[i] + rlen[i])
        acts = buf[: L * t * H].reshape(L, t, H)
        w.write(f"{i:016x}_0", acts, SampleMeta(int(plen[i]), int(rlen[i]), i % 2))
    w.close()
    return int(((plen + rlen) * L * H * 2).sum())


def run_pass(name, make_iter, n, cold_path=None):
    if cold_path:
        evict(cold_path)
    it = make_iter()  # construction: manifests, index arrays (excluded from the counts)
    opens0, io0 = OPENS[0], rchar()
    lat = []
    t0 = time.perf_counter()
    last = t0
    count = 0
    for item in it:
        now = time.perf_counter()
        lat.append(now - last)
        last = now
        count += 1
        assert item["acts"].shape[0] == 2
    dt = time.perf_counter() - t0
    opens = OPENS[0] - opens0 - 1  # the rchar() read below
    io1 = rchar()
    assert count == n, (name, count, n)
    lat_ms = np.array(lat) * 1e3
    return {
        "samples_s": count / dt,
        "p50_ms": float(np.percentile(lat_ms, 50)),
        "p95_ms": float(np.percentile(lat_ms, 95)),
        "opens_per_1k": 1000 * opens / count,
        "kb_read_per_sample": (io1 - io0) / count / 1024,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=160)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--shard-mb", type=int, default=256)
    ap.add_argument("--buffer", type=int, default=64)
    ap.add_argument("--dir", default="/tmp/hallulog_wds_eval")
    a = ap.parse_args()
    if os.path.exists(a.dir):
        shutil.rmtree(a.dir)
    os.makedirs(a.dir)
    n, L, H = a.samples, a.layers, a.hidden
    t = time.perf_counter()
    nbytes = write_packed(os.path.join(a.dir, "packed"), n, L, H)
    t_packed = time.perf_counter() - t
    t = time.perf_counter()
    convert_store(os.path.join(a.dir, "packed"), os.path.join(a.dir, "zarr"), "zarr")
    t_zarr = time.perf_counter() - t
    t = time.perf_counter()
    m = export_wds(
        os.path.join(a.dir, "packed"), os.path.join(a.dir, "wds"), shard_bytes=a.shard_mb << 20
    )
    t_wds = time.perf_counter() - t
    print(
        f"data: {n} samples, L={L}, H={H}, float16, prompt U[16,64] + response U[8,64] tokens, "
        f"{nbytes / 1e9:.2f} GB per format; WDS {len(m['shards'])} shards of <= {a.shard_mb} MiB, "
        f"shuffle buffer {a.buffer}"
    )
    print(f"write: packed {t_packed:.1f} s, packed->zarr {t_zarr:.1f} s, packed->wds {t_wds:.1f} s")

    zarr_dir, packed_dir = os.path.join(a.dir, "zarr"), os.path.join(a.dir, "packed")
    wds_dir = os.path.join(a.dir, "wds")
    order = np.random.default_rng(1).permutation(n)

    def pairs(path):
        def make():
            ds = ActivationPairsDataset(open_store(path), seed=0)
            return (ds[int(i)] for i in order)

        return make

    def stream():
        ds = WdsPairsDataset(wds_dir, seed=0, shuffle_buffer=a.buffer)
        return iter(ds)

    cases = [
        ("zarr", pairs(zarr_dir), zarr_dir),
        ("packed", pairs(packed_dir), packed_dir),
        ("wds", stream, wds_dir),
    ]
    rows = {}
    for cache in ("warm", "cold"):
        for name, make, path in cases:
            if cache == "warm":
                run_pass(name, make, n)  # warm-up pass fills the page cache
            rows[(name, cache)] = run_pass(
                name, make, n, cold_path=path if cache == "cold" else None
            )
    print()
    print(
        "| format | cache | samples/s | vs zarr | p50 ms | p95 ms | opens / 1k samples | KiB read / sample |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for cache in ("warm", "cold"):
        base = rows[("zarr", cache)]["samples_s"]
        for name, _, _ in cases:
            r = rows[(name, cache)]
            print(
                f"| {name} | {cache} | {r['samples_s']:.0f} | {r['samples_s'] / base:.2f}x | {r['p50_ms']:.2f} | "
                f"{r['p95_ms']:.2f} | {r['opens_per_1k']:.0f} | {r['kb_read_per_sample']:.0f} |"
            )
    print(
        f"\n(useful bytes per sample: 2 layers x mean T x H x 2 = "
        f"{2 * nbytes / n / L / 1024:.0f} KiB; a whole record: {nbytes / n / 1024:.0f} KiB)"
    )


if __name__ == "__main__":
    main()
