"""Ingest: the worker's real persist path vs a sequential write of the same bytes (same run, disk).

    python bench/bench_ingest.py [--groups 12] [--samples 6] [--layers 31] [--hidden 576]
                                 [--format packed] [--in-flight 1] [--rounds 3] [--dir /tmp/hallulog_ingest]

``persist``: per prompt group, what the worker does after generation — read each sample's
capture file (safetensors from the spool, as the servers write it; read and deleted by
``workers.capture.load_capture``), slice and cast it (``select_rows``, mode ``all``, float16),
then ``WorkerDir.persist_group`` (store write + group commit, then the JSONL lines, each file
fsynced once). Also timed alone: ``persist_group`` (store + index lines). As in the worker (N
groups in flight, capture files read on threads, one group committing at a time), the next
group's capture files can be read while a group commits (``--in-flight 2``; the default ``1``:
one group after the other, which on a busy 2-core machine is the faster of the two). ``sequential``: the same bytes (stored activations + the same JSONL lines) written
with ``os.write`` to one file, ``fdatasync`` once per group — the same durability (every group
durable before it is reported). Capture files are made before each phase and are in the page
cache, as a just-written spool file is. Phases alternate round by round; medians (the machine
may be shared). Also reports fsyncs per group. The last line is one JSON object.
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

from serving.capture import SpoolWriter  # noqa: E402
from workers.capture import load_capture, select_rows  # noqa: E402
from workers.persist import GenerationRecord, WorkerDir  # noqa: E402

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
            logprobs = [{"token": f"t{t}", "logprob": -0.5, "top_logprobs": [
                {"token": f"a{k}", "logprob": -1.0 - k} for k in range(5)]} for t in tokens[prompt_len:]]
            samples.append({"prompt_id": prompt_id, "sample_id": s, "prompt_len": prompt_len,
                            "tokens": tokens, "logprobs": logprobs})
        groups.append(samples)
    return groups


def spool_captures(groups, spool: SpoolWriter, layers: int, hidden: int, rng) -> list[list[str]]:
    import torch

    base = torch.from_numpy(rng.standard_normal((160 * layers * hidden,), dtype=np.float32))
    paths = []
    for samples in groups:
        row = []
        for s in samples:
            fed = s["tokens"][:-1]  # generation capture: prompt + all generated but the last
            states = base[: len(fed) * layers * hidden].view(len(fed), layers, hidden)
            row.append(spool.write(states, fed))
        paths.append(row)
    return paths


def records_for(samples, paths, layer_ids) -> list[GenerationRecord]:
    records = []
    for s, path in zip(samples, paths):
        prompt_len = s["prompt_len"]
        resp = len(s["tokens"]) - prompt_len
        hidden = load_capture(path, s["tokens"][:-1])
        rows = select_rows(hidden, prompt_len=prompt_len, response_len=resp, sequence_mode="all",
                           layer_index=None, dtype="float16")
        key = f"{s['prompt_id']}_{s['sample_id']}"
        records.append(GenerationRecord(
            row={"prompt_id": s["prompt_id"], "sample_id": s["sample_id"], "text": "x" * 200,
                 "token_ids": s["tokens"][prompt_len:], "logprobs": s["logprobs"],
                 "activation_key": key},
            acts=rows.acts, prompt_rows=rows.prompt_rows, response_rows=rows.response_rows,
            activation_row={"prompt_id": s["prompt_id"], "sample_id": s["sample_id"],
                            "activation_key": key, "layers": layer_ids, "sequence_mode": "all",
                            "prompt_token_count": prompt_len, "response_token_count": resp,
                            "row0_position": rows.row0_position, "num_rows": int(rows.acts.shape[1])}))
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


def persist_phase(args, groups, paths, root: Path, layer_ids) -> tuple[float, float, int, int]:
    """Returns (seconds in all, seconds in persist_group, bytes written: activations + JSONL,
    fsync calls)."""
    wdir = WorkerDir(root, worker_id=0, storage_format=args.format, layer_ids=layer_ids,
                     hidden_size=args.hidden, dtype="float16")
    nbytes, store = 0, 0.0
    ahead = max(0, args.in_flight - 1)
    with FsyncCounter() as fs, ThreadPoolExecutor(max(1, ahead)) as pool:
        t = time.perf_counter()
        loads = [pool.submit(records_for, s, p, layer_ids)
                 for s, p in zip(groups[:ahead], paths[:ahead])]
        for g, samples in enumerate(groups):
            if ahead and g + ahead < len(groups):  # the next groups' captures load while this one commits
                loads.append(pool.submit(records_for, groups[g + ahead], paths[g + ahead],
                                         layer_ids))
            records = (loads[g].result() if ahead
                       else records_for(samples, paths[g], layer_ids))
            nbytes += sum(r.acts.nbytes for r in records)
            t_store = time.perf_counter()
            wdir.persist_group({"prompt_id": samples[0]["prompt_id"], "dataset": "bench"}, records)
            store += time.perf_counter() - t_store
        wall = time.perf_counter() - t
    wdir.close()
    nbytes += sum((root / n).stat().st_size for n in ("generations.jsonl", "activation_index.jsonl",
                                                       "prompt_index.jsonl"))
    return wall, store, nbytes, fs.n


def sequential_phase(path: Path, group_bytes: list[int]) -> float:
    buf = np.random.default_rng(1).integers(0, 255, max(group_bytes), dtype=np.uint8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t = time.perf_counter()
    for n in group_bytes:
        mv = memoryview(buf[:n])
        done = 0
        while done < n:
            done += os.write(fd, mv[done:])
        os.fdatasync(fd)
    wall = time.perf_counter() - t
    os.close(fd)
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=12)
    ap.add_argument("--samples", type=int, default=6, help="generations per group (primary + K)")
    ap.add_argument("--layers", type=int, default=31, help="layer ids captured (SmolLM2: 31)")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--format", default="packed")
    ap.add_argument("--in-flight", type=int, default=1,
                    help="groups in flight, as in the worker: the captures of the next group(s) "
                         "are read while one commits (1: strictly one group after the other)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/hallulog_ingest")
    args = ap.parse_args()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    groups = make_groups(args, rng)
    layer_ids = list(range(args.layers))
    persist_runs, store_runs, seq_runs, fsyncs = [], [], [], []
    for r in range(args.rounds):
        paths = spool_captures(groups, SpoolWriter(base / "spool"), args.layers, args.hidden, rng)
        root = base / f"worker_{r}"
        wall, store, nbytes, n_fsync = persist_phase(args, groups, paths, root, layer_ids)
        persist_runs.append(nbytes / wall)
        store_runs.append(nbytes / store)
        fsyncs.append(n_fsync / args.groups)
        # the same bytes, group by group: activations of the group + its share of the JSONL
        per_group = nbytes // args.groups
        seq_wall = sequential_phase(base / "sequential.bin", [per_group] * args.groups)
        seq_runs.append(per_group * args.groups / seq_wall)
        shutil.rmtree(root)
        (base / "sequential.bin").unlink()
    shutil.rmtree(base, ignore_errors=True)
    p, s = statistics.median(persist_runs), statistics.median(seq_runs)
    st = statistics.median(store_runs)
    print(f"groups={args.groups} x {args.samples} samples, {args.layers} layers x {args.hidden}, "
          f"{args.in_flight} in flight, format {args.format}, {nbytes / args.groups / MB:.1f} MB per group, cpus={os.cpu_count()}")
    print(f"persist path     : {p / MB:7.1f} MB/s  (runs {[round(x / MB, 1) for x in persist_runs]})")
    print(f"  of which persist_group (store + index lines): {st / MB:7.1f} MB/s "
          f"(ratio {st / s:.2f}); the rest is reading and casting the capture files")
    print(f"sequential write : {s / MB:7.1f} MB/s  (runs {[round(x / MB, 1) for x in seq_runs]})")
    print(f"ratio persist / sequential: {p / s:.2f}   fsyncs per group: {statistics.median(fsyncs):.1f}")
    print(json.dumps({"bench": "ingest", "format": args.format, "groups": args.groups,
                      "samples": args.samples, "layers": args.layers, "hidden": args.hidden,
                      "mb_per_group": round(nbytes / args.groups / MB, 2), "rounds": args.rounds,
                      "in_flight": args.in_flight, "persist_MBps": round(p / MB, 1), "sequential_MBps": round(s / MB, 1),
                      "ratio_persist_vs_sequential": round(p / s, 3),
                      "persist_group_MBps": round(st / MB, 1),
                      "ratio_persist_group_vs_sequential": round(st / s, 3),
                      "fsyncs_per_group": statistics.median(fsyncs),
                      "persist_runs_MBps": [round(x / MB, 1) for x in persist_runs],
                      "sequential_runs_MBps": [round(x / MB, 1) for x in seq_runs]}))


if __name__ == "__main__":
    main()
