"""Default model conversion: concurrency-safe, atomic, portable."""

import json
import threading
import time

import pytest
from hallulog.serving import model_loader


def test_concurrent_first_calls_convert_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLULOG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_loader, "gguf_path", lambda: tmp_path / "fake.gguf")
    calls = []

    def fake_convert(src, out):
        calls.append(out)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        time.sleep(0.3)
        (out / model_loader.SOURCE_FILE).write_text("{}")

    monkeypatch.setattr(model_loader, "_convert_gguf", fake_convert)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(model_loader.default_model_dir()))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    target = tmp_path / "models" / model_loader.DEFAULT_MODEL_NAME
    assert len(calls) == 1 and calls[0] != target  # written elsewhere, then renamed
    assert results == [target] * 3 and (target / "config.json").is_file()
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLULOG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_loader, "gguf_path", lambda: tmp_path / "fake.gguf")

    def broken(src, out):
        out.mkdir(parents=True)
        raise RuntimeError("boom")

    monkeypatch.setattr(model_loader, "_convert_gguf", broken)
    with pytest.raises(RuntimeError):
        model_loader.default_model_dir()
    assert [p.name for p in (tmp_path / "models").iterdir()] == [
        f"{model_loader.DEFAULT_MODEL_NAME}.lock"
    ]


def test_resolve_model_path_rejects_non_model_dirs(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        model_loader.resolve_model_path(str(tmp_path))


@pytest.mark.e2e
def test_default_model_dir_is_portable():
    path = model_loader.default_model_dir()
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    tok = json.loads((path / "tokenizer_config.json").read_text())
    assert (
        tok["tokenizer_class"] == "PreTrainedTokenizerFast"
        and "<|im_start|>" in tok["chat_template"]
    )
    assert (path / "model.safetensors").is_file() and (path / "generation_config.json").is_file()
    t0 = time.monotonic()
    assert model_loader.default_model_dir() == path
    assert time.monotonic() - t0 < 0.5
