"""Ingest: the worker's real persist path vs a sequential write of the same bytes (same run, disk).

    python bench/bench_ingest.py [--groups 12] [--samples 6] [--layers 31] [--hidden 576]
                                 [--format packed] [--in-flight 1] [--rounds 6]
                                 [--capture-dtype float32|bfloat16]
                                 [--store-dtype float16|float32|bfloat16]
                                 [--dir /tmp/hallulog_ingest] [--spool-dir DIR]
    python bench/bench_ingest.py --cast-only --capture-dtype bfloat16 --store-dtype float16,bfloat16

``persist``: per prompt group, what the worker does after generation — read each sample's
capture file (safetensors from the spool, as the servers write it; read and deleted by
``hallulog.workers.capture.load_capture``), slice and cast it (``select_rows``, mode ``all``, into
``--store-dtype``, float16 by default; the thread CPU time of ``select_rows`` per sample is
reported as ``cast_cpu_ms_per_sample``), then ``WorkerDir.persist_group`` (store write + group
commit, then the JSONL lines, each file fsynced once). Also timed alone: ``persist_group``
(store + index lines). ``sequential``: the
same bytes (stored activations + the same JSONL lines) written with ``os.write`` to one file,
``fdatasync`` once per group — the same durability (every group durable before it is
reported).

The disk of a VM changes speed from one second to the next (here 250-1300 MB/s for the same
sequential write), so each group is persisted and its bytes written sequentially one after the
other, in an order that swaps every group: both sides see the disk in the same state, and each
round gives one paired ratio; the ratio reported is the median of the rounds'. ``--in-flight
2``: the next group's capture files are read on a thread while a group commits, as the worker
does with groups in flight (the read overlaps the commit, never the sequential write). Capture
files are made before each round (in ``DIR/spool``, on the store's disk as in a run, or
``--spool-dir``) and are in the page cache, not yet written back, as a just-written spool file
is (deleting a written-back file costs ~5x more here: ext4 frees its blocks, with online
discard on this disk). An unmeasured warm-up round comes first and measures the bytes each
group persists. Also reports fsyncs per group. The last line is one JSON object.

``--cast-only``: no store, no disk: the same capture files (made once, kept) are sliced and
cast into each of the comma-separated ``--store-dtype`` values, the dtypes' order rotating
every round; reports the thread CPU time of ``select_rows`` per sample for each (median of the
rounds) and its ratio to the first dtype's, in one process (a bfloat16 capture into a bfloat16
store is a copy, no cast).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hallulog.serving.capture import SpoolWriter  # noqa: E402
from hallulog.storage._io import write_all  # noqa: E402
from hallulog.workers.capture import load_capture, select_rows  # noqa: E402
from hallulog.workers.persist import GenerationRecord, WorkerDir  # noqa: E402

MB = 1e6


def make_groups(args, rng) -> list[list[dict]]:
    """Token lengths and JSONL payloads of every sample (deterministic)."""
    groups = []
    for g in range(args.groups):
        prompt_id = f"{g:016x}"
        prompt_len = int(rng.integers(24, 64))
        samples = []
        for s in range(args.samples):
            resp = int(rng.integers(args.max_tokens // 2, args.max_tokens + 1))
            tokens = rng.integers(0, 49152, prompt_len + resp).tolist()
            logprobs = [
                {
                    "token": f"t{t}",
                    "logprob": -0.5,
                    "top_logprobs": [{"token": f"a{k}", "logprob": -1.0 - k} for k in range(5)],
                }
                for t in tokens[prompt_len:]
            ]
            samples.append(
                {
                    "prompt_id": prompt_id,
                    "sample_id": s,
                    "prompt_len": prompt_len,
                    "tokens": tokens,
                    "logprobs": logprobs,
                }
            )
        groups.append(samples)
    return groups


def spool_captures(
    groups, spool: SpoolWriter, layers: int, hidden: int, rng, capture_dtype: str = "float32"
) -> list[list[str]]:
    import torch

    base = torch.from_numpy(rng.standard_normal((160 * layers * hidden,), dtype=np.float32))
    base = base.to(getattr(torch, capture_dtype))
    paths = []
    for samples in groups:
        row = []
        for s in samples:
            fed = s["tokens"][:-1]  # generation capture: prompt + all generated but the last
            states = base[: len(fed) * layers * hidden].view(len(fed), layers, hidden)
            row.append(spool.write(states, fed))
        paths.append(row)
    return paths


#: thread CPU seconds spent in select_rows (the slice and cast), summed over the calls
CAST_CPU = [0.0]


def records_for(
    samples, paths, layer_ids, dtype: str = "float16", delete: bool = True
) -> list[GenerationRecord]:
    records = []
    for s, path in zip(samples, paths):
        prompt_len = s["prompt_len"]
        resp = len(s["tokens"]) - prompt_len
        hidden = load_capture(path, s["tokens"][:-1], delete=delete)
        t = time.thread_time()
        rows = select_rows(
            hidden,
            prompt_len=prompt_len,
            response_len=resp,
            sequence_mode="all",
            layer_index=None,
            dtype=dtype,
        )
        CAST_CPU[0] += time.thread_time() - t
        key = f"{s['prompt_id']}_{s['sample_id']}"
        records.append(
            GenerationRecord(
                row={
                    "prompt_id": s["prompt_id"],
                    "sample_id": s["sample_id"],
                    "text": "x" * 200,
                    "token_ids": s["tokens"][prompt_len:],
                    "logprobs": s["logprobs"],
                    "activation_key": key,
                },
                acts=rows.acts,
                prompt_rows=rows.prompt_rows,
                response_rows=rows.response_rows,
                activation_row={
                    "prompt_id": s["prompt_id"],
                    "sample_id": s["sample_id"],
                    "activation_key": key,
                    "layers": layer_ids,
                    "sequence_mode": "all",
                    "prompt_token_count": prompt_len,
                    "response_token_count": resp,
                    "row0_position": rows.row0_position,
                    "num_rows": int(rows.acts.shape[1]),
                },
            )
        )
    return records


class FsyncCounter:
    def __init__(self):
        self.n = 0
        self._real = (os.fsync, os.fdatasync)

    def __enter__(self):
        def count(real):
            def wrapped(fd):
                self.n += 1
                return real(fd)

            return wrapped

        os.fsync, os.fdatasync = count(self._real[0]), count(self._real[1])
        return self

    def __exit__(self, *exc):
        os.fsync, os.fdatasync = self._real


def interleaved_round(
    args, groups, paths, root: Path, layer_ids, seq_path: Path, seq_bytes: list[int] | None
) -> dict:
    """Persist each group, and write the same bytes sequentially, one group at a time, the
    order swapped every group, so both see the disk in the same state.

    ``seq_bytes`` (bytes each group persists: its activations and JSONL lines, as a warm-up
    round measured; None: that warm-up, persist only). ``--in-flight 2``: the next group's
    captures load on a thread while a group commits; a group's persist step ends once they are
    loaded, so the load overlaps the commit and never the sequential write. Returns the
    seconds of each side, of ``persist_group`` alone, the bytes per group and the persist
    side's fsync calls.
    """
    wdir = WorkerDir(
        root,
        worker_id=0,
        storage_format=args.format,
        layer_ids=layer_ids,
        hidden_size=args.hidden,
        dtype=args.store_dtype,
    )
    files = [
        root / n for n in ("generations.jsonl", "activation_index.jsonl", "prompt_index.jsonl")
    ]
    buf = memoryview(np.random.default_rng(1).integers(0, 255, max(seq_bytes or [1]), np.uint8))
    fd = os.open(seq_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    out = {"persist": 0.0, "store": 0.0, "sequential": 0.0, "bytes": [], "fsyncs": 0}
    ahead = args.in_flight > 1

    def persist_step(g: int) -> None:
        t = time.perf_counter()
        records = (
            loads[g].result()
            if ahead
            else records_for(groups[g], paths[g], layer_ids, args.store_dtype)
        )
        if ahead and g + 1 < len(groups):
            loads.append(
                pool.submit(records_for, groups[g + 1], paths[g + 1], layer_ids, args.store_dtype)
            )
        jsonl = sum(f.stat().st_size for f in files if f.exists())
        t_store = time.perf_counter()
        wdir.persist_group({"prompt_id": groups[g][0]["prompt_id"], "dataset": "bench"}, records)
        out["store"] += time.perf_counter() - t_store
        if ahead and g + 1 < len(groups):
            loads[g + 1].result()
        out["persist"] += time.perf_counter() - t
        out["bytes"].append(
            sum(r.acts.nbytes for r in records) + sum(f.stat().st_size for f in files) - jsonl
        )

    def sequential_step(g: int) -> None:
        t = time.perf_counter()
        write_all(fd, buf[: seq_bytes[g]])
        os.fdatasync(fd)
        out["sequential"] += time.perf_counter() - t

    with FsyncCounter() as fs, ThreadPoolExecutor(1) as pool:
        loads = (
            [pool.submit(records_for, groups[0], paths[0], layer_ids, args.store_dtype)]
            if ahead
            else []
        )
        for g in range(len(groups)):
            steps = [persist_step] if seq_bytes is None else [persist_step, sequential_step]
            for step in steps[:: 1 if g % 2 == 0 else -1]:
                step(g)
        out["fsyncs"] = fs.n - (0 if seq_bytes is None else len(groups))
    os.close(fd)
    wdir.close()
    return out


def cast_only(args, groups, spool: Path, rng) -> None:
    """``--cast-only``: select_rows' thread CPU per sample into each store dtype, one process."""
    dtypes = args.store_dtype.split(",")
    layer_ids = list(range(args.layers))
    paths = spool_captures(
        groups, SpoolWriter(spool), args.layers, args.hidden, rng, args.capture_dtype
    )
    n = sum(len(g) for g in groups)
    for dtype in dtypes:  # warm-up: page cache, torch import, scratch buffers
        for g in range(len(groups)):
            records_for(groups[g], paths[g], layer_ids, dtype, delete=False)
    per = {d: [] for d in dtypes}
    for r in range(args.rounds):
        for dtype in dtypes[r % len(dtypes) :] + dtypes[: r % len(dtypes)]:
            CAST_CPU[0] = 0.0
            for g in range(len(groups)):
                records_for(groups[g], paths[g], layer_ids, dtype, delete=False)
            per[dtype].append(CAST_CPU[0] / n)
    ms = {d: statistics.median(v) * 1e3 for d, v in per.items()}
    rows = sum(len(s["tokens"]) - 1 for g in groups for s in g) / n
    print(
        f"{args.capture_dtype} capture, {args.layers} layers x {args.hidden}, {rows:.0f} rows per "
        f"sample, {args.rounds} rounds, cpus={os.cpu_count()}"
    )
    for d in dtypes:
        print(
            f"  -> {d:9s}: select_rows {ms[d]:7.3f} ms CPU per sample  "
            f"(x{ms[d] / ms[dtypes[0]]:.2f} of {dtypes[0]}; runs {[round(x * 1e3, 3) for x in per[d]]})"
        )
    print(
        json.dumps(
            {
                "bench": "ingest_cast",
                "capture_dtype": args.capture_dtype,
                "layers": args.layers,
                "hidden": args.hidden,
                "rows_per_sample": round(rows, 1),
                "rounds": args.rounds,
                "cast_cpu_ms_per_sample": {d: round(v, 4) for d, v in ms.items()},
                "ratio_to_first": {d: round(ms[d] / ms[dtypes[0]], 3) for d in dtypes},
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=12)
    ap.add_argument("--samples", type=int, default=6, help="generations per group (primary + K)")
    ap.add_argument("--layers", type=int, default=31, help="layer ids captured (SmolLM2: 31)")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--format", default="packed")
    ap.add_argument(
        "--in-flight",
        type=int,
        default=1,
        choices=(1, 2),
        help="2: the captures of the next group are read while one commits, as in "
        "the worker (1: strictly one group after the other)",
    )
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument(
        "--capture-dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="what the server writes: float32 (the embedded CPU server), bfloat16 "
        "(vLLM serving a bf16 model on a GPU)",
    )
    ap.add_argument(
        "--store-dtype",
        default="float16",
        help="what the worker stores: float16, float32 or bfloat16 (with --cast-only: "
        "a comma-separated list, compared in one process)",
    )
    ap.add_argument(
        "--cast-only",
        action="store_true",
        help="time only select_rows (slice + cast) into each --store-dtype: no store",
    )
    ap.add_argument("--dir", default="/tmp/hallulog_ingest")
    ap.add_argument(
        "--spool-dir",
        default=None,
        help="where the capture files are made (default: DIR/spool, on the store's "
        "disk as the run's default spool; /dev/shm/...: as --spool-root /dev/shm)",
    )
    args = ap.parse_args()
    for d in args.store_dtype.split(","):
        if d not in ("float16", "float32", "bfloat16") or (
            "," in args.store_dtype and not args.cast_only
        ):
            ap.error(
                f"--store-dtype {args.store_dtype}: one of float16, float32, bfloat16 "
                "(a comma-separated list only with --cast-only)"
            )
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    groups = make_groups(args, rng)
    if args.cast_only:
        spool = Path(args.spool_dir) if args.spool_dir else base / "spool"
        try:
            cast_only(args, groups, spool, rng)
        finally:
            shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(spool, ignore_errors=True)
        return
    layer_ids = list(range(args.layers))
    persist_runs, store_runs, seq_runs, fsyncs, cast_runs = [], [], [], [], []
    spool = Path(args.spool_dir) if args.spool_dir else base / "spool"
    shutil.rmtree(spool, ignore_errors=True)
    seq_bytes = None  # the first round is an unmeasured warm-up that measures them
    for r in range(-1, args.rounds):
        paths = spool_captures(
            groups, SpoolWriter(spool), args.layers, args.hidden, rng, args.capture_dtype
        )
        root = base / f"worker_{r}"
        CAST_CPU[0] = 0.0
        got = interleaved_round(
            args, groups, paths, root, layer_ids, base / "sequential.bin", seq_bytes
        )
        shutil.rmtree(root)
        (base / "sequential.bin").unlink()
        if seq_bytes is None:
            seq_bytes = got["bytes"]
            nbytes = sum(seq_bytes)
            continue
        persist_runs.append(nbytes / got["persist"])
        store_runs.append(nbytes / got["store"])
        seq_runs.append(nbytes / got["sequential"])
        fsyncs.append(got["fsyncs"] / args.groups)
        cast_runs.append(CAST_CPU[0] / (args.groups * args.samples))
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(spool, ignore_errors=True)
    p, s = statistics.median(persist_runs), statistics.median(seq_runs)
    st = statistics.median(store_runs)
    paired = statistics.median(a / b for a, b in zip(persist_runs, seq_runs))
    paired_store = statistics.median(a / b for a, b in zip(store_runs, seq_runs))
    print(
        f"groups={args.groups} x {args.samples} samples, {args.layers} layers x {args.hidden}, "
        f"{args.in_flight} in flight, format {args.format}, "
        f"{nbytes / args.groups / MB:.1f} MB per group, cpus={os.cpu_count()}"
    )
    print(
        f"persist path     : {p / MB:7.1f} MB/s  (runs {[round(x / MB, 1) for x in persist_runs]})"
    )
    print(
        f"  of which persist_group (store + index lines): {st / MB:7.1f} MB/s "
        f"(ratio {paired_store:.2f}); the rest is reading and casting the capture files"
    )
    print(
        f"  select_rows (slice + cast {args.capture_dtype} -> {args.store_dtype}): "
        f"{statistics.median(cast_runs) * 1e3:.3f} ms thread CPU per sample"
    )
    print(f"sequential write : {s / MB:7.1f} MB/s  (runs {[round(x / MB, 1) for x in seq_runs]})")
    print(
        f"ratio persist / sequential (median of the rounds' pairs): {paired:.2f}   "
        f"fsyncs per group: {statistics.median(fsyncs):.1f}"
    )
    print(
        json.dumps(
            {
                "bench": "ingest",
                "format": args.format,
                "groups": args.groups,
                "capture_dtype": args.capture_dtype,
                "store_dtype": args.store_dtype,
                "cast_cpu_ms_per_sample": round(statistics.median(cast_runs) * 1e3, 4),
                "samples": args.samples,
                "layers": args.layers,
                "hidden": args.hidden,
                "mb_per_group": round(nbytes / args.groups / MB, 2),
                "rounds": args.rounds,
                "in_flight": args.in_flight,
                "persist_MBps": round(p / MB, 1),
                "sequential_MBps": round(s / MB, 1),
                "ratio_persist_vs_sequential": round(paired, 3),
                "ratio_runs": [round(a / b, 3) for a, b in zip(persist_runs, seq_runs)],
                "ratio_of_medians": round(p / s, 3),
                "persist_group_MBps": round(st / MB, 1),
                "ratio_persist_group_vs_sequential": round(paired_store, 3),
                "fsyncs_per_group": statistics.median(fsyncs),
                "persist_runs_MBps": [round(x / MB, 1) for x in persist_runs],
                "sequential_runs_MBps": [round(x / MB, 1) for x in seq_runs],
            }
        )
    )


if __name__ == "__main__":
    main()
