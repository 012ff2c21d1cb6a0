"""Activation-store benchmarks. Ratios against baselines measured in the same run.

    python bench/bench_storage.py [--samples 48] [--layers 32] [--hidden 2048] [--dir /tmp/hallulog_bench]

Shapes: L layers x H hidden, float16, token lengths uniform in [16, 256] (seeded). Reports
  1. ingest MB/s of each format / dd-style sequential write (+fdatasync) of the same bytes;
     1 vs 2 writer processes (each its own store, as in the run);
  2. k random (sample, layer) reads: mean / median / p95 latency per format (seed 000 check);
  3. batches of b samples x 2 random layers: bytes/s / memcpy of the same extents from
     page-cached memory (np.copyto out of an mmap of the packed shards into one reused buffer,
     one thread), page cached;
  4. the same through ActivationPairsDataset + DataLoader with 0/2/4 workers (fork), steady
     state (start-up and the batches that fill the workers' buffer pools excluded), page cached
     and cold (every store file dropped from the page cache with posix_fadvise(DONTNEED));
  5. cold cache for the plain batch reads (same fadvise).
Ingest here is the format alone (one commit per 6-sample group); bench/bench_ingest.py measures
the worker's real persist path. Every figure is the median of --repeats runs. The last line is
one JSON object with every figure. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore", message=".*worker processes in total.*")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hallulog.storage import (  # noqa: E402
    ActivationPairsDataset,
    SampleMeta,
    collate_pairs,
    open_store,
    open_writer,
)

FORMATS = ("packed", "zarr", "npy")
MB = 1e6


class Data:
    """Deterministic sample lengths; contents are views of one random buffer (no copy per sample)."""

    def __init__(self, n, L, H, seed=0):
        rng = np.random.default_rng(seed)
        self.lens = rng.integers(16, 257, n)
        self.L, self.H = L, H
        self.buf = rng.standard_normal(L * 256 * H, dtype=np.float32).astype(np.float16)

    def sample(self, k):
        t = int(self.lens[k])
        return self.buf[: self.L * t * self.H].reshape(self.L, t, self.H), SampleMeta(
            t // 2, t - t // 2, k % 2
        )

    def nbytes(self, ks):
        return int(sum(self.L * int(self.lens[k]) * self.H * 2 for k in ks))


def write_store(fmt, root, data, ks):
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    index = open(os.path.join(root, "activation_index.jsonl"), "w")
    w = open_writer(fmt, root, layer_ids=list(range(data.L)), hidden_size=data.H)
    for j, k in enumerate(ks):
        acts, meta = data.sample(k)
        loc = w.write(f"{k:016x}_0", acts, meta)
        if j % 6 == 5:  # a prompt group: primary + 5 samples
            w.commit()
        index.write(
            json.dumps(
                {
                    "activation_key": f"{k:016x}_0",
                    "layers": list(range(data.L)),
                    "prompt_token_count": meta.prompt_len,
                    "response_token_count": meta.response_len,
                    "row0_position": 0,
                    "num_rows": acts.shape[1],
                    "label": meta.label,
                    **loc,
                }
            )
            + "\n"
        )
    index.close()
    w.close()


def dd_write(path, nbytes, block=16 << 20):
    buf = np.random.default_rng(1).integers(0, 255, block, dtype=np.uint8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    done = 0
    while done < nbytes:
        done += os.write(fd, buf[: min(block, nbytes - done)])
    os.fdatasync(fd)
    os.close(fd)


def timed(fn, *a):
    t = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t


def _proc_write(args):
    fmt, root, n, L, H, ks = args
    write_store(fmt, root, Data(n, L, H), ks)


def parallel_write(fmt, base, n, L, H, procs):
    chunks = [list(range(n))[j::procs] for j in range(procs)]
    ctx = mp.get_context("fork")
    t = time.perf_counter()
    ps = [
        ctx.Process(target=_proc_write, args=((fmt, f"{base}/w{j}", n, L, H, chunks[j]),))
        for j in range(procs)
    ]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    return time.perf_counter() - t


def warm(root):
    for dp, _, fs in os.walk(root):
        for f in fs:
            with open(os.path.join(dp, f), "rb") as fh:
                while fh.read(64 << 20):
                    pass


def drop_cache(root):
    """Drop every file of ``root`` from the page cache (posix_fadvise DONTNEED; no root needed)."""
    for dp, _, fs in os.walk(root):
        for f in fs:
            fd = os.open(os.path.join(dp, f), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Memcpy:
    """The limit: copy the same extents out of page-cached memory (mmap of the packed shards)
    into one output buffer reused batch after batch (one thread; a fresh buffer per batch or
    per extent would add a page fault and a zeroing per page, which is not memory speed)."""

    def __init__(self, packed_root, batch_pairs):
        self.r = open_store(packed_root)
        self.maps = [np.memmap(p, np.uint8, "r") for p in self.r._shard_files]
        for m in self.maps:
            m.sum(dtype=np.uint64)  # touch every page
        t_max = int(self.r.ix["seq_len"].max())
        self.out = np.zeros(batch_pairs * t_max * self.r.hidden_size * 2, np.uint8)

    def read_pairs(self, samples, layers):
        outs, pos = [], 0
        for s, l in zip(samples, layers):
            t = self.r.seq_len(int(s))
            n = t * self.r.hidden_size * 2
            k, off = self.r._extent(int(s), int(l))
            out = self.out[pos : pos + n]
            np.copyto(out, self.maps[k][off : off + n])
            outs.append(out)
            pos += n
        return outs


def batch_rate(reader, batches):
    nbytes, t = 0, time.perf_counter()
    for s, l in batches:
        nbytes += sum(a.nbytes for a in reader.read_pairs(s, l))
    return nbytes / (time.perf_counter() - t)


def loader_rate(root, workers, nbatches, b, seed=0, cold=False):
    """Steady state: start-up and the first batches (each worker fills its buffer pool, about
    prefetch + 2 batches) are excluded; cold: the store is dropped from the page cache after
    them (the batches already prefetched were read warm)."""
    import torch

    ds = ActivationPairsDataset(root, seed=seed)
    warmup = 1 + 4 * workers
    sampler = torch.utils.data.RandomSampler(
        ds,
        replacement=True,
        num_samples=b * (nbatches + warmup),
        generator=torch.Generator().manual_seed(seed),
    )
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=b,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_pairs,
        multiprocessing_context="fork" if workers else None,
        prefetch_factor=2 if workers else None,
    )
    it = iter(dl)
    for _ in range(warmup):
        next(it)
    if cold:
        drop_cache(root)
    nbytes, t = 0, time.perf_counter()
    for batch in it:
        nbytes += int(batch["seq_len"].sum()) * batch["acts"].shape[1] * batch["acts"].shape[3] * 2
    return nbytes / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--k", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--dir", default="/tmp/hallulog_bench")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--formats", default=",".join(FORMATS))
    a = ap.parse_args()
    fmts = tuple(a.formats.split(","))
    med = statistics.median
    out = {
        "bench": "storage",
        "samples": a.samples,
        "layers": a.layers,
        "hidden": a.hidden,
        "batch": a.batch,
        "cpus": os.cpu_count(),
        "repeats": a.repeats,
    }
    n, L, H = a.samples, a.layers, a.hidden
    data = Data(n, L, H)
    total = data.nbytes(range(n))
    os.makedirs(a.dir, exist_ok=True)
    rows = {}
    print(
        f"# shapes: N={n} samples, L={L}, H={H}, float16, tokens uniform 16..256 "
        f"(mean {data.lens.mean():.0f}); logical bytes {total / MB:.0f} MB per store; cpus={os.cpu_count()}"
    )

    # 1. ingest
    dd_s = timed(dd_write, f"{a.dir}/dd.bin", total)
    os.unlink(f"{a.dir}/dd.bin")
    dd = total / dd_s
    print(f"\n## ingest (dd-style sequential write + fdatasync: {dd / MB:.0f} MB/s)")
    print("| format | MB/s | / dd | on-disk MB | 2 procs MB/s | 2 procs / 1 proc |")
    print("|---|---|---|---|---|---|")
    out["dd_MBps"] = dd / MB
    for fmt in fmts:
        root = f"{a.dir}/{fmt}"
        s = timed(write_store, fmt, root, data, range(n))
        disk = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(root) for f in fs)
        half = max(8, n // 2)
        s1 = parallel_write(fmt, f"{a.dir}/par_{fmt}_1", half, L, H, 1)
        s2 = parallel_write(fmt, f"{a.dir}/par_{fmt}_2", half, L, H, 2)
        shutil.rmtree(f"{a.dir}/par_{fmt}_1"), shutil.rmtree(f"{a.dir}/par_{fmt}_2")
        hb = data.nbytes(range(half))
        rows[fmt] = {"ingest": total / s}
        out.setdefault("ingest_vs_dd", {})[fmt] = round(total / s / dd, 3)
        print(
            f"| {fmt} | {total / s / MB:.0f} | {total / s / dd:.2f} | {disk / MB:.0f} "
            f"| {hb / s2 / MB:.0f} | {s1 / s2:.2f} |"
        )

    readers = {fmt: open_store(f"{a.dir}/{fmt}") for fmt in fmts}
    for fmt in fmts:
        warm(f"{a.dir}/{fmt}")
    mem = Memcpy(f"{a.dir}/packed", 2 * a.batch)
    rng = np.random.default_rng(0)

    # 2. k random single reads
    qs = rng.integers(0, n, a.k), rng.integers(0, L, a.k)
    print(f"\n## {a.k} random (sample, layer) reads, page cached (latency, microseconds)")
    print("| format | mean | median | p95 | MB/s |")
    print("|---|---|---|---|---|")
    for fmt, r in [("memcpy", mem)] + list(readers.items()):
        lat, nb = [], 0
        for i, l in zip(*qs):
            t = time.perf_counter()
            x = r.read_pairs([i], [l])[0] if fmt == "memcpy" else r.read(int(i), int(l))
            lat.append(time.perf_counter() - t)
            nb += x.nbytes
        lat = np.array(lat) * 1e6
        print(
            f"| {fmt} | {lat.mean():.0f} | {np.median(lat):.0f} | {np.percentile(lat, 95):.0f} | {nb / lat.sum():.0f} |"
        )

    # 3. batches, page cached
    batches = []
    for _ in range(a.batches):
        s = rng.integers(0, n, a.batch)
        ls = np.stack([rng.choice(L, 2, replace=False) for _ in s])
        batches.append((np.repeat(s, 2), ls.reshape(-1)))
    base = med(batch_rate(mem, batches) for _ in range(a.repeats))
    out["memcpy_MBps"] = base / MB
    print(
        f"\n## batches of {a.batch} samples x 2 layers, page cached (memcpy limit {base / MB:.0f} MB/s)"
    )
    print("| format | MB/s | / memcpy |")
    print("|---|---|---|")
    for fmt, r in readers.items():
        rate = med(batch_rate(r, batches) for _ in range(a.repeats if fmt != "zarr" else 1))
        rows[fmt]["batch"] = rate
        out.setdefault("reader_vs_memcpy", {})[fmt] = round(rate / base, 3)
        print(f"| {fmt} | {rate / MB:.0f} | {rate / base:.2f} |")

    # 4. DataLoader
    print(
        f"\n## ActivationPairsDataset + DataLoader (fork), batch {a.batch}, page cached; / memcpy {base / MB:.0f} MB/s"
    )
    print("| format | cache | workers 0 | workers 2 | workers 4 |")
    print("|---|---|---|---|---|")
    for fmt in fmts:
        for cold in (False, True):
            cells = []
            for w in (0, 2, 4):
                reps = 1 if fmt == "zarr" else a.repeats
                rate = med(
                    loader_rate(f"{a.dir}/{fmt}", w, 4 if fmt == "zarr" else 40, a.batch, cold=cold)
                    for _ in range(reps)
                )
                if not cold:
                    warm(f"{a.dir}/{fmt}")
                out.setdefault(
                    "loader_cold_vs_memcpy" if cold else "loader_vs_memcpy", {}
                ).setdefault(fmt, {})[str(w)] = round(rate / base, 3)
                cells.append(f"{rate / MB:.0f} MB/s ({rate / base:.2f})")
            warm(f"{a.dir}/{fmt}")
            print(f"| {fmt} | {'cold' if cold else 'cached'} | " + " | ".join(cells) + " |")

    # 5. cold cache
    print("\n## cold cache (batches, first pass after posix_fadvise DONTNEED of every store file)")
    print("| format | MB/s | / page-cached memcpy |")
    print("|---|---|---|")
    for fmt in fmts:
        drop_cache(f"{a.dir}/{fmt}")
        r = open_store(f"{a.dir}/{fmt}")
        rate = batch_rate(r, batches[:10])
        out.setdefault("reader_cold_vs_memcpy", {})[fmt] = round(rate / base, 3)
        print(f"| {fmt} | {rate / MB:.0f} | {rate / base:.2f} |")
    best = max(fmts, key=lambda f: rows[f]["batch"])
    print(f"\nfastest random-batch reader: {best}")
    shutil.rmtree(a.dir)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
