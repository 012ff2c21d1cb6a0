"""A worker with ``--positions`` against the bench's instant backend: the rows it stores are the
named positions of the capture, and the activation index says which row is which
(docs/alignment.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.worker import WorkerSpec

from hallulog import storage
from tests.workers.worker_harness import process_group

REPO = Path(__file__).resolve().parents[2]
LAYERS, HIDDEN, ANSWER_TOKENS, MAX_PROMPT = 3, 8, 6, 48
NAMES = ("tbg", "slt", "exact_answer", "last")


def _pool() -> np.ndarray:
    """The instant backend's capture rows: row p is the hidden state at position p."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((MAX_PROMPT + ANSWER_TOKENS + 1, LAYERS, HIDDEN)).astype(np.float16)


@pytest.fixture
def instant(tmp_path, instant_backend):
    spool = layout.spool_dir(tmp_path, 0)
    url = instant_backend(
        spool,
        num_layer_ids=LAYERS,
        hidden_size=HIDDEN,
        answer_tokens=ANSWER_TOKENS,
        max_prompt_tokens=MAX_PROMPT,
    )
    return url, tmp_path


def _run(
    url: str,
    root: Path,
    *,
    capture_mode: str,
    positions,
    k: int = 7,
    max_tokens: int = ANSWER_TOKENS,
):
    group = PromptGroup.create(
        "triviaqa",
        "dev",
        0,
        [{"role": "user", "content": "Capital?"}],
        reference={"value": "Paris", "aliases": ["Paris"]},
    )
    spec = WorkerSpec(
        worker_id=0,
        server_url=url,
        model_name="m",
        worker_dir=str(layout.worker_dir(root, 0)),
        storage_format="packed",
        layer_ids=tuple(range(LAYERS)),
        hidden_size=HIDDEN,
        sequence_mode="positions" if positions else "response",
        dtype="float16",
        capture_mode=capture_mode,
        k_samples=k,
        primary_temperature=0.0,
        sample_temperature=0.7,
        sample_top_p=0.95,
        max_tokens=max_tokens,
        seed=0,
        groups_in_flight=1,
        request_timeout=5.0,
        positions=positions,
    )
    events = process_group(spec, group)
    assert [e["event"] for e in events] == ["done"], events
    wdir = layout.worker_dir(root, 0)
    gens = {g["sample_id"]: g for g in iter_rows(wdir / layout.GENERATIONS)}
    acts = list(iter_rows(wdir / layout.ACTIVATION_INDEX))
    prompt = next(iter_rows(wdir / layout.PROMPT_INDEX))
    return events[0], prompt, gens, acts, storage.open_store(wdir)


@pytest.mark.parametrize("capture_mode", ["generation", "prefill"])
def test_named_positions_are_stored_and_indexed(instant, capture_mode):
    url, root = instant
    event, prompt, gens, acts, reader = _run(url, root, capture_mode=capture_mode, positions=NAMES)
    pool = _pool()
    p = len(prompt["prompt_token_ids"])
    sources = set()
    for row in acts:
        gen = gens[row["sample_id"]]
        r = len(gen["token_ids"])
        n = p + r - 1 if capture_mode == "generation" else p + r
        at, named = row["token_positions"], row["positions"]
        assert row["sequence_mode"] == "positions" and list(named) == list(NAMES)
        assert at == sorted(set(at)) and row["num_rows"] == len(at) == row["shape"][1]
        assert row["row0_position"] == at[0]
        assert row["prompt_rows"] == sum(x < p for x in at)
        assert [at[j] for j in named["tbg"]] == [p - 1]
        assert [at[j] for j in named["slt"]] == [p + r - 2]
        assert [at[j] for j in named["last"]] == [n - 1]
        span = row["exact_answer_span"]
        sources.add(span["source"])
        s, e = span["tokens"]
        assert [at[j] for j in named["exact_answer"]] == [x for x in range(p + s, p + e) if x < n]
        if span["source"] == "grader":
            assert span["chars"] == gen["answer_span"]
            assert gen["text"][slice(*span["chars"])] == "Paris"
        # the stored rows are the capture's rows at those positions, every layer
        i = reader.index_of(row["activation_key"])
        for layer in range(LAYERS):
            np.testing.assert_array_equal(reader.read(i, layer), pool[at, layer, :])
    assert sources == {"grader", "first_line"}  # some canned answers hold "Paris", some not
    assert event["positions_missing"] == {}
    reader.close()


def test_windows(instant):
    url, root = instant
    names = ("first:2", "last:3", "slt")
    _, prompt, gens, acts, reader = _run(url, root, capture_mode="generation", positions=names, k=1)
    p = len(prompt["prompt_token_ids"])
    for row in acts:
        r = len(gens[row["sample_id"]]["token_ids"])
        at, named = row["token_positions"], row["positions"]
        assert [at[j] for j in named["first:2"]] == [p, p + 1]
        assert [at[j] for j in named["last:3"]] == [p + r - 4, p + r - 3, p + r - 2]
        assert at == list(range(p, p + r - 1))  # first:2 and last:3 meet: one run of rows
        assert row["exact_answer_span"] is not None
    reader.close()


def test_a_one_token_answer_is_stored_without_the_positions_it_lacks(instant):
    """R == 1 with generation capture: no slt, and the answer token itself was never fed back
    (no first:K, no exact_answer); the generation is stored with tbg (= last) only."""
    url, root = instant
    event, prompt, gens, acts, reader = _run(
        url, root, capture_mode="generation", positions=NAMES + ("first:2",), k=2, max_tokens=1
    )
    p = len(prompt["prompt_token_ids"])
    for row in acts:
        assert row["response_token_count"] == 1 and row["token_positions"] == [p - 1]
        assert row["positions"] == {
            "tbg": [0],
            "slt": [],
            "exact_answer": [],
            "last": [0],
            "first:2": [],
        }
    assert event["positions_missing"] == {"slt": 3, "exact_answer": 3, "first:2": 3}
    reader.close()


def test_default_rows_and_index_fields_are_unchanged(instant):
    url, root = instant
    event, prompt, gens, acts, reader = _run(
        url, root, capture_mode="generation", positions=None, k=1
    )
    assert "positions_missing" not in event
    pool, p = _pool(), len(prompt["prompt_token_ids"])
    for row in acts:
        assert not {"positions", "token_positions", "exact_answer_span"} & set(row)
        assert row["sequence_mode"] == "response" and row["row0_position"] == p - 1
        i = reader.index_of(row["activation_key"])
        np.testing.assert_array_equal(reader.read(i, 0), pool[p - 1 : p - 1 + row["num_rows"], 0])
    reader.close()
