"""Task loaders: bundled samples, real-format parsing, malformed input, ids, limit."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hallulog.contracts.answer_match import alias_match_label, normalize_answer
from hallulog.contracts.ids import prompt_id_for
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.tasks import (
    BUNDLED_SAMPLES,
    TASKS,
    DatasetFormatError,
    MalformedLine,
    TaskData,
    bundled_path,
    load_task,
    open_task,
)
from hallulog.tasks.hallulens import ENTITY_PROMPT_TEMPLATES
from hallulog.tasks.presets import PRESETS
from hallulog.tasks.triviaqa import PROMPT_TEMPLATE


def _tqa_item(qid, question="What is the capital of France?", value="Paris", aliases=None, **extra):
    aliases = aliases if aliases is not None else [value, "Paris, France"]
    return {
        "Answer": {
            "Aliases": aliases,
            "NormalizedAliases": [normalize_answer(a) for a in aliases],
            "NormalizedValue": normalize_answer(value),
            "Type": "WikipediaEntity",
            "Value": value,
        },
        "EntityPages": [],
        "Question": question,
        "QuestionId": qid,
        "QuestionSource": "http://example.invalid/q",
        "SearchResults": [],
        **extra,
    }


def _write_tqa(path: Path, items, *, indent=2, split="dev") -> Path:
    doc = {"Data": items, "Domain": "Web", "Split": split, "VerifiedEval": False, "Version": 1.0}
    path.write_text(json.dumps(doc, indent=indent), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- bundled samples

ORIGINAL = ("triviaqa", "precisewikiqa", "longwiki", "mixedentities")
EXPECTED_MIN = {"triviaqa": 220, "precisewikiqa": 30, "longwiki": 30, "mixedentities": 30}
SAMPLED = tuple(t for t in TASKS if t != "qa")  # qa has no bundled sample


def test_tasks_and_samples_listed():
    assert set(TASKS) == {*ORIGINAL, *PRESETS, "qa"}
    for name in SAMPLED:
        assert bundled_path(name).is_file(), BUNDLED_SAMPLES[name]
    with pytest.raises(ValueError, match="--task-path"):
        bundled_path("qa")


@pytest.mark.parametrize("name", SAMPLED)
def test_bundled_sample_loads(name):
    data = load_task(name)
    assert isinstance(data, TaskData)
    assert len(data.groups) >= EXPECTED_MIN.get(name, 6)
    assert data.malformed == []
    assert Path(data.source) == bundled_path(name)
    assert data.prompt_template
    ids = [g.prompt_id for g in data.groups]
    assert len(set(ids)) == len(ids)
    assert len({g.dataset_id for g in data.groups}) == len(ids)
    for g in data.groups:
        assert isinstance(g, PromptGroup) and g.dataset == name
        assert g.prompt_id == prompt_id_for(name, g.split, g.dataset_id)
        assert len(g.prompt_id) == 16
        assert [m["role"] for m in g.messages] == ["user"]
        assert g.prompt_text.strip() and g.meta["question"].strip()
    # questions are distinct
    assert len({g.meta["question"] for g in data.groups}) == len(ids)


def test_bundled_triviaqa_content():
    data = load_task("triviaqa")
    assert data.split == "dev" and data.prompt_template == PROMPT_TEMPLATE
    difficulties = [g.meta["difficulty"] for g in data.groups]
    easy = difficulties.count("easy") / len(difficulties)
    assert set(difficulties) == {"easy", "hard"} and 0.25 <= easy <= 0.40
    # the first 20 (what --limit 20 runs) already mix both classes
    assert {"easy", "hard"} <= set(difficulties[:20])
    types = {g.meta["answer_type"] for g in data.groups}
    assert {"WikipediaEntity", "Numerical", "FreeForm"} <= types
    for g in data.groups:
        ref = g.reference
        assert ref["value"] in ref["aliases"]
        assert all(n == normalize_answer(n) and n for n in ref["normalized_aliases"])
        # the reference answer itself is graded correct, a refusal is not
        assert alias_match_label(ref["value"], ref["aliases"]) == 0
        assert alias_match_label("I don't know.", ref["aliases"]) == 1
        assert g.prompt_text == PROMPT_TEMPLATE.format(question=g.meta["question"])
        if g.meta["answer_type"] == "Numerical":  # digits and words both accepted
            assert any(a.isdigit() for a in ref["aliases"])
            assert any(a.replace("-", "").replace(" ", "").isalpha() for a in ref["aliases"])
    by_q = {g.meta["question"]: g for g in data.groups}
    paris = by_q["What is the capital of France?"]
    assert paris.dataset_id.startswith("hl_")
    assert alias_match_label("The capital of France is Paris.", paris.reference["aliases"]) == 0
    assert alias_match_label("Parisian", paris.reference["aliases"]) == 1


def test_bundled_triviaqa_file_is_in_released_schema():
    doc = json.loads(bundled_path("triviaqa").read_text(encoding="utf-8"))
    assert {"Data", "Domain", "Split", "Version"} <= set(doc)
    for item in doc["Data"]:
        assert {"Question", "QuestionId", "Answer"} <= set(item)
        ans = item["Answer"]
        assert {"Value", "NormalizedValue", "Aliases", "NormalizedAliases", "Type"} <= set(ans)
        assert ans["NormalizedAliases"] == list(
            dict.fromkeys(normalize_answer(a) for a in ans["Aliases"])
        )
        assert ans["NormalizedValue"] == normalize_answer(ans["Value"])


def test_bundled_hallulens_content():
    pw = load_task("precisewikiqa")
    assert all(g.reference["value"] and g.reference["document"] for g in pw.groups)
    assert {g.meta["h_score_cat"] for g in pw.groups} >= set(range(10))
    assert pw.groups[0].dataset_id == "0" and pw.groups[-1].dataset_id == str(len(pw.groups) - 1)
    lw = load_task("longwiki")
    assert all(len(g.reference["value"].split(". ")) >= 4 for g in lw.groups)  # long answers
    me = load_task("mixedentities")
    exists = [g.meta["entity_exists"] for g in me.groups]
    assert 0 < sum(exists) < len(exists)  # real and made-up names
    assert {g.meta["entity_type"] for g in me.groups} == {"animal", "plant", "bacteria", "medicine"}
    for g in me.groups:
        assert g.meta["entity_name"] in g.prompt_text
        assert g.reference["exists"] == g.meta["entity_exists"]


# ----------------------------------------------------------------------------- triviaqa formats


def test_triviaqa_released_format(tmp_path):
    minimal = _tqa_item("bb_3", "How many?")
    minimal["Answer"] = {"Value": "Three", "Aliases": ["Three", "3"]}  # no NormalizedAliases
    items = [
        _tqa_item("tc_1"),
        _tqa_item("sfq_22", "How many legs has a spider?", "8", ["8", "eight"]),
        minimal,
    ]
    path = _write_tqa(tmp_path / "unfiltered-web-dev.json", items)
    data = load_task("triviaqa", str(path))
    assert [g.dataset_id for g in data.groups] == ["tc_1", "sfq_22", "bb_3"]
    assert data.groups[0].prompt_id == prompt_id_for("triviaqa", "dev", "tc_1")
    assert data.source == str(path)
    # NormalizedAliases missing in the file: computed
    assert data.groups[2].reference["normalized_aliases"] == ["three", "3"]
    assert data.groups[1].reference["aliases"] == ["8", "eight"]


def test_triviaqa_split_comes_from_file(tmp_path):
    path = _write_tqa(tmp_path / "wikipedia-train.json", [_tqa_item("q1")], split="train")
    data = load_task("triviaqa", path)
    assert data.split == "train" and data.groups[0].prompt_id == prompt_id_for(
        "triviaqa", "train", "q1"
    )
    with pytest.raises(ValueError, match="declares"):
        load_task("triviaqa", path, split="dev")


def test_triviaqa_compact_single_line_file(tmp_path):
    path = _write_tqa(tmp_path / "d.json", [_tqa_item(f"q{i}") for i in range(5)], indent=None)
    assert len(load_task("triviaqa", path).groups) == 5


def test_triviaqa_human_answers_join_aliases(tmp_path):
    item = _tqa_item("q1")
    item["Answer"]["HumanAnswers"] = ["The City of Light"]
    data = load_task("triviaqa", _write_tqa(tmp_path / "d.json", [item]))
    assert "city of light" in data.groups[0].reference["normalized_aliases"]


def test_triviaqa_jsonl(tmp_path, caplog):
    lines = [
        json.dumps(_tqa_item("a")),
        "",
        json.dumps(_tqa_item("b")),
        "{not json",
        json.dumps({"QuestionId": "c", "Question": "no answer"}),
        json.dumps(_tqa_item("a")),
        json.dumps(_tqa_item("d")),
    ]
    path = tmp_path / "qs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="hallulog.tasks"):
        data = load_task("triviaqa", path)
    assert [g.dataset_id for g in data.groups] == ["a", "b", "d"]
    assert data.split == "dev"
    assert [(m.line, m.file) for m in data.malformed] == [
        (4, str(path)),
        (5, str(path)),
        (6, str(path)),
    ]
    assert "invalid JSON" in data.malformed[0].message
    assert "Answer" in data.malformed[1].message
    assert "duplicate QuestionId 'a'" in data.malformed[2].message
    assert f"{path}:4:" in caplog.text and f"{path}:5:" in caplog.text
    assert all(isinstance(m, MalformedLine) for m in data.malformed)
    with pytest.raises(DatasetFormatError, match=rf"{path.name}:4: invalid JSON"):
        load_task("triviaqa", path, strict=True)


# ----------------------------------------------------------------------------- malformed JSON


def _lines_of(path: Path, needle: str) -> int:
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if needle in line:
            return n
    raise AssertionError(needle)


def test_triviaqa_syntax_error_names_file_and_line(tmp_path):
    path = _write_tqa(tmp_path / "bad.json", [_tqa_item(f"q{i}") for i in range(4)])
    text = path.read_text()
    broken_line = _lines_of(path, '"QuestionId": "q2"')
    text = text.replace('"QuestionId": "q2"', '"QuestionId" "q2"')
    path.write_text(text)
    with pytest.raises(DatasetFormatError) as err:
        load_task("triviaqa", path)
    assert str(err.value).startswith(f"{path}:{broken_line}: invalid JSON")
    assert err.value.file == str(path) and err.value.line == broken_line
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda it: it.pop("Question"), 'missing or empty "Question"'),
        (lambda it: it.update(Question="  "), 'missing or empty "Question"'),
        (lambda it: it.pop("Answer"), 'missing "Answer" object'),
        (lambda it: it["Answer"].pop("Value"), "Answer.Value"),
        (lambda it: it["Answer"].update(Aliases="Paris"), "Answer.Aliases"),
        (lambda it: it["Answer"].update(NormalizedAliases=[1]), "Answer.NormalizedAliases"),
        (lambda it: it.pop("QuestionId"), "QuestionId"),
    ],
)
def test_triviaqa_invalid_item_names_its_line(tmp_path, mutate, message):
    items = [_tqa_item(f"q{i}") for i in range(5)]
    mutate(items[3])
    path = _write_tqa(tmp_path / "bad.json", items)
    # the item starts at the line holding its opening brace (indent=2 puts it on its own line)
    text = path.read_text().split("\n")
    opens = [n for n, line in enumerate(text, start=1) if line == "    {"]
    expected_line = opens[3]
    with pytest.raises(DatasetFormatError) as err:
        load_task("triviaqa", path)
    assert err.value.line == expected_line
    assert str(err.value).startswith(f"{path}:{expected_line}: ")
    assert message in str(err.value)


def test_triviaqa_duplicate_question_id_is_an_error(tmp_path):
    path = _write_tqa(
        tmp_path / "dup.json", [_tqa_item("x"), _tqa_item("y"), _tqa_item("x")], indent=None
    )
    path.write_text(path.read_text().replace('}, {"Answer"', '},\n{"Answer"'))
    with pytest.raises(
        DatasetFormatError, match=r"dup.json:3: duplicate QuestionId 'x' \(first on line 1\)"
    ):
        load_task("triviaqa", path)


@pytest.mark.parametrize(
    "content, line, message",
    [
        ("", 1, "empty file"),
        ("   \n", 1, "empty file"),
        ('{"Domain": "Web", "Split": "dev"}', 1, 'no "Data" list'),
        ('{"Data": []}', 1, "no questions"),
        ('"just a string"', 1, "expected a JSON object"),
        ('{"Data": [\n{"a": 1}\n] }\n{"more": 1}', 4, "unexpected data"),
        ('{"Data": [\n\n', 3, "invalid JSON"),
        ('{"Data": {"x": 1}}', 1, "expected '['"),
    ],
)
def test_triviaqa_unparseable_files(tmp_path, content, line, message):
    path = tmp_path / "x.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetFormatError) as err:
        load_task("triviaqa", path)
    assert err.value.line == line, str(err.value)
    assert message in str(err.value)


def test_not_utf8_names_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"prompt": "ok", "answer": "a"}\n{"prompt": "\xff\xfe", "answer": "b"}\n')
    with pytest.raises(DatasetFormatError, match=r"x.jsonl:2: not valid UTF-8"):
        load_task("precisewikiqa", path)


# ----------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("name", ["triviaqa", "precisewikiqa", "mixedentities"])
def test_open_task_streams_the_same_groups_as_load_task(name):
    stream = open_task(name, limit=25, shard="1/2")
    first, again = list(stream.groups()), list(stream.groups())
    assert (
        [g.prompt_id for g in first]
        == [g.prompt_id for g in again]
        == [g.prompt_id for g in load_task(name, limit=25, shard="1/2").groups]
    )
    assert first == again and 0 < len(first) < 25


def test_open_task_reads_a_jsonl_file_lazily(tmp_path):
    """The first group comes before the file is read to its end (a bad last line is only met
    when the reading gets there): a run never holds the whole task."""
    rows = [json.dumps(_tqa_item(f"q{i}")) for i in range(3)] + ["{not json"]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    groups = open_task("triviaqa", path, strict=True).groups()
    assert next(groups).meta["question"] == "What is the capital of France?"
    assert len([next(groups), next(groups)]) == 2
    with pytest.raises(DatasetFormatError, match=r"qa.jsonl:4: invalid JSON"):
        next(groups)


def test_a_bom_and_crlf_are_read_as_before(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_tqa_item("q0")).encode() + b"\r\n")
    assert [g.meta["question"] for g in open_task("triviaqa", path).groups()] == [
        "What is the capital of France?"
    ]


# ----------------------------------------------------------------------------- HalluLens formats


def _jsonl(path: Path, rows) -> Path:
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8"
    )
    return path


def test_precisewikiqa_malformed_lines_skipped_counted_named(tmp_path, caplog):
    good = {
        "title": "T",
        "h_score_cat": 3,
        "pageid": 12,
        "revid": 34,
        "description": "d",
        "categories": ["c"],
        "reference": "ref text",
        "prompt": "Q?",
        "answer": "A",
    }
    rows = [
        good,
        good | {"prompt": "Q2?"},
        "{broken",
        good | {"answer": ""},
        [1, 2],
        good | {"prompt": None, "question": "Raw generator field?"},
        good | {"answer": 5},
    ]
    path = _jsonl(tmp_path / "qa.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="hallulog.tasks"):
        data = load_task("precisewikiqa", path)
    assert [g.dataset_id for g in data.groups] == ["0", "1", "5"]  # line index, not renumbered
    assert data.groups[2].prompt_text == "Raw generator field?"
    assert [m.line for m in data.malformed] == [3, 4, 5, 7]
    for m in data.malformed:
        assert f"{path}:{m.line}:" in caplog.text
        assert str(m).startswith(f"{path}:{m.line}: ")
    assert "1 malformed" not in caplog.text and "4 malformed line(s) skipped" in caplog.text
    g = data.groups[0]
    assert g.reference == {"value": "A", "document": "ref text"}  # no aliases: judge-graded
    assert g.meta["pageid"] == 12 and g.meta["categories"] == ["c"] and g.meta["title"] == "T"
    assert g.split == "test" and g.prompt_id == prompt_id_for("precisewikiqa", "test", "0")


def test_hallulens_id_field_used_and_duplicates_skipped(tmp_path):
    rows = [
        {"id": "pw-7", "prompt": "Q?", "answer": "A"},
        {"id": "pw-7", "prompt": "Q2?", "answer": "B"},
        {"id": 9, "prompt": "Q3?", "answer": "C"},
        {"id": "", "prompt": "Q4?", "answer": "D"},
    ]
    data = load_task("precisewikiqa", _jsonl(tmp_path / "qa.jsonl", rows), split="custom")
    assert [g.dataset_id for g in data.groups] == ["pw-7", "9"]
    assert data.groups[0].prompt_id == prompt_id_for("precisewikiqa", "custom", "pw-7")
    assert ["duplicate id" in m.message for m in data.malformed] == [True, False]


def test_longwiki_answer_optional(tmp_path):
    rows = [{"title": "X", "prompt": "Describe X.", "reference": "X is..."}, {"title": "Y"}]
    data = load_task("longwiki", _jsonl(tmp_path / "lw.jsonl", rows))
    assert len(data.groups) == 1 and data.groups[0].reference["value"] is None
    assert data.malformed[0].line == 2 and "prompt" in data.malformed[0].message


def test_jsonl_with_only_bad_lines_is_an_error(tmp_path):
    path = _jsonl(tmp_path / "qa.jsonl", ["", "nope", "{}"])
    with pytest.raises(DatasetFormatError, match=r"qa.jsonl:2: no valid record"):
        load_task("precisewikiqa", path)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DatasetFormatError, match=r"empty.jsonl:1: the file holds no records"):
        load_task("longwiki", tmp_path / "empty.jsonl")


def test_mixedentities_csv_as_hallulens_writes_it(tmp_path):
    path = tmp_path / "0_2000.csv"
    path.write_text(
        "prompt,name,type\n"
        "What can be said about the animal Foo bar?,Foo bar,animal\n"
        '"Tell me, please, about the medicine Zyx",Zyx,medicine\n'
        "only,two\n"
        ",Baz qux,plant\n"
        '"multi\nline prompt about Q r",Q r,bacteria\n'
        "Describe the plant X,,plant\n",
        encoding="utf-8",
    )
    data = load_task("mixedentities", path)
    assert [g.dataset_id for g in data.groups] == ["0", "1", "3", "4"]
    assert data.groups[1].prompt_text == "Tell me, please, about the medicine Zyx"
    assert data.groups[2].prompt_text == ENTITY_PROMPT_TEMPLATES[3].format(
        type="plant", name="Baz qux"
    )
    assert data.groups[2].meta["prompt_from_template"] is True
    assert all(g.meta["entity_exists"] is False for g in data.groups)  # HalluLens: all made up
    assert [(m.line, m.message.split(" (")[0]) for m in data.malformed] == [
        (4, "expected 3 fields"),
        (8, 'missing or empty "name"'),
    ]


def test_mixedentities_exists_column(tmp_path):
    rows = [
        {"name": "Panthera leo", "type": "animal", "exists": True},
        {"name": "Felis nox", "type": "animal", "exists": "false"},
        {"name": "X", "type": "plant", "exists": "maybe"},
        {"name": "Y", "type_": "plant", "exists": 1},
    ]
    data = load_task("mixedentities", _jsonl(tmp_path / "me.jsonl", rows))
    assert [g.meta["entity_exists"] for g in data.groups] == [True, False, True]
    assert data.malformed[0].line == 3 and "exists" in data.malformed[0].message
    csv_path = tmp_path / "me.csv"
    csv_path.write_text("name,type,exists\nPanthera leo,animal,true\nFoo,plant,\n")
    assert [g.reference["exists"] for g in load_task("mixedentities", csv_path).groups] == [
        True,
        False,
    ]


def test_mixedentities_csv_without_header_columns(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("")
    with pytest.raises(DatasetFormatError, match=r"m.csv:1: empty file"):
        load_task("mixedentities", path)


# ----------------------------------------------------------------------------- limit, api


@pytest.mark.parametrize("name", SAMPLED)
def test_limit_keeps_first_items(name):
    full = load_task(name)
    part = load_task(name, limit=7)
    assert [g.prompt_id for g in part.groups] == [g.prompt_id for g in full.groups[:7]]
    assert len(load_task(name, limit=10_000).groups) == len(full.groups)


def test_limit_stops_before_later_malformed_lines(tmp_path):
    rows = [{"prompt": "Q1?", "answer": "A"}, {"prompt": "Q2?", "answer": "B"}, "{bad"]
    data = load_task("precisewikiqa", _jsonl(tmp_path / "qa.jsonl", rows), limit=2)
    assert len(data.groups) == 2 and data.malformed == []


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        load_task("squadron")
    with pytest.raises(ValueError, match="limit"):
        load_task("triviaqa", limit=0)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_task("triviaqa", tmp_path / "nope.json")


def test_ids_are_stable_across_loads():
    a = load_task("triviaqa", limit=5)
    b = load_task("triviaqa", str(bundled_path("triviaqa")), limit=5)
    assert [g.prompt_id for g in a.groups] == [g.prompt_id for g in b.groups]
    assert a.groups[0].prompt_id == prompt_id_for("triviaqa", "dev", a.groups[0].dataset_id)
