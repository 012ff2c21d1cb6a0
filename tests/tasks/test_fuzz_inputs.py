"""Property-based tests (hypothesis) over the orchestrator's readers of hostile input.

Task files of every task, JSONL files (contracts/jsonl.py), run_manifest.json and
completed_prompts.json get truncated, corrupted and random bytes; see tests/fuzzing.py for the
contract they keep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hallulog.config.manifest import load_manifest
from hallulog.contracts.jsonl import iter_lines
from hallulog.orchestrator.run.checkpoint import load_completed
from hallulog.tasks import TASKS, bundled_path, load_task
from hypothesis import given

from tests.fuzzing import FUZZ, check_reader, mutations, write_mutated


def _small_sample(task: str) -> bytes:
    data = bundled_path(task).read_bytes()
    if bundled_path(task).suffix in (".jsonl", ".csv", ".tsv"):
        return b"".join(data.splitlines(keepends=True)[:4])
    doc = json.loads(data)
    if isinstance(doc, dict) and "Data" in doc:  # TriviaQA; the presets' samples are small
        doc["Data"] = doc["Data"][:3]
    return json.dumps(doc, indent=1).encode()


@pytest.mark.parametrize("task", [t for t in TASKS if t != "qa"])
@FUZZ
@given(m=mutations)
def test_task_files(tmp_path, task, m):
    path = tmp_path / f"fuzz-{task}{bundled_path(task).suffix}"
    write_mutated(path, _small_sample(task), m)
    for strict in (False, True):
        check_reader(
            lambda strict=strict: load_task(task, path, strict=strict),
            names=[path.name],
            root=tmp_path,
        )


ROWS = [{"prompt_id": f"{i:016x}", "sample_id": i, "text": "é ok", "n": [1, 2]} for i in range(4)]


@FUZZ
@given(m=mutations)
def test_jsonl_files(tmp_path, m):
    path = tmp_path / "generations.jsonl"
    original = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    write_mutated(path, original, m)
    err = check_reader(lambda: list(iter_lines(path)), names=[str(path)], root=tmp_path)
    if err is not None:
        assert getattr(err, "line", None), "a malformed line error names its line"
    skipped = []
    check_reader(
        lambda: skipped.extend(iter_lines(path, malformed="skip")), names=[], root=tmp_path
    )  # skip mode never raises
    for line in skipped:
        assert isinstance(line.row, dict)


@FUZZ
@given(m=mutations)
def test_run_manifest(tmp_path, m):
    path = tmp_path / "run_manifest.json"
    original = json.dumps(
        {"run_id": "r", "config": {"k_samples": 2}, "k_samples": 2}, indent=2
    ).encode()
    write_mutated(path, original, m)
    check_reader(lambda: load_manifest(tmp_path), names=[str(path)], root=tmp_path)


@FUZZ
@given(m=mutations)
def test_completed_prompts(tmp_path, m):
    path = tmp_path / "completed_prompts.json"
    original = json.dumps({"run_id": "r", "completed": ["a" * 16, "b" * 16]}).encode()
    write_mutated(path, original, m)
    check_reader(lambda: load_completed(tmp_path), names=[str(path)], root=tmp_path)


def test_the_contract_catches_a_bad_reader(tmp_path):
    """The harness itself: an undocumented exception fails it."""
    with pytest.raises(KeyError):
        check_reader(lambda: {}["x"], names=["x"], root=tmp_path)
    assert Path(tmp_path).exists()
