"""A worker whose driver dies while the worker is still starting up must not work.

The case the chaos soak found: the driver restarts a dead worker and hands it the re-queued
groups at once (they wait in the worker's pipe); the driver is SIGKILLed before the new worker
has come up far enough to ask for its parent-death signal. That orphan used to read the groups
from its pipe, run them against the still-running backend and commit them — after the next
session had read the worker directories and given the same groups to another worker: one
prompt committed by two workers. Here a real driver process spawns a real worker with groups
in its pipe and SIGKILLs itself at once; the worker must exit without committing anything.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hallulog.contracts import layout
from hallulog.contracts.process import pid_alive

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def backend_url(tmp_path, instant_backend):
    return instant_backend(tmp_path / "spool", num_layer_ids=3, hidden_size=16, quiet=True)


DRIVER = """
import os, signal
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.orchestrator.run.slots import ProcessSlots, WorkerSlot
from hallulog.workers.worker import WorkerSpec

spec = WorkerSpec(
    worker_id=0, server_url={url!r}, model_name="m", worker_dir={wdir!r},
    storage_format="packed", layer_ids=(0, 1, 2), hidden_size=16, sequence_mode="response",
    dtype="float16", capture_mode="generation", k_samples=1, primary_temperature=0.0,
    sample_temperature=0.7, sample_top_p=0.95, max_tokens=4, seed=0, groups_in_flight=4,
    request_timeout=10.0, driver_pid={driver_pid},
)
slot = WorkerSlot(spec)
ProcessSlots().spawn(slot)
for i in range(4):  # the groups wait in the pipe while the worker starts up
    group = PromptGroup.create("triviaqa", "dev", i,
                               [{{"role": "user", "content": f"question {{i}}?"}}],
                               reference={{"value": "x", "aliases": ["x"]}})
    slot.conn.send(group)
print(slot.proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the driver dies before the worker is up
"""


def _orphan_commits(tmp_path: Path, url: str, *, guarded: bool) -> int:
    """Run the driver; wait for its orphaned worker to end; the prompt groups it committed."""
    wdir = tmp_path / ("guarded" if guarded else "unguarded") / "worker_0"
    code = textwrap.dedent(DRIVER).format(
        url=url, wdir=str(wdir), driver_pid="os.getpid()" if guarded else "None"
    )
    driver = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    worker_pid = int(driver.stdout.split()[0])
    deadline = time.monotonic() + 60
    while pid_alive(worker_pid, None):  # an orphan ends on its own once its pipe is drained
        assert time.monotonic() < deadline, "the orphaned worker did not end"
        time.sleep(0.05)
    index = wdir / layout.PROMPT_INDEX
    return len(index.read_text().splitlines()) if index.exists() else 0


def test_an_orphaned_worker_commits_nothing(tmp_path, backend_url):
    assert _orphan_commits(tmp_path, backend_url, guarded=True) == 0


def test_without_the_parent_check_the_orphan_commits(tmp_path, backend_url):
    """The scenario is real: a worker that does not check its parent commits the groups of
    its pipe after its driver died (what the check above prevents)."""
    assert _orphan_commits(tmp_path, backend_url, guarded=False) == 4
