"""Every preset (and triviaqa) reads its dataset's Hugging Face layout: the bundled sample
rewritten with the hub's columns and nesting (tests/tasks/hf_layouts.py), as a Parquet file and
a ``save_to_disk`` directory, gives the same prompt groups as the released file. A file of the
wrong kind gets one line naming what the task reads and the ``--task qa`` flags; a ``.json``
file that holds JSON Lines is read as JSON Lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hallulog.config.run_config import RunConfig
from hallulog.config.specs import task_spec
from hallulog.tasks import PRESETS, FileKindError, load_task, open_task_spec
from hallulog.tasks.base import DatasetFormatError
from hallulog.tasks.records import holds_json_lines

from tests.tasks.hf_layouts import HF_DATASETS, hf_rows, write_layouts

TASKS = ["triviaqa", *PRESETS]
#: meta keys the Hugging Face layout has no field for
NOT_IN_HF = {"triviaqa": {"difficulty"}}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, dict[str, Path]]:
    out = tmp_path_factory.mktemp("hf")
    return {name: write_layouts(name, out / name) for name in TASKS}


def _view(groups, name: str) -> list[tuple]:
    drop = NOT_IN_HF.get(name, set())
    return [
        (
            g.prompt_id,
            g.dataset,
            g.split,
            g.dataset_id,
            g.messages,
            g.reference,
            {k: v for k, v in g.meta.items() if k not in drop},
        )
        for g in groups
    ]


def test_every_preset_has_a_layout():
    assert set(HF_DATASETS) == set(TASKS)


@pytest.mark.parametrize("kind", ["parquet", "hf"])
@pytest.mark.parametrize("name", TASKS)
def test_the_hf_layout_gives_the_released_files_groups(layouts, name, kind):
    released = load_task(name)
    hf = load_task(name, layouts[name][kind], split=released.split)
    assert not hf.malformed
    assert _view(hf.groups, name) == _view(released.groups, name)


def test_triviaqa_parquet_from_a_run_config(layouts):
    """``--task triviaqa --task-path X.parquet``: the config is accepted and the groups read."""
    for kind in ("parquet", "hf"):
        config = RunConfig(task="triviaqa", task_path=str(layouts["triviaqa"][kind]), limit=5)
        groups = list(open_task_spec(task_spec(config)).groups())
        assert [g.dataset_id for g in groups] == [
            "hl_0001",
            "hl_0002",
            "hl_0003",
            "hl_0004",
            "hl_0005",
        ]
        assert groups[0].reference["aliases"] == ["Johannes Kepler", "Kepler"]


def test_triviaqa_rows_as_json_lines_and_a_datasetdict(tmp_path):
    from datasets import Dataset, DatasetDict

    rows, features = hf_rows("triviaqa")
    ds = Dataset.from_list(rows[:6], features=features)
    ds.to_json(str(tmp_path / "validation.jsonl"))
    released = load_task("triviaqa", limit=6)
    lines = load_task("triviaqa", tmp_path / "validation.jsonl")
    assert _view(lines.groups, "triviaqa") == _view(released.groups, "triviaqa")
    DatasetDict({"train": ds.select([0]), "validation": ds}).save_to_disk(str(tmp_path / "dd"))
    picked = load_task("triviaqa", tmp_path / "dd", split="validation")
    assert [g.dataset_id for g in picked.groups] == [g.dataset_id for g in released.groups]
    assert {g.split for g in picked.groups} == {"validation"}  # the split named in the ids
    with pytest.raises(FileKindError, match="choose a split .available: train, validation."):
        load_task("triviaqa", tmp_path / "dd")


def test_triviaqa_bad_hf_rows_are_named_by_record(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, _ = hf_rows("triviaqa")
    rows = [dict(r) for r in rows[:3]]
    rows[1] = {**rows[1], "answer": {**rows[1]["answer"], "value": ""}}
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    data = load_task("triviaqa", tmp_path / "t.parquet")
    assert len(data.groups) == 2
    assert [str(m) for m in data.malformed] == [
        f"{tmp_path / 't.parquet'}:2: record 2: item 'hl_0002': missing or empty \"answer.value\""
    ]


def _one_line_error(name: str, path: Path) -> str:
    with pytest.raises(FileKindError) as caught:
        load_task(name, path)
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_a_file_of_the_wrong_kind_says_what_the_task_reads(layouts, tmp_path):
    squad = layouts["squad"]["parquet"]
    text = _one_line_error("nq_open", squad)
    assert f"{squad}:1: no valid question" in text
    assert "--task nq_open reads NQ-open.dev.jsonl" in text
    assert "--task qa --task-path FILE --question-field FIELD --answers-field FIELD" in text
    (tmp_path / "notes.txt").write_text("q\ta\n")
    text = _one_line_error("triviaqa", tmp_path / "notes.txt")
    assert "cannot tell the format from the extension '.txt'" in text
    assert "--task triviaqa reads the released JSON" in text and "mandarjoshi/trivia_qa" in text
    (tmp_path / "gsm.jsonl").write_bytes(b"PAR1\x00\xff\xfe binary")
    text = _one_line_error("gsm8k", tmp_path / "gsm.jsonl")
    assert "not valid UTF-8" in text and "--answer-kind numeric" in text
    (tmp_path / "t.csv").write_text("question,answer\nq,a\n")
    text = _one_line_error("triviaqa", tmp_path / "t.csv")
    assert "a CSV file, no TriviaQA layout" in text
    text = _one_line_error("mmlu", layouts["sciq"]["hf"])
    assert "cais/mmlu" in text and "--choices-field FIELD --answer-kind choice" in text


def test_a_bad_record_in_a_file_of_the_right_kind_keeps_its_own_message(tmp_path):
    doc = json.loads((Path(PRESETS["svamp"].bundled_path)).read_text())
    doc[2]["Answer"] = "many"
    (tmp_path / "SVAMP.json").write_text(json.dumps(doc))
    data = load_task("svamp", tmp_path / "SVAMP.json")
    assert len(data.groups) == len(doc) - 1
    assert "must be a number" in data.malformed[0].message and "reads" not in str(data.malformed[0])
    (tmp_path / "dup.json").write_text(json.dumps({"Data": [json.loads(json.dumps(doc[0]))]}))
    with pytest.raises(DatasetFormatError) as caught:  # not a TriviaQA item: its own message
        load_task("triviaqa", tmp_path / "dup.json")
    assert "QuestionId" in str(caught.value) and "--task triviaqa reads" not in str(caught.value)


HALUEVAL = [
    {
        "knowledge": "Paris is the capital of France.",
        "question": "What is the capital of France?",
        "right_answer": "Paris",
        "hallucinated_answer": "Lyon",
    },
    {
        "knowledge": "Water boils at 100 degrees Celsius at sea level.",
        "question": "At what temperature does water boil at sea level in Celsius?",
        "right_answer": "100",
        "hallucinated_answer": "90",
    },
]


def test_a_json_file_holding_json_lines_is_read_as_json_lines(tmp_path):
    qa_data = tmp_path / "qa_data.json"  # HaluEval's file: one object per line, named .json
    qa_data.write_text("".join(json.dumps(r) + "\n" for r in HALUEVAL))
    assert holds_json_lines(qa_data)
    config = RunConfig(task="qa", task_path=str(qa_data), answers_field="right_answer")
    groups = list(open_task_spec(task_spec(config)).groups())
    assert [g.reference["aliases"] for g in groups] == [["Paris"], ["100"]]
    gsm = tmp_path / "gsm.json"
    gsm.write_text(PRESETS["gsm8k"].bundled_path.read_text())
    assert [g.dataset_id for g in load_task("gsm8k", gsm).groups] == [
        g.dataset_id for g in load_task("gsm8k").groups
    ]
    trivia = tmp_path / "trivia.json"
    rows, _ = hf_rows("triviaqa")
    trivia.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    assert len(load_task("triviaqa", trivia).groups) == 4
    # --task-format json insists on one document: the error names the way out
    forced = RunConfig(
        task="qa", task_path=str(qa_data), answers_field="right_answer", task_format="json"
    )
    with pytest.raises(FileKindError, match="give --task-format jsonl"):
        list(open_task_spec(task_spec(forced)).groups())


def test_json_documents_are_not_json_lines(tmp_path):
    one_line = tmp_path / "one.json"
    one_line.write_text(json.dumps(HALUEVAL) + "\n")
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"data": HALUEVAL}, indent=1))
    lone = tmp_path / "lone.json"
    lone.write_text(json.dumps(HALUEVAL[0]) + "\n\n")
    assert not any(holds_json_lines(p) for p in (one_line, pretty, lone))
