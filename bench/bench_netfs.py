"""Training reads on network storage: every format through a FUSE mount that adds latency.

    python bench/bench_netfs.py [--latencies 0.5,2,10] [--samples 64] [--layers 16] [--hidden 4096]

One data set (seeded; token lengths U[16, 128], float16, L layers x H hidden) is written once as
a packed store, converted to zarr and npy (``convert_store``) and exported to WebDataset
(``export_wds``), all in a backing directory. For each latency, ``bench/latency_fs.py`` mounts it
(a FUSE passthrough sleeping that long in every open and read: NFS or Lustre in miniature) and
the bench measures, cold (every file of the store read dropped from the page cache first):

- the mount's **sequential read rate**: one file of --seq-mb MB read front to back in 16 MiB
  reads (what ``dd`` or ``cat`` would get) — the baseline of the run;
- each format's **training read** through its DataLoader path (``DataLoader`` with
  ``collate_pairs``, batch --batch, 0 workers): every sample once in random order, 2 random
  layers, all tokens. packed, zarr and npy through ``ActivationPairsDataset`` (one
  ``__getitems__`` per batch), WDS through ``WdsPairsDataset`` (streamed, shuffle buffer 16).
  The rate is useful bytes (2 layers x T x H x 2) per second, and its ratio to the sequential
  rate measured on the same mount in the same minute;
- packed read the old way as well (``plain``: the local-disk policy, 2 threads, nothing merged)
  against the default on a remote mount (``packed``: coalesced ranges, 32 in flight).

Needs /dev/fuse, root and fusepy over libfuse 2 (``apt-get install -y libfuse2 && pip install
fusepy==3.0.1``). The last line is one JSON object. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore", message=".*worker processes in total.*")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

from hallulog.exports.wds import export_wds  # noqa: E402
from hallulog.exports.wds_dataset import WdsPairsDataset  # noqa: E402
from hallulog.storage import (  # noqa: E402
    ActivationPairsDataset,
    SampleMeta,
    collate_pairs,
    convert_store,
    open_store,
    open_writer,
)
from hallulog.storage._ranged import ReadPolicy  # noqa: E402
from latency_fs import fuse_available, mounted  # noqa: E402

MB = 1e6


def write_data(back: str, n: int, L: int, H: int, seed: int = 0) -> tuple[int, float]:
    """packed, zarr, npy and wds of one data set under ``back``; (store bytes, mean T)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(16, 129, n)
    buf = rng.standard_normal(L * 128 * H, dtype=np.float32).astype(np.float16)
    w = open_writer("packed", os.path.join(back, "packed"), layer_ids=list(range(L)), hidden_size=H)
    for i in range(n):
        t = int(lens[i])
        w.write(
            f"{i:016x}_0", buf[: L * t * H].reshape(L, t, H), SampleMeta(t // 2, t - t // 2, i % 2)
        )
        if i % 6 == 5:
            w.commit()
    w.close()
    convert_store(os.path.join(back, "packed"), os.path.join(back, "zarr"), "zarr")
    convert_store(os.path.join(back, "packed"), os.path.join(back, "npy"), "npy")
    export_wds(os.path.join(back, "packed"), os.path.join(back, "wds"), shard_bytes=64 << 20)
    return int(lens.sum()) * L * H * 2, float(lens.mean())


def drop_cache(root: str) -> None:
    """Drop every file under ``root`` (the mount) from the page cache."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def sequential_rate(path: str, block: int = 16 << 20) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = bytearray(block)
        t0, n = time.perf_counter(), 0
        while True:
            got = os.readv(fd, [buf])
            if not got:
                break
            n += got
        return n / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def pairs_pass(path: str, batch: int, policy: ReadPolicy | None = None) -> tuple[float, int, int]:
    """(seconds, useful bytes, samples) of one epoch through ActivationPairsDataset."""
    import torch

    ds = ActivationPairsDataset(open_store(path), seed=0)
    if policy is not None:
        ds.reader._policy = policy
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(1))
    dl = torch.utils.data.DataLoader(
        ds, batch_size=batch, sampler=sampler, num_workers=0, collate_fn=collate_pairs
    )
    t0, nbytes, count = time.perf_counter(), 0, 0
    for b in dl:
        nbytes += int(b["seq_len"].sum()) * b["acts"].shape[1] * b["acts"].shape[3] * 2
        count += len(b["seq_len"])
    dt = time.perf_counter() - t0
    ds.reader.close()
    return dt, nbytes, count


def wds_pass(path: str, batch: int) -> tuple[float, int, int]:
    import torch

    ds = WdsPairsDataset(path, seed=0, shuffle_buffer=16)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=0, collate_fn=collate_pairs)
    t0, nbytes, count = time.perf_counter(), 0, 0
    for b in dl:
        nbytes += int(b["seq_len"].sum()) * b["acts"].shape[1] * b["acts"].shape[3] * 2
        count += len(b["seq_len"])
    return time.perf_counter() - t0, nbytes, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latencies", default="0.5,2,10", help="ms per open and read (comma list)")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-mb", type=int, default=256, help="size of the sequential-read file")
    ap.add_argument("--formats", default="packed,plain,zarr,npy,wds")
    ap.add_argument("--dir", default="/tmp/hallulog_netfs")
    a = ap.parse_args()
    why = fuse_available()
    if why is not None:
        raise SystemExit(f"bench_netfs: {why}")
    if os.path.exists(a.dir):
        shutil.rmtree(a.dir)
    back, mnt = os.path.join(a.dir, "back"), os.path.join(a.dir, "mnt")
    os.makedirs(back)
    t = time.perf_counter()
    total, mean_t = write_data(back, a.samples, a.layers, a.hidden)
    with open(os.path.join(back, "seq.bin"), "wb") as f:
        f.write(os.urandom(a.seq_mb << 20))
    print(
        f"data: {a.samples} samples, L={a.layers}, H={a.hidden}, float16, T U[16,128] "
        f"(mean {mean_t:.0f}), {total / MB:.0f} MB per format; written in "
        f"{time.perf_counter() - t:.0f} s; batch {a.batch}, 2 layers per sample"
    )
    fmts = a.formats.split(",")
    plain = ReadPolicy(concurrency=min(8, os.cpu_count() or 1), gap=0, inline_below=4 << 20)
    out = {
        "bench": "netfs",
        "samples": a.samples,
        "layers": a.layers,
        "hidden": a.hidden,
        "batch": a.batch,
        "cpus": os.cpu_count(),
        "results": {},
    }
    print("\n| latency ms | sequential MB/s | format | useful MB/s | / sequential | samples/s |")
    print("|---|---|---|---|---|---|")
    for lat in (float(x) for x in a.latencies.split(",")):
        with mounted(back, mnt, lat) as m:
            m = str(m)
            seqs = [sequential_rate(os.path.join(m, "seq.bin"))]
            rows = {}
            for fmt in fmts:
                drop_cache(os.path.join(m, "packed" if fmt == "plain" else fmt))
                if fmt == "wds":
                    dt, nb, cnt = wds_pass(os.path.join(m, "wds"), a.batch)
                else:
                    store = "packed" if fmt == "plain" else fmt
                    dt, nb, cnt = pairs_pass(
                        os.path.join(m, store), a.batch, plain if fmt == "plain" else None
                    )
                assert cnt == a.samples, (fmt, cnt)
                rows[fmt] = {"useful_MBps": nb / dt / MB, "samples_s": cnt / dt}
            seqs.append(sequential_rate(os.path.join(m, "seq.bin")))
            seq = sum(seqs) / len(seqs)
            res = {
                "sequential_MBps": round(seq / MB, 1),
                "sequential_runs_MBps": [round(s / MB, 1) for s in seqs],
            }
            for fmt, r in rows.items():
                res[fmt] = {
                    "useful_MBps": round(r["useful_MBps"], 1),
                    "vs_sequential": round(r["useful_MBps"] * MB / seq, 3),
                    "samples_s": round(r["samples_s"], 1),
                }
                print(
                    f"| {lat:g} | {seq / MB:.0f} | {fmt} | {r['useful_MBps']:.0f} | "
                    f"{r['useful_MBps'] * MB / seq:.2f} | {r['samples_s']:.0f} |"
                )
            out["results"][f"{lat:g}"] = res
            sys.stdout.flush()
    shutil.rmtree(a.dir, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
