"""Small real run directories for the post-run tests (and bench/bench_scale.py --synthetic).

Worker directories are written by the real writer (``hallulog.workers.persist.WorkerDir``: the commit
protocol and the activation store), with rows shaped like the worker's (12 answer tokens, top-5
logprobs, logits) and tiny activations.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from hallulog.config.manifest import build_manifest, write_manifest
from hallulog.config.run_config import RunConfig
from hallulog.contracts.ids import activation_key, prompt_id_for
from hallulog.workers.persist import GenerationRecord, WorkerDir

LAYERS, HIDDEN, ANSWER_TOKENS = [3, 4], 8, 12
VOCAB = [
    "The",
    " answer",
    " is",
    " Paris",
    ",",
    " of",
    " course",
    ".",
    " It",
    " was",
    " in",
    " 1889",
]


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """Builds big fixtures fast: fsync is what a crash test needs, not a fixture."""
    real = os.fsync, os.fdatasync
    os.fsync = os.fdatasync = lambda fd: None  # type: ignore[assignment]
    try:
        yield
    finally:
        os.fsync, os.fdatasync = real


def prompt_ids(n: int) -> list[str]:
    return [prompt_id_for("triviaqa", "dev", i) for i in range(n)]


def generation_row(pid: str, sid: int, label: int | None) -> dict:
    logprobs = [
        {
            "token": VOCAB[j],
            "logprob": -0.05 - 0.01 * j,
            "top_logprobs": [
                {"token": VOCAB[(j + a) % len(VOCAB)], "logprob": -0.05 - a} for a in range(5)
            ],
            "logit": 12.0 - 0.1 * j,
        }
        for j in range(ANSWER_TOKENS)
    ]
    return {
        "prompt_id": pid,
        "sample_id": sid,
        "role": "primary" if sid == 0 else "sample",
        "text": "".join(VOCAB),
        "finish_reason": "length",
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": ANSWER_TOKENS,
            "total_tokens": 20 + ANSWER_TOKENS,
        },
        "logprobs": logprobs,
        "token_ids": list(range(1000, 1000 + ANSWER_TOKENS)),
        "request_params": {
            "temperature": 0.0 if sid == 0 else 0.7,
            "top_p": 1.0,
            "max_tokens": 12,
            "seed": 1000 + sid,
            "model": "m",
            "n": 1,
            "timestamp": "2026-01-01T00:00:00+00:00",
        },
        "generation_time_ms": 5,
        "label": label,
        "label_grader": "alias_match",
        "worker_id": 0,
        "activation_key": activation_key(pid, sid),
    }


def prompt_row(i: int, pid: str, label: int | None, completed_at: str) -> dict:
    question = f"Which city is meant by riddle {i}?"
    return {
        "prompt_id": pid,
        "dataset": "triviaqa",
        "split": "dev",
        "dataset_id": f"q{i}",
        "prompt": f"Answer briefly.\nQuestion: {question}\nAnswer:",
        "messages": [{"role": "user", "content": question}],
        "reference_answer": "Paris",
        "reference": {"value": "Paris", "aliases": ["Paris"], "normalized_aliases": ["paris"]},
        "label": label,
        "label_grader": "alias_match",
        "meta": {"question": question},
        "prompt_token_ids": list(range(20)),
        "num_generations": None,
        "worker_id": 0,
        "completed_at": completed_at,
    }


def write_manifest_for(root: Path, *, k: int, fmt: str, workers: int, prompts: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig(artifact_root=root, k_samples=k, storage_format=fmt, num_workers=workers)
    write_manifest(
        root,
        build_manifest(
            cfg,
            run_id=None,
            model_name="synthetic",
            model_path="-",
            layer_ids=LAYERS,
            hidden_size=HIDDEN,
            num_hidden_layers=4,
            dataset="triviaqa",
            split="dev",
            prompt_template="t",
            worker_count=workers,
            total_prompts=prompts,
        ),
    )


def open_worker(root: Path, wid: int, fmt: str) -> WorkerDir:
    return WorkerDir(
        root / f"worker_{wid}",
        worker_id=wid,
        storage_format=fmt,
        layer_ids=LAYERS,
        hidden_size=HIDDEN,
        dtype="float16",
    )


def commit(
    out: WorkerDir,
    i: int,
    pid: str,
    *,
    k: int,
    completed_at: str = "2026-01-01T00:00:00",
    samples: list[int] | None = None,
    no_acts: tuple[int, ...] = (),
) -> None:
    """Persist prompt ``i``'s group through the real commit protocol."""
    label = i % 2
    acts = np.full((len(LAYERS), 2, HIDDEN), i % 7, dtype=np.float16)
    records = []
    for sid in range(k + 1) if samples is None else samples:
        row = generation_row(pid, sid, label)
        row["worker_id"] = out.worker_id
        has = sid not in no_acts
        if not has:
            row["activation_key"] = None
        records.append(
            GenerationRecord(
                row=row,
                acts=acts if has else None,
                prompt_rows=1,
                response_rows=1,
                label=label,
                activation_row={
                    "prompt_id": pid,
                    "sample_id": sid,
                    "activation_key": activation_key(pid, sid),
                    "layers": LAYERS,
                    "sequence_mode": "response",
                    "capture_mode": "generation",
                    "prompt_token_count": 20,
                    "response_token_count": ANSWER_TOKENS,
                    "row0_position": 19,
                    "num_rows": 2,
                    "prompt_rows": 1,
                    "response_rows": 1,
                },
            )
        )
    prow = prompt_row(i, pid, label, completed_at)
    prow.update(worker_id=out.worker_id, num_generations=k + 1)
    out.persist_group(prow, records)


def build_run(
    root: Path,
    *,
    prompts: int,
    k: int = 2,
    workers: int = 2,
    fmt: str = "npy",
    durable: bool = True,
) -> list[str]:
    """A complete run: prompt i committed by worker i % workers. Returns the prompt ids."""
    pids = prompt_ids(prompts)
    write_manifest_for(root, k=k, fmt=fmt, workers=workers, prompts=prompts)
    with contextlib.nullcontext() if durable else no_fsync():
        dirs = [open_worker(root, w, fmt) for w in range(workers)]
        try:
            for i, pid in enumerate(pids):
                commit(dirs[i % workers], i, pid, k=k)
        finally:
            for d in dirs:
                d.close()
    return pids
