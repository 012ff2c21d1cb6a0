"""Record readers (every format), the field-mapped QA task and the released-layout presets."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hallulog.tasks.base import DatasetFormatError, MalformedCollector
from hallulog.tasks.presets import (
    CHOICE_TEMPLATE,
    NUMERIC_TEMPLATE,
    PRESETS,
    SHORT_CONTEXT_TEMPLATE,
    SHORT_TEMPLATE,
    iter_preset_records,
)
from hallulog.tasks.presets.closed_form import sciq_order
from hallulog.tasks.qa import (
    FieldMapping,
    QAOptions,
    QARecord,
    format_number,
    iter_qa_records,
    parse_aliases,
    parse_number,
    resolve_choice,
)
from hallulog.tasks.records import (
    RecordAt,
    describe_where,
    detect_format,
    get_field,
    iter_parquet,
    iter_records,
)

RELEASED = Path(__file__).parent / "data" / "released"


def _collector(path="f", strict=False) -> MalformedCollector:
    return MalformedCollector(str(path), strict=strict, quiet=True)


def _read(path, **kw):
    c = _collector(path)
    return list(iter_records(path, collector=c, **kw)), c


def _qa(path, strict=False, limit=None, **opts):
    mapping = opts.pop("mapping", FieldMapping())
    c = _collector(path, strict)
    return list(
        iter_qa_records(path, QAOptions(mapping=mapping, **opts), limit=limit, collector=c)
    ), c


def _preset(name, path=None, **kw):
    c = _collector(path or name)
    kw.setdefault("with_context", False)
    kw.setdefault("numeric_tolerance", 1e-6)
    return list(
        iter_preset_records(
            name, path, split=kw.pop("split", None), limit=kw.pop("limit", None), collector=c, **kw
        )
    ), c


def _write_jsonl(path: Path, lines) -> Path:
    path.write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines),
        encoding="utf-8",
    )
    return path


# ============================================================================= records.py


def test_detect_format(tmp_path):
    for name, fmt in (
        ("a.jsonl", "jsonl"),
        ("a.NDJSON", "jsonl"),
        ("a.json", "json"),
        ("a.csv", "csv"),
        ("a.tsv", "tsv"),
        ("a.parquet", "parquet"),
    ):
        (tmp_path / name).write_text("", encoding="utf-8")
        assert detect_format(tmp_path / name) == fmt
    assert detect_format(tmp_path) == "hf"
    (tmp_path / "a.txt").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="extension"):
        detect_format(tmp_path / "a.txt")
    assert detect_format(tmp_path / "a.txt", "jsonl") == "jsonl"
    with pytest.raises(ValueError, match="directory"):
        detect_format(tmp_path / "a.txt", "hf")
    with pytest.raises(ValueError, match="unknown format"):
        detect_format(tmp_path / "a.txt", "xml")
    with pytest.raises(FileNotFoundError):
        detect_format(tmp_path / "nope.jsonl")


def test_get_field_and_describe_where():
    rec = {"a": {"b": [{"c": 1}, {"c": 2}]}, "x.y": 5, "s": None}
    assert get_field(rec, "a.b.1.c") == 2
    assert get_field(rec, "x.y") == 5
    assert get_field(rec, "s") is None
    assert get_field(rec, "a.b.7.c", "dflt") == "dflt"
    with pytest.raises(KeyError):
        get_field(rec, "a.z")
    assert describe_where("f.jsonl", 12, 3) == "f.jsonl:12"
    assert describe_where("f.parquet", None, 3) == "f.parquet: record 4"


def test_jsonl_records_lines_and_malformed(tmp_path):
    p = _write_jsonl(tmp_path / "d.jsonl", [{"q": 1}, "", "{broken", "[1, 2]", {"q": 2}])
    recs, c = _read(p)
    assert recs == [RecordAt(1, 0, {"q": 1}), RecordAt(5, 3, {"q": 2})]
    assert [(m.line, m.message.split(":")[0]) for m in c.items] == [
        (3, "invalid JSON"),
        (4, "expected a JSON object, got list"),
    ]


def _json_lines(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_json_list_items_named_by_their_first_line(tmp_path):
    items = [{"q": "one"}, "not an object", {"q": "three"}]
    p = tmp_path / "d.json"
    p.write_text(json.dumps(items, indent=2), encoding="utf-8")
    recs, c = _read(p)
    text = p.read_text()
    assert [r.index for r in recs] == [0, 2]
    assert recs[1].line == _json_lines(text, '"three"') - 1  # the line of its '{'
    assert c.items[0].line == _json_lines(text, "not an object")


def test_json_records_key_default_dotted_and_errors(tmp_path):
    recs, _ = _read(RELEASED / "qa-nested.json", records_key="payload.items")
    assert [r.record["uid"] for r in recs] == ["n1", "n2", "n3"]
    assert recs[0].line == 7 and recs[2].line == 10
    # the only list-valued top-level key is the default
    p = tmp_path / "d.json"
    p.write_text(json.dumps({"version": 2, "data": [{"q": 1}, {"q": 2}]}), encoding="utf-8")
    assert [r.record["q"] for r in _read(p)[0]] == [1, 2]
    p.write_text(json.dumps({"rows": [[{"q": 1}], [{"q": 9}]]}), encoding="utf-8")
    assert [r.record["q"] for r in _read(p, records_key="rows.1")[0]] == [9]
    # ambiguous: names the keys
    p.write_text(json.dumps({"train": [{"q": 1}], "dev": [{"q": 2}]}), encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="'train', 'dev'"):
        _read(p)
    assert [r.record["q"] for r in _read(p, records_key="dev")[0]] == [2]
    with pytest.raises(DatasetFormatError, match=r"no 'test'.*keys: 'train', 'dev'"):
        _read(p, records_key="test")
    p.write_text(json.dumps({"a": 1}), encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="no list of records.*'a'"):
        _read(p)
    p.write_text(json.dumps({"a": {"b": 1}}), encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="does not hold a list"):
        _read(p, records_key="a.b")


def test_json_unparseable_documents(tmp_path):
    p = tmp_path / "d.json"
    for text, line, what in (
        ("", 1, "empty file"),
        ('[\n{"q": 1},\n{"q": }\n]', 3, "invalid JSON"),
        ('[{"q": 1}] [', 1, "unexpected data"),
        ("42", 1, "expected a JSON list"),
    ):
        p.write_text(text, encoding="utf-8")
        with pytest.raises(DatasetFormatError, match=what) as exc:
            _read(p)
        assert exc.value.line == line, text


def test_json_syntax_error_before_any_record(tmp_path):
    p = tmp_path / "d.json"
    p.write_text("[" + ",".join(json.dumps({"q": i}) for i in range(50)) + ",}", encoding="utf-8")
    it = iter_records(p, collector=_collector())
    with pytest.raises(DatasetFormatError):
        next(it)


def test_csv_and_tsv_records(tmp_path):
    recs, c = _read(RELEASED / "qa-context.csv")
    assert [r.line for r in recs] == [2, 3, 5, 6]  # q-002's passage spans two lines
    assert recs[1].record["passage"].count("\n") == 1
    assert c.items == []
    p = tmp_path / "d.csv"
    p.write_text("a,b\n1,2\n\n3\n4,5,6\n7,8\n", encoding="utf-8")
    recs, c = _read(p)
    assert [(r.line, r.index, r.record) for r in recs] == [
        (2, 0, {"a": "1", "b": "2"}),
        (6, 3, {"a": "7", "b": "8"}),
    ]
    assert [(m.line, m.message) for m in c.items] == [
        (4, "expected 2 fields (a, b), got 1"),
        (5, "expected 2 fields (a, b), got 3"),
    ]
    t = tmp_path / "d.tsv"
    t.write_text('a\tb\nx, y\t"[""z""]"\n', encoding="utf-8")
    assert _read(t)[0][0].record == {"a": "x, y", "b": '["z"]'}
    p.write_text("", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="header"):
        _read(p)
    p.write_text('a,b\n1,"2\n', encoding="utf-8")
    with pytest.raises(DatasetFormatError):
        _read(p)


def _write_parquet(path: Path, rows: list[dict], row_group_size: int | None = None) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def test_parquet_records_have_no_line(tmp_path):
    p = _write_parquet(
        tmp_path / "d.parquet", [{"question": f"q{i}", "answer": [f"a{i}"]} for i in range(5)]
    )
    recs, _ = _read(p)
    assert [(r.line, r.index) for r in recs] == [(None, i) for i in range(5)]
    assert recs[3].record == {"question": "q3", "answer": ["a3"]}
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DatasetFormatError, match="Parquet"):
        _read(tmp_path / "bad.parquet")


def test_parquet_streams_batch_by_batch(tmp_path, monkeypatch):
    p = _write_parquet(
        tmp_path / "big.parquet", [{"question": f"q{i}"} for i in range(5000)], row_group_size=500
    )
    pulled = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        for batch in original(self, *args, **kwargs):
            pulled.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    it = iter_parquet(p, batch_size=100)
    first = next(it)
    assert first.record == {"question": "q0"}
    assert pulled == [100]  # one batch read, not the table
    assert sum(1 for _ in it) == 4999
    assert sum(pulled) == 5000


def test_hf_save_to_disk_dataset_and_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"question": f"q{i}", "answers": {"text": [f"a{i}"], "answer_start": [0]}} for i in range(6)
    ]
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "one"), num_shards=2)
    recs, _ = _read(tmp_path / "one")
    assert [r.record["question"] for r in recs] == [f"q{i}" for i in range(6)]
    assert all(r.line is None for r in recs) and [r.index for r in recs] == list(range(6))
    dd = datasets.DatasetDict({"train": ds.select(range(2)), "validation": ds.select(range(2, 6))})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DatasetFormatError, match="choose a split.*train, validation"):
        _read(tmp_path / "dd")
    with pytest.raises(DatasetFormatError, match="no split 'test'.*train, validation"):
        _read(tmp_path / "dd", split="test")
    recs, _ = _read(tmp_path / "dd", split="validation")
    assert [r.record["question"] for r in recs] == ["q2", "q3", "q4", "q5"]
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "single"))
    assert len(_read(tmp_path / "single")[0]) == 6  # one split: no need to name it
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetFormatError, match="save_to_disk"):
        _read(tmp_path / "empty")
    # through the QA mapping: HF SQuAD-style answers; problems are named by record number
    bad = datasets.Dataset.from_list(
        [
            {"question": "ok?", "answers": {"text": ["yes"]}},
            {"question": "", "answers": {"text": ["no"]}},
        ]
    )
    bad.save_to_disk(str(tmp_path / "bad"))
    out, c = _qa(tmp_path / "bad")
    assert [r.reference["aliases"] for r in out] == [["yes"]]
    assert [(m.line, m.message) for m in c.items] == [
        (2, 'record 2: field "question" (--question-field) is empty')
    ]


# ============================================================================= qa.py


def test_qa_csv_with_context_and_json_answers():
    mapping = FieldMapping(question="query", answers="gold", id="qid", context="passage")
    recs, c = _qa(RELEASED / "qa-context.csv", mapping=mapping)
    assert c.items == []
    assert [r.dataset_id for r in recs] == ["q-001", "q-002", "q-003", "q-004"]
    r = recs[0]
    assert isinstance(r, QARecord) and r.line == 2 and r.index == 0
    assert r.reference == {
        "kind": "aliases",
        "value": "white",
        "aliases": ["white", "white with a red band"],
    }
    assert r.fields["question"] == "What colour is the Varnholm lighthouse?"
    assert r.fields["context"].startswith("The Varnholm lighthouse")
    assert r.fields["answer"] == "white"
    assert r.fields["choices"] is None and r.fields["choices_text"] is None
    assert r.fields["letters"] is None and r.fields["record"]["qid"] == "q-001"
    assert r.meta == {"question": r.fields["question"], "context": r.fields["context"]}
    assert recs[2].reference["aliases"] == ["lamp oil"]  # a plain cell
    assert recs[3].reference["aliases"] == ["1902"]  # a JSON list of a number
    json.dumps([x.meta for x in recs])


def test_qa_nested_json_and_unanswerable():
    mapping = FieldMapping(question="q.text", answers="gold", id="uid")
    recs, _ = _qa(RELEASED / "qa-nested.json", mapping=mapping, records_key="payload.items")
    assert recs[0].reference["aliases"] == ["4", "four"]
    assert recs[2].reference == {
        "kind": "aliases",
        "value": None,
        "aliases": [],
        "unanswerable": True,
    }
    assert recs[2].fields["answer"] is None


def test_qa_default_answer_keys_and_ids(tmp_path):
    p = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"question": " A? ", "answer": "x"},
            {"question": "B?", "answers": ["y", "y", " z "]},
            {"question": "C?", "answer": 7},
        ],
    )
    recs, _ = _qa(p)
    assert [r.dataset_id for r in recs] == ["0", "1", "2"]
    assert [r.reference["aliases"] for r in recs] == [["x"], ["y", "z"], ["7"]]
    assert recs[0].fields["question"] == "A?"


def test_qa_mapping_errors_name_field_and_flag(tmp_path):
    p = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"query": "ok?", "gold": "a", "qid": "1", "ctx": "c"},
            {"gold": "a", "qid": "2"},
            {"query": 5, "gold": "a", "qid": "3"},
            {"query": "ok?", "qid": "4"},
            {"query": "ok?", "gold": {"x": 1}, "qid": "5"},
            {"query": "ok?", "gold": "a"},
            {"query": "ok?", "gold": "a", "qid": "1"},
            {"query": "ok?", "gold": "  ", "qid": "8"},
            {"query": "ok?", "gold": "a", "qid": "9", "ctx": 3},
        ],
    )
    mapping = FieldMapping(question="query", answers="gold", id="qid", context="ctx")
    recs, c = _qa(p, mapping=FieldMapping(question="query", answers="gold", id="qid"))
    assert [r.dataset_id for r in recs] == ["1", "9"]
    msgs = {m.line: m.message for m in c.items}
    assert msgs[2] == 'missing field "query" (--question-field)'
    assert msgs[3] == 'field "query" (--question-field) must be a string, got 5'
    assert msgs[4] == 'missing field "gold" (--answers-field)'
    assert msgs[5].startswith('field "gold" (--answers-field) must be a string or a list')
    assert msgs[6] == 'missing field "qid" (--id-field)'
    assert msgs[7] == "duplicate id '1' (first at line 1)"
    assert msgs[8] == 'field "gold" (--answers-field) is empty'
    _, c = _qa(p, mapping=mapping)
    assert 'missing field "ctx" (--context-field)' in {m.message for m in c.items}
    assert any(
        m.line == 9 and 'field "ctx" (--context-field) must be a string' in m.message
        for m in c.items
    )
    with pytest.raises(DatasetFormatError, match="query"):
        _qa(p, strict=True, mapping=mapping)
    p2 = _write_jsonl(tmp_path / "e.jsonl", [{"question": "q?"}])
    with pytest.raises(DatasetFormatError, match=r'no valid record.*"answer" or "answers"'):
        _qa(p2)
    recs, _ = _qa(p2, answer_kind="judge")  # the judge needs no reference
    assert recs[0].reference == {"kind": "judge", "value": None, "document": None}


def test_qa_limit_and_no_valid_record(tmp_path):
    p = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            "{bad",
            {"question": "a", "answer": "1"},
            {"question": "b", "answer": "2"},
            "{bad again",
            {"question": "c", "answer": "3"},
        ],
    )
    recs, c = _qa(p, limit=1)
    assert [r.dataset_id for r in recs] == ["1"] and len(c.items) == 1
    recs, c = _qa(p, limit=2)
    assert [r.dataset_id for r in recs] == ["1", "2"] and len(c.items) == 1  # stops reading
    recs, c = _qa(p)
    assert [r.dataset_id for r in recs] == ["1", "2", "4"] and len(c.items) == 2
    with pytest.raises(ValueError, match="limit"):
        _qa(p, limit=0)
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="holds no record"):
        _qa(empty)


def test_qa_choice_kind():
    recs, c = _qa(
        RELEASED / "qa-choice.jsonl",
        answer_kind="choice",
        mapping=FieldMapping(answers="answerKey", id="id"),
    )
    assert c.items == []
    assert [r.reference["answer_index"] for r in recs] == [1, 0, 2, 1]
    r = recs[0]
    assert r.reference == {
        "kind": "choice",
        "value": "B",
        "choices": ["carrot", "apple", "potato"],
        "answer_index": 1,
    }
    assert r.fields["choices_text"] == "A. carrot\nB. apple\nC. potato"
    assert r.fields["letters"] == ["A", "B", "C"] and r.fields["answer"] == "B"
    assert r.meta["choices"] == ["carrot", "apple", "potato"]


def test_qa_choice_fields_and_unresolvable(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text(
        "q,A,B,C,D,ans\nTwo plus two?,3,4,5,6,B\nThree?,1,2,3,4,E\nFour?,1,2,,4,D\n",
        encoding="utf-8",
    )
    recs, c = _qa(
        p,
        answer_kind="choice",
        mapping=FieldMapping(question="q", answers="ans", choices="A,B,C,D"),
    )
    assert recs[0].reference["choices"] == ["3", "4", "5", "6"]
    assert recs[0].reference["answer_index"] == 1
    assert recs[1].reference["choices"][2] == ""
    assert [m.line for m in c.items] == [3]
    assert c.items[0].message.startswith("field \"ans\" (--answers-field): answer 'E' matches none")
    with pytest.raises(
        DatasetFormatError, match=r'first: missing field "choices" or "options" \(--choices-field\)'
    ):
        _qa(p, answer_kind="choice", mapping=FieldMapping(question="q", answers="ans"))


def test_resolve_choice_forms():
    ch = ["red", "Green", "blue"]
    assert resolve_choice("B", ch) == 1 and resolve_choice("(c)", ch) == 2
    assert resolve_choice(0, ch) == 0 and resolve_choice("2", ch) == 2
    assert resolve_choice("green", ch) == 1 and resolve_choice("blue", ch) == 2
    assert resolve_choice("2", ch, ["1", "2", "3"]) == 1  # the record's own labels first
    assert resolve_choice(3, ch) is None and resolve_choice(True, ch) is None
    assert resolve_choice("D", ch) is None and resolve_choice("purple", ch) is None


def test_qa_numeric_kind(tmp_path):
    p = _write_jsonl(
        tmp_path / "n.jsonl",
        [
            {"question": "a", "answer": "Some steps.\n#### 1,234"},
            {"question": "b", "answer": 5.0},
            {"question": "c", "answer": "3/4"},
            {"question": "d", "answer": "-12"},
            {"question": "e", "answer": "about twelve"},
            {"question": "f", "answer": "$1,000,000.50"},
        ],
    )
    recs, c = _qa(p, answer_kind="numeric", numeric_tolerance=0.01)
    assert [(r.reference["number"], r.reference["value"]) for r in recs] == [
        (1234.0, "1234"),
        (5.0, "5"),
        (0.75, "0.75"),
        (-12.0, "-12"),
        (1000000.5, "1000000.5"),
    ]
    assert recs[0].reference == {
        "kind": "numeric",
        "value": "1234",
        "number": 1234.0,
        "tolerance": 0.01,
    }
    assert recs[0].fields["answer"] == "1234"
    assert [m.line for m in c.items] == [5]
    assert 'field "answer" (--answers-field) must be a number' in c.items[0].message


def test_qa_judge_kind_keeps_aliases_and_document(tmp_path):
    p = _write_jsonl(
        tmp_path / "j.jsonl",
        [{"question": "q?", "answer": ["x", "y"], "doc": ["para one", "para two"]}],
    )
    recs, _ = _qa(p, answer_kind="judge", mapping=FieldMapping(context="doc"))
    assert recs[0].reference == {
        "kind": "judge",
        "value": "x",
        "aliases": ["x", "y"],
        "document": "para one\n\npara two",
    }
    assert recs[0].fields["context"] == "para one\n\npara two"


def test_qa_parquet_errors_say_record(tmp_path):
    p = _write_parquet(
        tmp_path / "d.parquet",
        [
            {"id": "a", "question": "q1", "answer": "x"},
            {"id": "a", "question": "q2", "answer": "y"},
            {"id": "c", "question": None, "answer": "z"},
        ],
    )
    recs, c = _qa(p, mapping=FieldMapping(id="id"))
    assert [r.dataset_id for r in recs] == ["a"] and recs[0].line is None
    assert [(m.line, m.message) for m in c.items] == [
        (2, "record 2: duplicate id 'a' (first at record 1)"),
        (3, 'record 3: missing field "question" (--question-field)'),
    ]


def test_qa_options_checked():
    with pytest.raises(ValueError, match="answer kind"):
        QAOptions(answer_kind="regex")
    with pytest.raises(ValueError, match="numeric_tolerance"):
        QAOptions(numeric_tolerance=-1)
    with pytest.raises(ValueError, match="format"):
        QAOptions(fmt="xml")


def test_value_parsers():
    assert parse_aliases('["a", "b", "a"]') == ["a", "b"]
    assert parse_aliases("[not json") == ["[not json"]
    assert parse_aliases([["x", "y"], ["z"]]) == ["x", "y", "z"]
    assert parse_aliases([{"text": "t", "answer_start": 3}]) == ["t"]
    assert parse_aliases({"text": [], "answer_start": []}) == []
    assert parse_aliases(None) is None and parse_aliases([1.5, 2]) == ["1.5", "2"]
    assert parse_number("#### 72") == 72.0 and parse_number("1,234.5") == 1234.5
    assert parse_number("12,34") is None and parse_number(True) is None
    assert parse_number("1/0") is None and parse_number(float("nan")) is None
    assert format_number(72.0) == "72" and format_number(0.1) == "0.1"


# ============================================================================= presets

EXPECTED = {
    "nq_open": 10,
    "squad": 12,
    "hotpotqa": 8,
    "popqa": 10,
    "truthfulqa": 9,
    "sciq": 10,
    "mmlu": 10,
    "gsm8k": 10,
    "svamp": 10,
    "bioasq": 7,
}


def test_presets_listed():
    assert set(PRESETS) == set(EXPECTED)
    for preset in PRESETS.values():
        assert preset.bundled_path.exists(), preset.bundled_sample
        assert preset.answer_kind in preset.answer_kinds and preset.doc
        assert "{{ question }}" in preset.default_template
        assert preset.context_template is None or "{{ context }}" in preset.context_template
    assert PRESETS["nq_open"].default_template == SHORT_TEMPLATE
    assert PRESETS["squad"].context_template == SHORT_CONTEXT_TEMPLATE
    assert PRESETS["mmlu"].default_template == CHOICE_TEMPLATE
    assert PRESETS["gsm8k"].default_template == NUMERIC_TEMPLATE
    assert PRESETS["squad"].default_split == "dev"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_bundled_sample(name):
    recs, c = _preset(name)
    assert c.items == [] and len(recs) == EXPECTED[name]
    ids = [r.dataset_id for r in recs]
    assert len(set(ids)) == len(ids)
    kind = PRESETS[name].answer_kind
    for r in recs:
        assert r.reference["kind"] == kind and r.fields["question"] == r.meta["question"]
        assert set(r.fields) == {
            "question",
            "context",
            "choices",
            "choices_text",
            "letters",
            "answer",
            "record",
        }
        json.dumps(r.meta), json.dumps(r.reference)
    recs2, _ = _preset(name, limit=3)
    assert recs2 == recs[:3]


def test_preset_checks_arguments(tmp_path):
    c = _collector()
    with pytest.raises(ValueError, match="unknown preset"):
        iter_preset_records("nope", None, collector=c)
    with pytest.raises(ValueError, match="supports answer kinds"):
        iter_preset_records("nq_open", None, collector=c, answer_kind="numeric")
    with pytest.raises(FileNotFoundError):
        iter_preset_records("nq_open", tmp_path / "x.jsonl", collector=c)
    with pytest.raises(ValueError, match="limit"):
        iter_preset_records("nq_open", None, collector=c, limit=0)
    assert PRESETS["sciq"].template_for("aliases") == SHORT_TEMPLATE
    assert PRESETS["sciq"].template_for("aliases", True) == SHORT_CONTEXT_TEMPLATE
    with pytest.raises(ValueError, match="no context template"):
        PRESETS["gsm8k"].template_for(with_context=True)


def test_nq_open():
    recs, _ = _preset("nq_open")
    assert recs[0].dataset_id == "0" and recs[0].line == 1
    assert recs[0].reference == {
        "kind": "aliases",
        "value": "William Shakespeare",
        "aliases": ["William Shakespeare", "Shakespeare"],
    }
    assert recs[0].fields["context"] is None


def test_squad_v2_flattened_with_lines_and_impossible():
    path = PRESETS["squad"].bundled_path
    text = path.read_text().splitlines()
    recs, _ = _preset("squad", with_context=True)
    assert [r.index for r in recs] == list(range(12))
    for r in recs:
        assert text[r.line - 1].strip() == "{"
        assert r.fields["question"] in text[r.line]  # the object's first member
        assert r.meta["title"] in ("Varnholm_Lighthouse", "Orrin_Valley_Railway")
        assert r.fields["context"] and r.meta["context"] == r.fields["context"]
    by_id = {r.dataset_id: r for r in recs}
    assert by_id["hl5q0004"].reference == {
        "kind": "aliases",
        "value": None,
        "aliases": [],
        "unanswerable": True,
    }
    assert sum(1 for r in recs if r.reference.get("unanswerable")) == 2
    assert by_id["hl5q0002"].reference["aliases"] == ["whale oil", "by whale oil"]
    judged, _ = _preset("squad", answer_kind="judge")
    j = {r.dataset_id: r for r in judged}
    assert j["hl5q0004"].reference == {
        "kind": "judge",
        "value": None,
        "unanswerable": True,
        "document": by_id["hl5q0004"].fields["context"],
    }
    assert "context" not in j["hl5q0001"].meta  # without --with-context meta stays small


def test_squad_hf_layout_and_malformed_articles(tmp_path):
    p = _write_parquet(
        tmp_path / "squad.parquet",
        [
            {
                "id": "s1",
                "title": "T",
                "context": "C",
                "question": "Q1?",
                "answers": {"text": ["a"], "answer_start": [0]},
            },
            {
                "id": "s2",
                "title": "T",
                "context": "C",
                "question": "Q2?",
                "answers": {"text": [], "answer_start": []},
            },
        ],
    )
    recs, _ = _preset("squad", p)
    assert recs[0].reference["aliases"] == ["a"] and recs[1].reference["unanswerable"] is True
    doc = {
        "version": "1.1",
        "data": [
            {
                "title": "A",
                "paragraphs": [
                    {
                        "context": "c",
                        "qas": [
                            {
                                "id": "x1",
                                "question": "q?",
                                "answers": [{"text": "t", "answer_start": 0}],
                            },
                            {"id": "x2", "answers": [{"text": "t", "answer_start": 0}]},
                        ],
                    }
                ],
            },
            {"title": "B"},
            {
                "title": "C",
                "paragraphs": [
                    {
                        "context": "c",
                        "qas": [
                            {
                                "id": "x1",
                                "question": "again?",
                                "answers": [{"text": "u", "answer_start": 0}],
                            }
                        ],
                    }
                ],
            },
        ],
    }
    f = tmp_path / "dev-v1.1.json"
    f.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    recs, c = _preset("squad", f)
    assert [r.dataset_id for r in recs] == ["x1"]
    msgs = [m.message for m in c.items]
    assert msgs == [
        'missing field "question"',
        'expected an article object with a "paragraphs" list',
        f"duplicate id 'x1' (first at line {recs[0].line})",
    ]
    assert [m.line for m in c.items][2] > recs[0].line


def test_hotpotqa():
    recs, _ = _preset("hotpotqa")
    r = recs[0]
    assert r.dataset_id == "hlhp000000000000000001"
    assert (
        r.fields["context"].split("\n\n")[0]
        == "Cairo: Cairo is the capital city of Egypt. It lies on the banks of the Nile."
    )
    assert r.meta == {"question": r.fields["question"], "type": "bridge", "level": "easy"}
    assert r.reference == {"kind": "aliases", "value": "Nile", "aliases": ["Nile"]}


def test_popqa_tsv_and_hf_export(tmp_path):
    recs, _ = _preset("popqa")
    r = recs[0]
    assert r.dataset_id == "9000000" and r.reference["aliases"] == ["Canada", "CA"]
    assert r.meta == {"question": "In what country is Ottawa?", "prop": "country", "s_pop": 90000}
    assert recs[4].reference["aliases"] == ["Malaga", "M\u00e1laga"]
    assert recs[9].fields["question"] == 'Who was the director of The "Blue" Harbour?'
    rows = [dict(x.fields["record"]) for x in recs]
    p = _write_parquet(tmp_path / "popqa.parquet", rows)
    again, _ = _preset("popqa", p)
    assert [(x.dataset_id, x.reference, x.meta) for x in again] == [
        (x.dataset_id, x.reference, x.meta) for x in recs
    ]


def test_truthfulqa():
    recs, _ = _preset("truthfulqa")
    r = recs[0]
    assert r.dataset_id == "0"
    assert r.reference == {
        "kind": "judge",
        "value": "It passes through your digestive system",
        "aliases": [
            "It passes through your digestive system",
            "Nothing much happens",
            "It is excreted",
        ],
        "document": None,
        "incorrect_answers": [
            "It stays in your stomach for seven years",
            "It sticks to your insides",
        ],
    }
    assert r.meta["category"] == "Misconceptions" and r.meta["type"] == "Adversarial"
    aliased, _ = _preset("truthfulqa", answer_kind="aliases")
    assert aliased[0].reference["aliases"][0] == "It passes through your digestive system"
    assert "incorrect_answers" in aliased[0].reference


def test_sciq_choices_shuffled_deterministically():
    recs, _ = _preset("sciq")
    again, _ = _preset("sciq")
    assert [r.reference for r in recs] == [r.reference for r in again]
    raw = json.loads(PRESETS["sciq"].bundled_path.read_text())
    for r, item in zip(recs, raw):
        options = [
            item["correct_answer"],
            item["distractor1"],
            item["distractor2"],
            item["distractor3"],
        ]
        order = sciq_order(item["question"], options)
        assert r.reference["choices"] == [options[i] for i in order]
        assert r.reference["choices"][r.reference["answer_index"]] == item["correct_answer"]
        assert r.fields["answer"] == "ABCD"[r.reference["answer_index"]]
    assert len({r.reference["answer_index"] for r in recs}) > 1  # not always the same slot
    assert recs[5].fields["context"] is None  # blank support
    aliased, _ = _preset("sciq", answer_kind="aliases", with_context=True)
    assert aliased[0].reference == {
        "kind": "aliases",
        "value": "carbon dioxide",
        "aliases": ["carbon dioxide"],
    }
    assert aliased[0].fields["choices"] is None and "context" in aliased[0].meta


def test_mmlu_file_directory_and_errors(tmp_path):
    recs, _ = _preset("mmlu")
    assert recs[0].dataset_id == "general_knowledge/0" and recs[3].reference["answer_index"] == 3
    assert recs[0].meta["subject"] == "general_knowledge"
    assert recs[6].fields["question"].count(",") == 3  # quoted cell with commas
    data = tmp_path / "data"
    (data / "test").mkdir(parents=True)
    (data / "dev").mkdir()
    (data / "test" / "astronomy_test.csv").write_text(
        "Closest star?,Sun,Vega,Sirius,Rigel,A\nRed planet?,Venus,Mars,Moon,Io,Z\n",
        encoding="utf-8",
    )
    (data / "test" / "anatomy_test.csv").write_text(
        "Bones in a hand?,27,12,8,50,A\nshort,row\n", encoding="utf-8"
    )
    (data / "dev" / "anatomy_dev.csv").write_text(
        "Largest organ?,Skin,Liver,Lung,Eye,A\n", encoding="utf-8"
    )
    recs, c = _preset("mmlu", data)
    assert [r.dataset_id for r in recs] == ["anatomy/0", "astronomy/0"]
    assert [(m.line, m.message.split(":")[0]) for m in c.items] == [
        (2, "anatomy_test.csv"),
        (2, "astronomy_test.csv"),
    ]
    assert "'Z' is not one of A-D" in c.items[1].message
    dev, _ = _preset("mmlu", data, split="dev")
    assert [r.dataset_id for r in dev] == ["anatomy/0"]
    hf = _write_parquet(
        tmp_path / "mmlu.parquet",
        [
            {"question": "q1", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": 2},
            {"question": "q2", "subject": "t", "choices": ["a", "b", "c", "d"], "answer": 0},
            {"question": "q3", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": 1},
        ],
    )
    recs, _ = _preset("mmlu", hf)
    assert [r.dataset_id for r in recs] == ["s/0", "t/0", "s/1"]
    assert recs[0].reference["value"] == "C"


def test_gsm8k_numbers(tmp_path):
    recs, _ = _preset("gsm8k")
    assert recs[2].reference == {
        "kind": "numeric",
        "value": "1720",
        "number": 1720.0,
        "tolerance": 1e-6,
    }
    assert recs[5].reference["number"] == 1500.0
    assert recs[0].meta == {"question": recs[0].fields["question"]}  # no solution text
    p = _write_jsonl(
        tmp_path / "g.jsonl",
        [
            {"question": "q", "answer": "no final line"},
            {"question": "q", "answer": "x\n#### lots"},
            {"question": "q", "answer": "x\n#### 3"},
        ],
    )
    recs, c = _preset("gsm8k", p, numeric_tolerance=0.5)
    assert recs[0].dataset_id == "2" and recs[0].reference["tolerance"] == 0.5
    assert [m.line for m in c.items] == [1, 2]
    assert "####" in c.items[0].message


def test_svamp():
    recs, _ = _preset("svamp")
    r = recs[0]
    assert r.dataset_id == "hl-sv-1"
    assert r.fields["question"] == (
        "Jack had 8 apples. He gave 3 apples to his friend. How many apples does Jack have now?"
    )
    assert r.reference["number"] == 5.0 and r.fields["answer"] == "5"
    assert r.meta["type"] == "Subtraction"


def test_bioasq_keeps_factoid_only():
    recs, c = _preset("bioasq", with_context=True)
    assert c.items == [] and len(recs) == 7
    r = recs[0]
    assert r.reference["aliases"] == ["pancreas", "the pancreas"]
    assert r.fields["context"] == (
        "Insulin is made by beta cells in the pancreas.\n\n"
        "The pancreas releases insulin into the blood."
    )
    assert {x.fields["record"]["type"] for x in recs} == {"factoid"}
    by_q = {x.fields["question"]: x for x in recs}
    assert by_q["Which vitamin is made in the skin after exposure to sunlight?"].reference[
        "aliases"
    ] == ["vitamin D", "cholecalciferol"]
    assert by_q["Which molecule carries genetic information in most living organisms?"].reference[
        "aliases"
    ] == ["DNA", "deoxyribonucleic acid"]


def test_bioasq_without_factoids(tmp_path):
    p = tmp_path / "b.json"
    p.write_text(
        json.dumps(
            {"questions": [{"id": "1", "type": "yesno", "body": "b?", "exact_answer": "yes"}]}
        ),
        encoding="utf-8",
    )
    with pytest.raises(DatasetFormatError, match="factoid question"):
        _preset("bioasq", p)
