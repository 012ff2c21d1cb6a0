"""Recovery of a worker directory fences its writer first (contracts/writer_lock.py): a
leftover writer of an earlier session, a real process, is ended before the directory is read."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from hallulog.contracts.writer_lock import WriterBusy
from hallulog.workers.persist import GenerationRecord, WorkerDir, recover_worker_dir

from tests.contracts.test_writer_lock import holder

LAYERS, HIDDEN, DTYPE = [0, 1], 4, "float16"


def test_recovery_fences_a_live_worker_dir_writer(tmp_path):
    """A leftover writer holding a worker directory (a worker of a killed session) is ended
    before recovery reads the directory; a directory this process writes is refused."""
    wdir = tmp_path / "worker_0"
    wd = WorkerDir(
        wdir,
        worker_id=0,
        storage_format="packed",
        layer_ids=LAYERS,
        hidden_size=HIDDEN,
        dtype=DTYPE,
    )
    gen = GenerationRecord(
        row={"prompt_id": "a" * 16, "sample_id": 0},
        acts=np.ones((2, 3, HIDDEN), dtype=np.float16),
        response_rows=3,
        activation_row={"prompt_id": "a" * 16, "sample_id": 0, "activation_key": "a" * 16 + "_0"},
    )
    wd.persist_group({"prompt_id": "a" * 16}, [gen])
    with pytest.raises(WriterBusy, match="this process still writes it"):
        recover_worker_dir(
            wdir, storage_format="packed", layer_ids=LAYERS, hidden_size=HIDDEN, dtype=DTYPE
        )
    wd.close()
    proc = holder(wdir)
    committed = recover_worker_dir(
        wdir, storage_format="packed", layer_ids=LAYERS, hidden_size=HIDDEN, dtype=DTYPE
    )
    assert committed == {"a" * 16}
    assert proc.wait(timeout=10) == -signal.SIGKILL
