"""--retry-failed's choice of prompts, quarantine, and resume refusing a malformed middle line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hallulog.contracts import layout
from hallulog.contracts.errors import MalformedLineError
from hallulog.postrun.repair import prompts_to_retry, quarantine_malformed_lines
from hallulog.workers.persist import recover_worker_dir

from tests.postrun.postrun_fixtures import (
    HIDDEN,
    LAYERS,
    build_run,
    commit,
    open_worker,
    prompt_ids,
)


def test_retry_picks_incomplete_missing_and_errored_prompts(tmp_path: Path):
    pids = build_run(tmp_path, prompts=4, k=2, workers=1)
    more = prompt_ids(7)[4:]
    w = open_worker(tmp_path, 0, "npy")
    try:
        commit(w, 4, more[0], k=2, samples=[0, 1])  # incomplete generations
        commit(w, 5, more[1], k=2, no_acts=(2,))  # a capture failed
        w.record_error(
            {
                "timestamp": "t",
                "error_type": "generation_failed",
                "prompt_id": pids[0],
                "sample_id": 0,
                "error_message": "x",
                "stack_trace": "",
            }
        )
    finally:
        w.close()
    # an activation file deleted after the fact
    act = json.loads((tmp_path / "worker_0" / layout.ACTIVATION_INDEX).read_text().splitlines()[3])
    (tmp_path / "worker_0" / act["file_path"]).unlink()
    expected = set(pids) | set(more)
    assert prompts_to_retry(tmp_path, expected) == {more[0], more[1], more[2], pids[1]}
    # pids[0] errored once but has a complete commit: not retried


def test_quarantine_moves_only_complete_malformed_lines(tmp_path: Path):
    build_run(tmp_path, prompts=3, k=1, workers=1)
    path = tmp_path / "worker_0" / layout.GENERATIONS
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2] + ["{broken\n"] + lines[2:]) + '{"torn')
    assert quarantine_malformed_lines(tmp_path / "worker_0") == 1
    assert path.read_text() == "".join(lines) + '{"torn'
    q = [
        json.loads(x) for x in (tmp_path / "worker_0" / "quarantine.jsonl").read_text().splitlines()
    ]
    assert q == [{"file": layout.GENERATIONS, "line": 3, "raw": "{broken\n"}]


@pytest.mark.parametrize("name", [layout.GENERATIONS, layout.PROMPT_INDEX, layout.ACTIVATION_INDEX])
def test_resume_stops_at_a_malformed_middle_line_and_changes_nothing(tmp_path: Path, name: str):
    build_run(tmp_path, prompts=3, k=1, workers=1, fmt="packed")
    wdir = tmp_path / "worker_0"
    path = wdir / name
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = "not json at all\n"
    path.write_text("".join(lines))
    before = {p: p.read_bytes() for p in wdir.rglob("*") if p.is_file()}
    with pytest.raises(MalformedLineError) as err:
        recover_worker_dir(
            wdir, storage_format="packed", layer_ids=LAYERS, hidden_size=HIDDEN, dtype="float16"
        )
    assert f"{path}:2:" in str(err.value)
    assert {p: p.read_bytes() for p in wdir.rglob("*") if p.is_file()} == before
