"""``--reasoning-parser``: resolved once in the run plan from the model's ``model_type`` and
think tokens, passed to vLLM's command line, refused where the backend has no parsers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hallulog.backends.models import ModelInfo
from hallulog.backends.servers import server_command
from hallulog.config.plan import server_spec
from hallulog.config.run_config import ConfigError, RunConfig


def _model(tmp_path: Path, model_type: str, think: bool) -> ModelInfo:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    added = {"0": {"content": "<|endoftext|>"}}
    if think:
        added.update({"7": {"content": "<think>"}, "8": {"content": "</think>"}})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    return ModelInfo(path=tmp_path, num_hidden_layers=2, hidden_size=8, name="m")


def _parser(config: RunConfig, model: ModelInfo) -> str | None:
    spec = server_spec(config, model, (0, 2))
    argv = server_command(spec, host="127.0.0.1", port=8100, spool_dir="/spool")
    flag = argv[argv.index("--reasoning-parser") + 1] if "--reasoning-parser" in argv else None
    assert flag == spec.reasoning_parser
    return flag


def test_auto_picks_qwen3_for_a_qwen3_model_with_think_tokens(tmp_path):
    assert _parser(RunConfig(backend="vllm"), _model(tmp_path, "qwen3", True)) == "qwen3"


def test_auto_starts_no_parser_without_think_tokens_or_chat(tmp_path):
    assert _parser(RunConfig(backend="vllm"), _model(tmp_path / "a", "llama", True)) is None
    assert _parser(RunConfig(backend="vllm"), _model(tmp_path / "b", "qwen3", False)) is None
    raw = RunConfig(backend="vllm", chat=False)
    assert _parser(raw, _model(tmp_path / "c", "qwen3", True)) is None
    off = RunConfig(backend="vllm", thinking="off")  # the prompt decides, per generation
    assert _parser(off, _model(tmp_path / "d", "qwen3", True)) == "qwen3"


def test_an_explicit_parser_and_none(tmp_path):
    model = _model(tmp_path, "qwen2", True)  # a DeepSeek-R1 distill is a qwen2 model
    assert _parser(RunConfig(backend="vllm", reasoning_parser="deepseek_r1"), model) == (
        "deepseek_r1"
    )
    assert _parser(RunConfig(backend="vllm", reasoning_parser="none"), model) is None


def test_the_embedded_server_takes_no_parser_and_engine_args_may_not_give_one():
    with pytest.raises(ConfigError, match="--reasoning-parser qwen3 is vLLM only"):
        RunConfig(reasoning_parser="qwen3")
    with pytest.raises(ConfigError, match="--engine-args may not give --reasoning-parser"):
        RunConfig(backend="vllm", engine_args="--reasoning-parser qwen3")
    with pytest.raises(ConfigError, match="--reasoning-parser must be"):
        RunConfig(backend="vllm", reasoning_parser=" ")


def test_the_default_config_fingerprint_leaves_the_parser_out():
    assert "reasoning_parser" not in RunConfig().fingerprint_fields()
    assert (
        RunConfig(backend="vllm", reasoning_parser="qwen3").fingerprint_fields()["reasoning_parser"]
        == "qwen3"
    )


def test_a_parser_the_installed_vllm_lacks_is_one_line_before_any_server(tmp_path):
    pytest.importorskip("vllm.reasoning")
    config = RunConfig(backend="vllm", reasoning_parser="bogus")
    with pytest.raises(ConfigError, match="--reasoning-parser bogus: not a reasoning parser"):
        server_spec(config, _model(tmp_path, "qwen3", True), (0, 2))
