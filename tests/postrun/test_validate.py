"""Validation on small real directories: clean runs pass, each problem is named with its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hallulog.contracts import layout
from hallulog.postrun.consolidate import consolidate
from hallulog.postrun.validate import validate

from tests.postrun.postrun_fixtures import build_run


def _by_class(report: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in report["problems"]:
        out.setdefault(p["class"], []).append(p)
    return out


def test_clean_run_validates(tmp_path: Path):
    pids = build_run(tmp_path, prompts=6, k=2, workers=2, fmt="packed")
    consolidate(tmp_path)
    report = validate(tmp_path, expected_prompt_ids=set(pids))
    assert report["ok"] and report["problems"] == []
    assert report["counts"] == {"prompts": 6, "generations": 18, "activations": 18}


def test_problems_are_named_with_file_and_line(tmp_path: Path):
    pids = build_run(tmp_path, prompts=6, k=2, workers=2)
    consolidate(tmp_path)
    out = layout.consolidated_dir(tmp_path)
    gens = (out / layout.GENERATIONS).read_text().splitlines(keepends=True)
    gens.insert(7, gens[1])  # duplicate generation, line 8
    del gens[12]  # a missing sample
    (out / layout.GENERATIONS).write_text("".join(gens))
    acts = (out / layout.ACTIVATION_INDEX).read_text().splitlines(keepends=True)
    orphan = {**json.loads(acts[0]), "sample_id": 7, "activation_key": f"{pids[0]}_7"}
    (out / layout.ACTIVATION_INDEX).write_text("".join(acts[1:]) + json.dumps(orphan) + "\n")
    report = validate(tmp_path, expected_prompt_ids=set(pids) | {"0" * 16})
    assert not report["ok"]
    found = _by_class(report)
    dup = found["duplicate_id"][0]
    assert (dup["file"], dup["line"]) == ("consolidated/generations.jsonl", 8)
    assert "lines [2, 8]" in dup["message"]
    assert found["missing_samples"][0]["prompt_id"] in pids
    assert found["incomplete_prompts"][0]["prompt_id"] == "0" * 16
    orphan_lines = [p["line"] for p in found["orphaned_activation"] if p["line"]]
    assert orphan_lines == [11, len(acts)]  # the deleted generation's activation, and ours
    # the first generation lost its activation row: named at its generations.jsonl line
    assert found["missing_activation"][0]["line"] == 1
    (out / "activations" / "stray.npy").write_bytes(b"")
    stray = _by_class(validate(tmp_path))["orphaned_activation"][-1]
    assert (stray["file"], stray["line"]) == ("consolidated/activations/stray.npy", None)


def test_malformed_line_in_the_middle_of_a_worker_file(tmp_path: Path):
    build_run(tmp_path, prompts=4, k=1, workers=1)
    consolidate(tmp_path)
    path = tmp_path / "worker_0" / layout.GENERATIONS
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = "{not json\n"
    path.write_text("".join(lines))
    before = {p: p.read_bytes() for p in (tmp_path / "worker_0").glob("*.jsonl")}
    report = validate(tmp_path)
    bad = _by_class(report)["malformed_line"]
    assert (bad[0]["file"], bad[0]["line"]) == ("worker_0/generations.jsonl", 4)
    assert not report["ok"] and "hallulog retry" in report["repair"]["malformed_line"]
    assert {p: p.read_bytes() for p in before} == before  # nothing deleted or rewritten


def _per_field_ok(name: str, row: dict) -> bool:
    from hallulog.postrun.row_schemas import SCHEMAS as FIELDS

    return all(key in row and ok(row[key]) for key, ok in FIELDS[name].items())


@pytest.mark.parametrize("name", [layout.GENERATIONS, layout.ACTIVATION_INDEX])
def test_one_call_row_checks_equal_the_per_field_checks(name: str):
    import copy

    from hallulog.postrun.row_schemas import _ROW_OK
    from hallulog.postrun.row_schemas import SCHEMAS as FIELDS

    from tests.postrun.postrun_fixtures import generation_row

    good = (
        generation_row("0123456789abcdef", 1, 0)
        if name == layout.GENERATIONS
        else {
            "prompt_id": "0123456789abcdef",
            "sample_id": 1,
            "activation_key": "k",
            "layers": [3, 4],
            "sequence_mode": "response",
            "prompt_token_count": 20,
            "response_token_count": 12,
            "shape": [2, 2, 8],
            "dtype": "float16",
            "size_bytes": 64,
            "worker_id": 0,
        }
    )
    odd_values = [
        None,
        True,
        1,
        -1,
        4096,
        1.5,
        "x",
        "all",
        "primary",
        "float16",
        "last",
        [],
        [1, 2, 3],
        [1, True, 3],
        {},
        "0123456789ABCDEF",
        [{"token": "a", "logprob": None, "top_logprobs": []}],
        [{"token": "a", "logprob": "x", "top_logprobs": []}],
        [{"token": "a", "top_logprobs": []}],
        [None],
    ]
    rows = [good]
    for key in FIELDS[name]:
        rows.append({k: v for k, v in good.items() if k != key})
        for value in odd_values:
            row = copy.deepcopy(good)
            row[key] = value
            rows.append(row)
    for row in rows:
        assert _ROW_OK[name](row) == _per_field_ok(name, row), row
    assert _ROW_OK[name](good)


def test_optional_label_fields_are_checked_when_present():
    from hallulog.postrun.row_schemas import schema_errors

    from tests.postrun.postrun_fixtures import generation_row

    good = generation_row("0123456789abcdef", 1, 0)
    assert schema_errors(layout.GENERATIONS, good) == []  # older rows: no such fields
    ok = {**good, "label_status": "unparsed", "answer_span": [3, 7]}
    assert schema_errors(layout.GENERATIONS, ok) == []
    assert (
        schema_errors(layout.GENERATIONS, {**ok, "label_status": None, "answer_span": None}) == []
    )
    for key, value in (
        ("label_status", "maybe"),
        ("answer_span", [7, 3]),
        ("answer_span", [1]),
        ("answer_span", "1-2"),
    ):
        errs = schema_errors(layout.GENERATIONS, {**ok, key: value})
        assert len(errs) == 1 and repr(key) in errs[0], (key, value)
    prompt = {
        "prompt_id": "0123456789abcdef",
        "dataset_id": "0",
        "prompt": "Q",
        "label": 1,
        "meta": {},
        "label_status": "bogus",
    }
    assert schema_errors(layout.PROMPT_INDEX, prompt) == [
        "field 'label_status' has an invalid value 'bogus'"
    ]
