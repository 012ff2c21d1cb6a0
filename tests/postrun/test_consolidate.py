"""Consolidation on small real worker directories (seconds): what is kept, in what order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.postrun.consolidate import consolidate

from tests.postrun.postrun_fixtures import build_run, commit, open_worker, prompt_ids


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("fmt", ["npy", "packed"])
def test_complete_run_is_consolidated_once_each(tmp_path: Path, fmt: str):
    pids = build_run(tmp_path, prompts=9, k=2, workers=2, fmt=fmt)
    result = consolidate(tmp_path)
    assert (result["prompts"], result["generations"], result["activations"]) == (9, 27, 27)
    out = layout.consolidated_dir(tmp_path)
    prompts = rows(out / layout.PROMPT_INDEX)
    # worker by worker, each in commit order
    assert [p["prompt_id"] for p in prompts] == pids[0::2] + pids[1::2]
    gens = rows(out / layout.GENERATIONS)
    assert [(g["prompt_id"], g["sample_id"]) for g in gens] == [
        (p["prompt_id"], s) for p in prompts for s in range(3)
    ]
    acts = rows(out / layout.ACTIVATION_INDEX)
    assert [a["activation_key"] for a in acts] == [
        f"{g['prompt_id']}_{g['sample_id']}" for g in gens
    ]
    assert all(a["label"] == int(pids.index(a["prompt_id"]) % 2) for a in acts)
    assert result["parquet"]["generations.parquet"] == 27


def test_latest_complete_commit_wins_and_partial_groups_are_dropped(tmp_path: Path):
    pids = build_run(tmp_path, prompts=6, k=2, workers=2)
    extra = prompt_ids(8)[6:]
    w0, w1 = open_worker(tmp_path, 0, "npy"), open_worker(tmp_path, 1, "npy")
    try:
        commit(w1, 0, pids[0], k=2, completed_at="2999-01-01")  # a retry: wins
        commit(w1, 2, pids[2], k=2, completed_at="1999-01-01")  # an older stamp: loses
        commit(w0, 6, extra[0], k=2, samples=[0, 1])  # incomplete: never kept
        commit(w0, 7, extra[1], k=2, no_acts=(1,))  # a capture failed: kept
    finally:
        w0.close()
        w1.close()
    # a group whose prompt row never made it, in the middle of worker_1's files
    gens = (tmp_path / "worker_1" / layout.GENERATIONS).read_text().splitlines(keepends=True)
    orphan = [json.dumps({**json.loads(g), "commit_id": "f" * 32}) + "\n" for g in gens[:3]]
    (tmp_path / "worker_1" / layout.GENERATIONS).write_text("".join(gens[:3] + orphan + gens[3:]))

    result = consolidate(tmp_path)
    out = layout.consolidated_dir(tmp_path)
    prompts = {p["prompt_id"]: p for p in rows(out / layout.PROMPT_INDEX)}
    assert result["prompts"] == len(prompts) == 7
    assert prompts[pids[0]]["worker_id"] == 1 and prompts[pids[0]]["completed_at"] == "2999-01-01"
    assert prompts[pids[2]]["worker_id"] == 0
    assert extra[0] not in prompts and extra[1] in prompts
    gens = rows(out / layout.GENERATIONS)
    assert len(gens) == 21 and len({(g["prompt_id"], g["sample_id"]) for g in gens}) == 21
    assert all(g["commit_id"] == prompts[g["prompt_id"]]["commit_id"] for g in gens)
    acts = rows(out / layout.ACTIVATION_INDEX)
    assert len(acts) == 20 and f"{extra[1]}_1" not in {a["activation_key"] for a in acts}


def test_judge_labels_are_joined(tmp_path: Path):
    pids = build_run(tmp_path, prompts=4, k=1, workers=1)
    (tmp_path / layout.LABELS).write_text(
        json.dumps(
            {
                "prompt_id": pids[0],
                "label": 1,
                "label_grader": "judge",
                "verdict": "wrong",
                "abstained": False,
                "judge_model": "m",
                "judge_raw": "WRONG",
            }
        )
        + "\n"
    )
    consolidate(tmp_path)
    out = layout.consolidated_dir(tmp_path)
    first = rows(out / layout.PROMPT_INDEX)[0]
    assert (first["label"], first["label_grader"], first["judge_verdict"]) == (1, "judge", "WRONG")
    assert [a["label"] for a in rows(out / layout.ACTIVATION_INDEX)[:2]] == [1, 0]


def test_rows_out_of_commit_order_stop_with_the_file_named(tmp_path: Path):
    build_run(tmp_path, prompts=4, k=1, workers=1)
    path = tmp_path / "worker_0" / layout.GENERATIONS
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[2:4] + lines[0:2] + lines[4:]))  # two groups swapped
    with pytest.raises(ArtifactError, match="generations.jsonl.*commit order"):
        consolidate(tmp_path)
    assert not (layout.consolidated_dir(tmp_path) / "generations.parquet").exists()


def test_exports_written_by_consolidation_equal_a_fresh_export(tmp_path: Path):
    from hallulog.exports.methods import EXPORT_FILES, write_exports

    build_run(tmp_path, prompts=5, k=2, workers=2)
    consolidate(tmp_path)
    exports = layout.exports_dir(tmp_path)
    first = {name: (exports / name).read_bytes() for name in EXPORT_FILES}
    assert write_exports(tmp_path)["geometry_inputs.jsonl"] == 5  # fresh: nothing redone
    assert {name: (exports / name).read_bytes() for name in EXPORT_FILES} == first
    (layout.consolidated_dir(tmp_path) / layout.GENERATIONS).touch()  # stale stamp
    for name in EXPORT_FILES:
        (exports / name).unlink()
    assert write_exports(tmp_path)["selfcheck_samples.jsonl"] == 5
    assert {name: (exports / name).read_bytes() for name in EXPORT_FILES} == first
