"""A worker storing captures that come in the stored dtype (``hallulog_capture_dtype``) never
imports torch: ~200 MB of resident memory per worker process in the default job."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch
from safetensors.torch import save_file

SCRIPT = """
import sys
import numpy as np
from hallulog.workers import worker  # the worker process's module
from hallulog.workers.capture import select_rows
from hallulog.workers.capture_file import open_capture

with open_capture(sys.argv[1], list(range(12)), delete=False) as capture:
    rows = select_rows(capture, prompt_len=8, response_len=5, sequence_mode="response",
                       layer_index=None, dtype="float16")
assert rows.acts.shape == (31, 5, 64) and rows.acts.dtype == np.float16, rows.acts.shape
np.save(sys.argv[2], rows.acts)
print("torch" in sys.modules)
"""


def test_a_capture_in_the_stored_dtype_is_stored_without_torch(tmp_path):
    states = torch.randn(12, 31, 64).to(torch.float16)
    path = tmp_path / "capture.safetensors"
    save_file({"hidden_states": states, "token_ids": torch.arange(12)}, path)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path), str(tmp_path / "acts.npy")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    acts = np.load(tmp_path / "acts.npy")
    assert np.array_equal(acts, states[7:12].numpy().transpose(1, 0, 2))
