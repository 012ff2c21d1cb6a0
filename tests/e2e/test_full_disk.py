"""A full disk, kept real: the artifact root on a size-limited tmpfs.

The run must stop cleanly with one line naming the path, keep its checkpoint and committed work,
and complete once space is freed; consolidation and exports on a full disk likewise. The tmpfs
needs root (``mount``); where mounting is refused the tests skip and say so (RLIMIT_FSIZE limits
one file's size, not a filesystem's, so it cannot stand in for a full disk here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, read_jsonl, worker_rows

pytestmark = pytest.mark.e2e
BASE_PORT = "9310"


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a size-limited tmpfs ({proc.stderr.strip()}); a full "
            "filesystem cannot be made without it (RLIMIT_FSIZE caps one file only)"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path, leave: int) -> Path:
    """A filler file that leaves about ``leave`` bytes free."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    filler = mnt / "filler.bin"
    with open(filler, "wb") as f:
        f.truncate(0)
        block = b"\0" * (64 << 10)
        todo = max(free - leave, 0)
        while todo > 0:
            try:
                todo -= f.write(block[: min(len(block), todo)])
                f.flush()
            except OSError:
                break
    return filler


def _orchestrator(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--artifact-root",
            str(root),
            "--server-base-port",
            BASE_PORT,
            "--progress",
            "false",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


RUN = ("--limit", "3", "--k-samples", "1", "--max-tokens", "6", "--storage-format", "packed")


def test_generation_on_a_full_disk_stops_cleanly_and_resumes(small_fs):
    root = small_fs / "run"
    filler = _fill(small_fs, leave=700 << 10)
    # past the free-space check (its projection exceeds 700 kB): the disk fills up for real
    first = _orchestrator(root, *RUN, "--check-free-space", "false")
    assert first.returncode == 1, first.stderr[-3000:]
    line = _error_line(first)
    assert "No space left on device" in line and str(small_fs) in line, line
    # the checkpoint and the manifest are intact (parseable), committed work is kept
    json.loads((root / "run_manifest.json").read_text())
    if (root / "completed_prompts.json").exists():
        json.loads((root / "completed_prompts.json").read_text())
    before = {r["prompt_id"] for r in worker_rows(root, "prompt_index.jsonl")}
    filler.unlink()
    second = _orchestrator(root, *RUN)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "validation OK" in second.stdout
    prompts = read_jsonl(root / "consolidated" / "prompt_index.jsonl")
    assert len(prompts) == 3 and len({p["prompt_id"] for p in prompts}) == 3
    assert before <= {p["prompt_id"] for p in prompts}
    committed = [r["prompt_id"] for r in worker_rows(root, "prompt_index.jsonl")]
    assert sorted(committed) == sorted(set(committed)), "a prompt was committed twice"


def test_consolidation_and_exports_on_a_full_disk(small_fs, tmp_path):
    """Generation done elsewhere; the consolidation runs on a disk with no space left."""
    src = tmp_path / "done"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--artifact-root",
            str(src),
            "--server-base-port",
            BASE_PORT,
            "--progress",
            "false",
            "--consolidate",
            "false",
            *RUN,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = small_fs / "run"
    subprocess.run(["cp", "-a", str(src), str(root)], check=True)
    for leave in (0, 16 << 10):  # nothing left, then a little: fails in another file
        filler = _fill(small_fs, leave=leave)
        full = subprocess.run(
            [sys.executable, "-m", "orchestrator", "consolidate", "--artifact-root", str(root)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert full.returncode == 1, (leave, full.stdout, full.stderr[-3000:])
        line = _error_line(full)
        assert "No space left on device" in line and str(small_fs) in line, line
        filler.unlink()
    again = subprocess.run(
        [sys.executable, "-m", "orchestrator", "consolidate", "--artifact-root", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    prompts = read_jsonl(root / "consolidated" / "prompt_index.jsonl")
    assert len(prompts) == 3
