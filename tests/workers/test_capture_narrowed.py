"""Narrowed captures (``kv_transfer_params.hallulog_capture_rows``, contracts/capture_rows.py)
against the bench's instant backend: the worker asks for the narrowest rows its profile allows,
the backend writes only those, and what the run stores is bit for bit what it stores from a
capture of every position."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from hallulog.contracts import layout
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.worker import WorkerSpec

from tests.workers.worker_harness import stored_activations

REPO = Path(__file__).resolve().parents[2]
LAYERS, HIDDEN, ANSWER_TOKENS, MAX_PROMPT = 3, 8, 6, 48


@pytest.fixture(scope="module")
def instant(tmp_path_factory, instant_backend_module):
    return instant_backend_module(
        tmp_path_factory.mktemp("spool"),
        num_layer_ids=LAYERS,
        hidden_size=HIDDEN,
        answer_tokens=ANSWER_TOKENS,
        max_prompt_tokens=MAX_PROMPT,
        extra=("--vary-rows",),
    )


def _capture_bytes(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return float(re.search(r"^hallulog_instant_capture_bytes_total\S* (\S+)$", text, re.M).group(1))


def _spec(url: str, root: Path, sequence_mode: str, positions, capture_mode: str) -> WorkerSpec:
    return WorkerSpec(
        worker_id=0,
        server_url=url,
        model_name="m",
        worker_dir=str(layout.worker_dir(root, 0)),
        storage_format="packed",
        layer_ids=tuple(range(LAYERS)),
        hidden_size=HIDDEN,
        sequence_mode="positions" if positions else sequence_mode,
        dtype="float16",
        capture_mode=capture_mode,
        k_samples=3,
        primary_temperature=0.0,
        sample_temperature=0.7,
        sample_top_p=0.95,
        max_tokens=ANSWER_TOKENS,
        seed=0,
        groups_in_flight=1,
        request_timeout=5.0,
        positions=positions,
    )


GROUP = PromptGroup.create(
    "triviaqa",
    "dev",
    0,
    [{"role": "user", "content": "Capital?"}],
    reference={"value": "Paris", "aliases": ["Paris"]},
)

# (sequence mode, positions, what the worker asks for)
CASES = [
    ("all", None, "all"),
    ("prompt", None, "prompt"),
    ("response", None, "response"),
    ("last", None, "last"),
    (None, ("tbg", "slt", "exact_answer", "last"), "response"),  # the probes profile
    (None, ("first:2", "slt"), "response"),
    (None, ("last",), "last"),
    (None, ("prompt", "tbg"), "prompt"),
    (None, ("last:3",), "all"),
    (None, ("tbg", "all"), "all"),
]


@pytest.mark.parametrize("capture_mode", ["generation", "prefill"])
@pytest.mark.parametrize(("sequence_mode", "positions", "asked"), CASES)
def test_stored_rows_are_those_of_a_whole_capture(
    instant, tmp_path, capture_mode, sequence_mode, positions, asked
):
    spec = _spec(instant, tmp_path / "narrow", sequence_mode, positions, capture_mode)
    before = _capture_bytes(instant)
    narrow = stored_activations(spec, GROUP)
    narrow_bytes = _capture_bytes(instant) - before
    whole_spec = _spec(instant, tmp_path / "whole", sequence_mode, positions, capture_mode)
    whole = stored_activations(whole_spec, GROUP, capture_rows="all")
    whole_bytes = _capture_bytes(instant) - before - narrow_bytes

    assert narrow.keys() == whole.keys() and len(narrow) == 4
    for key, (fields, layers) in narrow.items():
        assert fields == whole[key][0]
        for got, want in zip(layers, whole[key][1]):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    # the backend wrote fewer bytes whenever the worker could ask for fewer rows
    prompt_only = asked == "prompt" and capture_mode == "prefill"  # the prefill's prompt is all
    if asked == "all" or prompt_only:
        assert narrow_bytes == whole_bytes
    else:
        assert narrow_bytes < whole_bytes
