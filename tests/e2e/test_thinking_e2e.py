"""--thinking and --chat-template-kwargs end to end: a reasoning test model (SmolLM2's real
weights with ``<think>``/``</think>`` and a Qwen3-style template, tests/serving/thinking_model.py)
served by the real embedded server inside real runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hallulog.contracts.layout import GENERATIONS, PROMPT_INDEX

from tests.e2e.conftest import run_orchestrator, worker_rows
from tests.serving.thinking_model import THINK_CLOSE, build_thinking_model

pytestmark = pytest.mark.e2e

SMALL = ("--limit", "3", "--k-samples", "1", "--max-tokens", "16", "--logging-profile", "light")


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory) -> Path:
    return build_thinking_model(tmp_path_factory.mktemp("models") / "thinking", closes=True)


def _run(root: Path, model: Path, *args: str) -> tuple[dict, list[dict], list[dict]]:
    proc = run_orchestrator(root, "--model", str(model), *SMALL, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((root / "run_manifest.json").read_text())
    return manifest, worker_rows(root, PROMPT_INDEX), worker_rows(root, GENERATIONS)


def test_thinking_off_and_on_reach_the_template(thinking_model, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(thinking_model)
    empty_block = tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    opened = tok("<think>\n", add_special_tokens=False)["input_ids"]

    off, off_prompts, off_rows = _run(tmp_path / "off", thinking_model, "--thinking", "off")
    on, on_prompts, on_rows = _run(tmp_path / "on", thinking_model, "--thinking", "on")

    assert off["config"]["thinking"] == "off" and on["config"]["thinking"] == "on"
    assert off["config_fingerprint"] != on["config_fingerprint"]
    assert len(off_prompts) == len(on_prompts) == 3 and len(off_rows) == len(on_rows) == 6
    for row in off_prompts:  # the template closed an empty reasoning block
        assert row["prompt_token_ids"][-len(empty_block) :] == empty_block
    for row in on_prompts:  # the template opened the reasoning
        assert row["prompt_token_ids"][-len(opened) :] == opened
    # the model closes its reasoning itself (its </think> row outscores ".")
    assert any(THINK_CLOSE in row["text"] for row in on_rows)


def test_chat_template_kwargs_equal_the_thinking_shorthand(thinking_model, tmp_path):
    kwargs, prompts, _ = _run(
        tmp_path / "kw", thinking_model, "--chat-template-kwargs", '{"enable_thinking": false}'
    )
    assert kwargs["config"]["chat_template_kwargs"] == '{"enable_thinking": false}'
    assert all(p["prompt_token_ids"][-1] == prompts[0]["prompt_token_ids"][-1] for p in prompts)
    assert "</think>" in _decoded_tail(thinking_model, prompts[0]["prompt_token_ids"])


def _decoded_tail(model: Path, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).decode(ids[-6:])


def test_disagreeing_flags_are_refused_in_one_line(tmp_path):
    proc = run_orchestrator(
        tmp_path / "bad", "--thinking", "on", "--chat-template-kwargs", '{"enable_thinking": false}'
    )
    assert proc.returncode != 0
    assert "--thinking on disagrees with --chat-template-kwargs" in proc.stderr
    proc = run_orchestrator(tmp_path / "bad2", "--chat-template-kwargs", "{enable_thinking}")
    assert proc.returncode != 0 and "--chat-template-kwargs: not valid JSON" in proc.stderr
