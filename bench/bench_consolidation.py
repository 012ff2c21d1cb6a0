"""Consolidation of a large synthetic run: N activation files (npy) across W worker dirs.

Builds a run directory with the real writer path (``hallulog.workers.persist.WorkerDir``, the npy store)
and tiny activations, then times ``consolidate`` (hard links) against a plain copy of the same
files measured in the same run, and the validator over the result.

    python bench/bench_consolidation.py --prompts 20000 --k-samples 4 --workers 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hallulog.postrun.consolidate  # noqa: E402,F401  (imported before timing)
from hallulog.config.manifest import build_manifest, write_manifest  # noqa: E402
from hallulog.config.run_config import RunConfig  # noqa: E402
from hallulog.contracts.ids import activation_key, prompt_id_for  # noqa: E402
from hallulog.postrun.consolidate import consolidate  # noqa: E402
from hallulog.postrun.validate import validate  # noqa: E402
from hallulog.workers.persist import GenerationRecord, WorkerDir  # noqa: E402

L, T, H = 4, 3, 8


def build(root: Path, prompts: int, k: int, workers: int) -> None:
    root.mkdir(parents=True)
    cfg = RunConfig(artifact_root=root, k_samples=k, storage_format="npy", num_workers=workers)
    write_manifest(
        root,
        build_manifest(
            cfg,
            run_id=None,
            model_name="synthetic",
            model_path="-",
            layer_ids=list(range(L)),
            hidden_size=H,
            num_hidden_layers=L - 1,
            dataset="triviaqa",
            split="dev",
            prompt_template="t",
            worker_count=workers,
            total_prompts=prompts,
        ),
    )
    dirs = [
        WorkerDir(
            root / f"worker_{w}",
            worker_id=w,
            storage_format="npy",
            layer_ids=list(range(L)),
            hidden_size=H,
            dtype="float16",
        )
        for w in range(workers)
    ]
    acts = np.ones((L, T, H), dtype=np.float16)
    for i in range(prompts):
        pid = prompt_id_for("triviaqa", "dev", i)
        out = dirs[i % workers]
        gens = []
        for sid in range(k + 1):
            key = activation_key(pid, sid)
            row = {
                "prompt_id": pid,
                "sample_id": sid,
                "role": "primary" if sid == 0 else "sample",
                "text": "x",
                "finish_reason": "stop",
                "usage": {},
                "token_ids": [1, 2, 3],
                "logprobs": [{"token": "x", "logprob": -0.1, "top_logprobs": []}] * 3,
                "request_params": {},
                "generation_time_ms": 1,
                "label": 0,
            }
            gens.append(
                GenerationRecord(
                    row=row,
                    acts=acts,
                    prompt_rows=1,
                    response_rows=2,
                    label=0,
                    activation_row={
                        "prompt_id": pid,
                        "sample_id": sid,
                        "activation_key": key,
                        "layers": list(range(L)),
                        "sequence_mode": "response",
                        "prompt_token_count": 1,
                        "response_token_count": 3,
                        "row0_position": 0,
                        "num_rows": T,
                    },
                )
            )
        out.persist_group(
            {
                "prompt_id": pid,
                "dataset_id": str(i),
                "prompt": "q",
                "label": 0,
                "meta": {},
                "completed_at": "t",
            },
            gens,
        )
    for d in dirs:
        d.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20000)
    parser.add_argument("--k-samples", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where to build (default: a temp dir)")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="hallulog-consolidation-"))
    root = base / "run"
    n_files = args.prompts * (args.k_samples + 1)
    try:
        t0 = time.perf_counter()
        build(root, args.prompts, args.k_samples, args.workers)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = consolidate(root)
        t_consolidate = time.perf_counter() - t0
        t0 = time.perf_counter()
        copy_dir = base / "copy"
        copy_dir.mkdir()
        for w in range(args.workers):
            for f in (root / f"worker_{w}" / "activations").iterdir():
                shutil.copy2(f, copy_dir / f.name)
        t_copy = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = validate(root)
        t_validate = time.perf_counter() - t0
        same_inode = sum(
            1
            for row in map(json.loads, open(root / "consolidated" / "activation_index.jsonl"))
            if os.stat(root / "consolidated" / row["file_path"]).st_ino
            == os.stat(root / row["source_path"]).st_ino
        )
        print(
            f"synthetic run: {args.prompts} prompts x {args.k_samples + 1} generations = "
            f"{n_files} activation files in {args.workers} worker dirs (built in {built:.1f} s)"
        )
        print(
            f"consolidate (hard links + JSONL merge): {t_consolidate:.2f} s "
            f"({result['activation_modes']}, {same_inode} same-inode files)"
        )
        print(
            f"plain copy of the same activation files: {t_copy:.2f} s "
            f"(ratio consolidate/copy = {t_consolidate / t_copy:.2f})"
        )
        print(f"validate: {t_validate:.2f} s, ok={report['ok']}")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
