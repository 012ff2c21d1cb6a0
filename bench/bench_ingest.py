"""Ingest: the worker's real persist path vs a sequential write of the same bytes (same run, disk).

    python bench/bench_ingest.py [--groups 12] [--samples 6] [--layers 31] [--hidden 576]
                                 [--format packed] [--in-flight 1] [--rounds 6]
                                 [--dir /tmp/hallulog_ingest] [--spool-dir DIR]

``persist``: per prompt group, what the worker does after generation — read each sample's
capture file (safetensors from the spool, as the servers write it; read and deleted by
``workers.capture.load_capture``), slice and cast it (``select_rows``, mode ``all``, float16),
then ``WorkerDir.persist_group`` (store write + group commit, then the JSONL lines, each file
fsynced once). Also timed alone: ``persist_group`` (store + index lines). ``sequential``: the
same bytes (stored activations + the same JSONL lines) written with ``os.write`` to one file,
``fdatasync`` once per group — the same durability (every group durable before it is
reported).

The disk of a VM changes speed from one second to the next (here 250-1300 MB/s for the same
sequential write), so by default (``--in-flight 1``) each group is persisted and then written
sequentially, in an order that swaps every group: both see the disk in the same state, and
each round gives one paired ratio; the ratio reported is the median of the rounds'. With
``--in-flight 2`` the next group's capture files are read while a group commits, as the worker
does with groups in flight; then whole phases alternate round by round. Capture files are made
before each round (in ``DIR/spool``, on the store's disk as in a run, or ``--spool-dir``) and are
in the page cache, as a just-written spool file is; ``os.sync()`` before each round keeps their
writeback out of the timed part. An unmeasured warm-up phase comes first. Also reports fsyncs
per group. The last line is one JSON object.
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


def interleaved_round(args, groups, paths, root: Path, layer_ids, seq_path: Path,
                      per_group: int) -> tuple[float, float, float, int]:
    """One group persisted, then the same bytes written sequentially, group by group (the
    order swapped every group), so both see the disk in the same state. Returns (persist
    seconds, of which persist_group, sequential seconds, persist fsync calls)."""
    wdir = WorkerDir(root, worker_id=0, storage_format=args.format, layer_ids=layer_ids,
                     hidden_size=args.hidden, dtype="float16")
    buf = memoryview(np.random.default_rng(1).integers(0, 255, per_group, dtype=np.uint8))
    fd = os.open(seq_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    persist = store = seq = 0.0
    with FsyncCounter() as fs:
        for g, samples in enumerate(groups):
            for step in (("persist", "sequential") if g % 2 == 0 else ("sequential", "persist")):
                t = time.perf_counter()
                if step == "persist":
                    records = records_for(samples, paths[g], layer_ids)
                    t_store = time.perf_counter()
                    wdir.persist_group({"prompt_id": samples[0]["prompt_id"], "dataset": "bench"},
                                       records)
                    store += time.perf_counter() - t_store
                    persist += time.perf_counter() - t
                else:
                    done = 0
                    while done < per_group:
                        done += os.write(fd, buf[done:])
                    os.fdatasync(fd)
                    seq += time.perf_counter() - t
        n_fsync = fs.n - len(groups)  # the sequential file's own fdatasyncs
    os.close(fd)
    wdir.close()
    return persist, store, seq, n_fsync


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
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dir", default="/tmp/hallulog_ingest")
    ap.add_argument("--spool-dir", default=None,
                    help="where the capture files are made (default: DIR/spool, on the store's "
                         "disk as the run's default spool; /dev/shm/...: as --spool-root /dev/shm)")
    args = ap.parse_args()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    groups = make_groups(args, rng)
    layer_ids = list(range(args.layers))
    persist_runs, store_runs, seq_runs, fsyncs = [], [], [], []
    # an unmeasured warm-up persist: imports, first allocations, and the bytes a phase writes
    spool = Path(args.spool_dir) if args.spool_dir else base / "spool"
    shutil.rmtree(spool, ignore_errors=True)
    paths = spool_captures(groups, SpoolWriter(spool), args.layers, args.hidden, rng)
    nbytes = persist_phase(args, groups, paths, base / "warm_up", layer_ids)[2]
    shutil.rmtree(base / "warm_up")
    per_group = nbytes // args.groups
    for r in range(args.rounds):
        paths = spool_captures(groups, SpoolWriter(spool), args.layers, args.hidden, rng)
        root = base / f"worker_{r}"
        os.sync()  # no other dirty data (the spool's) queued for the disk
        if args.in_flight == 1:
            # the disk's speed drifts (this VM's: 250-1300 MB/s from one second to the next),
            # so the two alternate group by group
            wall, store, seq_wall, n_fsync = interleaved_round(
                args, groups, paths, root, layer_ids, base / "sequential.bin", per_group)
        else:
            # the next groups' captures load while one commits: whole phases, in an order
            # that alternates round by round
            for phase in ("persist", "sequential")[::1 if r % 2 == 0 else -1]:
                if phase == "persist":
                    wall, store, _, n_fsync = persist_phase(args, groups, paths, root, layer_ids)
                else:  # the same bytes, group by group: a group's activations + JSONL share
                    seq_wall = sequential_phase(base / "sequential.bin",
                                                [per_group] * args.groups)
        persist_runs.append(nbytes / wall)
        store_runs.append(nbytes / store)
        seq_runs.append(per_group * args.groups / seq_wall)
        fsyncs.append(n_fsync / args.groups)
        shutil.rmtree(root)
        (base / "sequential.bin").unlink()
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(spool, ignore_errors=True)
    p, s = statistics.median(persist_runs), statistics.median(seq_runs)
    st = statistics.median(store_runs)
    paired = statistics.median(a / b for a, b in zip(persist_runs, seq_runs))
    paired_store = statistics.median(a / b for a, b in zip(store_runs, seq_runs))
    print(f"groups={args.groups} x {args.samples} samples, {args.layers} layers x {args.hidden}, "
          f"{args.in_flight} in flight, format {args.format}, {nbytes / args.groups / MB:.1f} MB per group, cpus={os.cpu_count()}")
    print(f"persist path     : {p / MB:7.1f} MB/s  (runs {[round(x / MB, 1) for x in persist_runs]})")
    print(f"  of which persist_group (store + index lines): {st / MB:7.1f} MB/s "
          f"(ratio {paired_store:.2f}); the rest is reading and casting the capture files")
    print(f"sequential write : {s / MB:7.1f} MB/s  (runs {[round(x / MB, 1) for x in seq_runs]})")
    print(f"ratio persist / sequential (median of the rounds' pairs): {paired:.2f}   "
          f"fsyncs per group: {statistics.median(fsyncs):.1f}")
    print(json.dumps({"bench": "ingest", "format": args.format, "groups": args.groups,
                      "samples": args.samples, "layers": args.layers, "hidden": args.hidden,
                      "mb_per_group": round(nbytes / args.groups / MB, 2), "rounds": args.rounds,
                      "in_flight": args.in_flight, "persist_MBps": round(p / MB, 1), "sequential_MBps": round(s / MB, 1),
                      "ratio_persist_vs_sequential": round(paired, 3),
                      "ratio_runs": [round(a / b, 3) for a, b in zip(persist_runs, seq_runs)],
                      "ratio_of_medians": round(p / s, 3),
                      "persist_group_MBps": round(st / MB, 1),
                      "ratio_persist_group_vs_sequential": round(paired_store, 3),
                      "fsyncs_per_group": statistics.median(fsyncs),
                      "persist_runs_MBps": [round(x / MB, 1) for x in persist_runs],
                      "sequential_runs_MBps": [round(x / MB, 1) for x in seq_runs]}))


if __name__ == "__main__":
    main()
