"""Bad captures in real runs of the real SmolLM2 model.

- Planted in the store after a run (``--limit 3``, npy and packed): one stored activation with a
  NaN in hidden dimension 0 of every row and layer, one zeroed; ``validate --deep`` catches and
  counts both (the run as it came: 0 of them).
- Written by the server: an embedded server with the capture fault hook
  (``$HALLULOG_CAPTURE_FAULTS``, serving/capture_faults.py) writes a zeroed, a NaN and a constant
  capture file; the worker counts each as a capture failure with its reason, the run completes
  and says so, the stored rows are clean, and ``retry`` (without the faults) completes the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hallulog.contracts import layout

from hallulog import storage
from tests.e2e.conftest import REPO, orchestrator_cmd, read_jsonl, worker_rows

pytestmark = pytest.mark.e2e

SMALL = ("--limit", "3", "--k-samples", "1", "--max-tokens", "8")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=env or dict(os.environ),
    )


def _run(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        orchestrator_cmd(root, *args),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=env or dict(os.environ),
    )


def _audit(root: Path) -> dict:
    return json.loads((layout.consolidated_dir(root) / layout.ALIGNMENT_AUDIT).read_text())


def _plant(root: Path, key: str, fault: str) -> None:
    """Overwrite one stored activation in place (every layer), through the store's extents."""
    whole = storage.open_store(layout.consolidated_dir(root))
    reader, i = whole, whole.index_of(key)
    if hasattr(whole, "readers"):  # consolidated packed: one store over the workers' stores
        s, i = whole._locate(i)
        reader = whole.readers[s]
    rows, width = reader.seq_len(i), reader.hidden_size * reader.dtype.itemsize
    for layer in range(reader.num_layers):
        file_no, offset = reader._extent(i, layer)
        with open(reader._file_path(file_no), "r+b") as f:
            f.seek(offset)
            acts = np.frombuffer(f.read(rows * width), reader.dtype).reshape(rows, -1).copy()
            if fault == "nan0":
                acts[:, 0] = np.nan
            else:
                acts[:] = 0
            f.seek(offset)
            f.write(acts.tobytes())
    whole.close()


@pytest.mark.parametrize("fmt", ["npy", "packed"])
def test_planted_zeros_and_nan_are_counted_by_validate_deep(tmp_path, fmt):
    root = tmp_path / fmt
    proc = _run(root, *SMALL, "--storage-format", fmt)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 capture(s) failed" in proc.stdout

    clean = _cli("validate", "--artifact-root", str(root), "--deep")
    assert clean.returncode == 0, clean.stdout + clean.stderr[-2000:]
    assert "capture check: 6 activations" in clean.stdout
    assert "OK (0 capture_nonfinite, 0 capture_zeros, 0 capture_constant)" in clean.stdout

    keys = [
        r["activation_key"]
        for r in read_jsonl(layout.consolidated_dir(root) / "activation_index.jsonl")
    ]
    nan_key, zero_key = keys[1], keys[4]
    _plant(root, nan_key, "nan0")
    _plant(root, zero_key, "zeros")
    bad = _cli("validate", "--artifact-root", str(root), "--deep")
    assert bad.returncode == 1, bad.stdout
    assert "1 capture_nonfinite, 1 capture_zeros" in bad.stdout
    audit = _audit(root)
    reasons = audit["capture_check"]["reasons"]
    assert reasons["capture_nonfinite"]["activations"] == 1
    assert reasons["capture_nonfinite"]["first_keys"][0]["activation_key"] == nan_key
    assert reasons["capture_zeros"]["activations"] == 1
    assert reasons["capture_zeros"]["first_keys"][0]["activation_key"] == zero_key
    assert reasons["capture_constant"]["activations"] == 0
    # the NaN leaves layer 0 comparable with the embeddings; the zeroed rows do not
    assert [m["activation_key"] for m in audit["mismatches"]] == [zero_key]


def test_bad_captures_from_the_server_are_capture_failures(tmp_path):
    root = tmp_path / "faults"
    env = dict(os.environ, HALLULOG_CAPTURE_FAULTS="zeros@2,nan0@4,constant@6")
    # npy: retry can store the captures again (a packed store cannot rewrite a committed key)
    args = (*SMALL, "--k-samples", "2", "--sequence-mode", "all", "--storage-format", "npy")
    proc = _run(root, *args, env=env)
    # the run completes; 3 of 9 generations without activations fail its validation (> 5 %)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3/3 prompts done" in proc.stdout and "validation FAILED" in proc.stdout
    assert (
        "3 (1 capture_constant, 1 capture_nonfinite, 1 capture_zeros) capture(s) failed"
        in proc.stdout
    ), proc.stdout
    errors = worker_rows(root, layout.ERRORS)
    assert sorted(e["reason"] for e in errors) == [
        "capture_constant",
        "capture_nonfinite",
        "capture_zeros",
    ]
    assert {e["error_type"] for e in errors} == {"capture_failed"}
    gens = worker_rows(root, layout.GENERATIONS)
    assert len(gens) == 9 and sum(g["activation_key"] is None for g in gens) == 3

    deep = _cli("validate", "--artifact-root", str(root), "--deep")
    assert "activations_missing" in deep.stdout
    assert "rows that failed the capture check: 1 capture_" in deep.stdout
    assert _audit(root)["capture_check"]["ok"]  # nothing bad was stored
    assert _audit(root)["capture_check"]["activations"] == 6

    retry = _cli("retry", "--artifact-root", str(root))  # the server without its faults
    assert retry.returncode == 0, retry.stdout + retry.stderr[-3000:]
    final = _cli("validate", "--artifact-root", str(root), "--deep")
    assert final.returncode == 0, final.stdout
    assert _audit(root)["capture_check"]["activations"] == 9
