"""The Arrow-built row groups (postrun/parquet_arrow.py) are the Python builder's,
value for value; where that is not certain the Arrow builder hands over (returns None)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hallulog.contracts.jsonl import encode_line
from hallulog.postrun import parquet, parquet_rows
from hallulog.postrun.parquet_arrow import activation_table, generation_table

from tests.postrun.postrun_fixtures import generation_row

GENS = parquet.SCHEMAS["generations.parquet"]
ACTS = parquet.SCHEMAS["activation_index.parquet"]


def _spaced_line(row: dict[str, Any]) -> bytes:
    """The stdlib's default (spaced) form: Arrow's reader takes any JSON spacing."""
    return (json.dumps(row, ensure_ascii=False) + "\n").encode()


def python_generations(rows: list[dict[str, Any]]) -> pa.Table:
    builder = parquet_rows.GenerationColumns(Path("generations.parquet"), GENS)
    for row in rows:
        builder.add(row)
    return builder.build()


def arrow_generations(
    rows: list[dict[str, Any]], encode: Callable[[dict], bytes] = encode_line
) -> pa.Table | None:
    return generation_table(
        b"".join(encode(r) for r in rows), [parquet_rows.generation_extra(r) for r in rows], GENS
    )


def edit(row: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    row = copy.deepcopy(row)
    change(row)
    return row


BASE = generation_row("0123456789abcdef", 1, 0)

SAME = {
    "worker rows": lambda r: None,
    "no logits": lambda r: [t.pop("logit") for t in r["logprobs"]],
    "some logits": lambda r: [t.pop("logit") for t in r["logprobs"][1:]],
    "null logprobs": lambda r: r.update(logprobs=None),
    "no logprobs": lambda r: r.pop("logprobs"),
    "empty logprobs": lambda r: r.update(logprobs=[]),
    "no top_logprobs": lambda r: r["logprobs"][0].pop("top_logprobs"),
    "null top_logprobs": lambda r: r["logprobs"][0].update(top_logprobs=None),
    "top entry without logprob": lambda r: r["logprobs"][0]["top_logprobs"][0].pop("logprob"),
    "entry without token": lambda r: r["logprobs"][0].pop("token"),
    "null token_ids": lambda r: r.update(token_ids=None),
    "a null token id": lambda r: r["token_ids"].__setitem__(0, None),
    "null usage": lambda r: r.update(usage=None),
    "no request_params": lambda r: r.pop("request_params"),
    "int logprob": lambda r: r["logprobs"][0].update(logprob=-3),
    "extra fields": lambda r: r.update(extra={"a": [1, "é"]}, text=None),
    "escapes": lambda r: r.update(text='a "quoted"\nline, é \u2028 \\ end'),
    "float -0.0": lambda r: r["logprobs"][0].update(logprob=-0.0),
    "label null": lambda r: r.update(label=None),
    "grade fields": lambda r: r.update(label_status="unparsed", answer_span=[3, 7]),
    "null grade fields": lambda r: r.update(label_status=None, answer_span=None),
}


@pytest.mark.parametrize("case", list(SAME))
def test_arrow_rows_equal_python_rows(case: str):
    rows = [BASE, edit(BASE, SAME[case]), generation_row("fedcba9876543210", 0, 1)]
    expected = python_generations(rows)
    for encode in (encode_line, _spaced_line):
        got = arrow_generations(rows, encode)
        assert got is not None, case
        assert got.equals(expected), case


HAND_OVER = {
    "string seed": lambda r: r["request_params"].update(seed="x"),
    "int token": lambda r: r["logprobs"][0].update(token=7),
    "dict logprob": lambda r: r["logprobs"][1].update(logprob={"odd": True}),
    "null entry": lambda r: r["logprobs"].__setitem__(0, None),
    "null top entry": lambda r: r["logprobs"][0]["top_logprobs"].__setitem__(0, None),
    "int beyond float32": lambda r: r["logprobs"][0].update(logprob=16777217),
    "sample id out of int32": lambda r: r.update(sample_id=2**31),
    "float sample id": lambda r: r.update(sample_id=1.0),
    "bool label": lambda r: r.update(label=True),
    "number text": lambda r: r.update(text=5),
    "string usage": lambda r: r.update(usage="n/a"),
    "string answer_span": lambda r: r.update(answer_span="3-7"),
    "int label_status": lambda r: r.update(label_status=5),
}


@pytest.mark.parametrize("case", list(HAND_OVER))
def test_arrow_hands_over_when_unsure(case: str):
    assert arrow_generations([BASE, edit(BASE, HAND_OVER[case])]) is None


def test_int_minus_zero_hands_over():
    line = encode_line(BASE).replace(b'"logprob":-0.05,', b'"logprob":-0,', 1)
    assert b'"logprob":-0,' in line
    assert generation_table(line, [parquet_rows.generation_extra(json.loads(line))], GENS) is None


def test_duplicate_key_hands_over():
    line = encode_line(BASE).replace(b'"text":', b'"text":"first","text":', 1)
    assert generation_table(line, [None], GENS) is None


def activation_row(sid: int) -> dict[str, Any]:
    return {
        "prompt_id": "0123456789abcdef",
        "sample_id": sid,
        "activation_key": f"0123456789abcdef_{sid}",
        "layers": [3, 4],
        "sequence_mode": "response",
        "capture_mode": "generation",
        "prompt_token_count": 20,
        "response_token_count": 12,
        "row0_position": 19,
        "num_rows": 2,
        "prompt_rows": 1,
        "response_rows": 1,
        "file_path": "activations/shard_000000.bin",
        "byte_offset": 64 * sid,
        "shape": [2, 2, 8],
        "dtype": "float16",
        "size_bytes": 64,
        "worker_id": 0,
        "commit_id": "c" * 32,
        "label": -1,
    }


def test_activation_rows_equal_python_rows():
    rows = [
        activation_row(0),
        activation_row(1),
        {**activation_row(2), "more": {"x": 1}},
        {**activation_row(3), "layers": None, "byte_offset": None},
    ]
    extras = [parquet_rows.extra_json(r, parquet_rows.ACTIVATION_KNOWN) for r in rows]
    expected = parquet_rows.tuples_table(
        [parquet_rows.activation_columns(r) for r in rows], ACTS, "t"
    )
    got = activation_table(b"".join(_spaced_line(r) for r in rows), extras, ACTS)
    assert got is not None and got.equals(expected)
    odd = [activation_row(0), {**activation_row(1), "layers": "3,4"}]
    assert activation_table(b"".join(encode_line(r) for r in odd), [None, None], ACTS) is None
