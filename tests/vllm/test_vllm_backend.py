"""Unit tests of backends/vllm.py (pure functions; vLLM not needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from hallulog.backends.vllm import (
    CONNECTOR_NAME,
    capture_flags,
    engine_child_pids,
    parse_prometheus_counters,
    vllm_server_command,
    vllm_server_env,
)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_command_with_capture(tmp_path):
    argv = vllm_server_command(
        tmp_path / "model",
        host="127.0.0.1",
        port=8123,
        layer_ids=range(31),
        spool_dir=tmp_path / "spool",
        dtype="float32",
        served_model_name="smol",
        extra_args=["--max-model-len", "2048"],
        python="/venv/bin/python",
    )
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == str(tmp_path / "model")
    assert _flag(argv, "--port") == "8123"
    assert _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--dtype") == "float32"
    assert _flag(argv, "--served-model-name") == "smol"
    assert _flag(argv, "--logprobs-mode") == "raw_logprobs"
    assert int(_flag(argv, "--max-logprobs")) >= 5
    spec = json.loads(_flag(argv, "--speculative-config"))
    assert spec["method"] == "extract_hidden_states"
    assert spec["num_speculative_tokens"] == 1
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == list(
        range(31)
    )
    kv = json.loads(_flag(argv, "--kv-transfer-config"))
    assert kv == {
        "kv_connector": CONNECTOR_NAME,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "spool")},
    }
    assert argv[-2:] == ["--max-model-len", "2048"]


def test_command_without_capture_has_no_capture_flags(tmp_path):
    argv = vllm_server_command(
        tmp_path,
        host="0.0.0.0",
        port=1,
        layer_ids=None,
        spool_dir=None,
        dtype="bfloat16",
        served_model_name="m",
    )
    assert argv[0] == sys.executable
    assert "--speculative-config" not in argv and "--kv-transfer-config" not in argv


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layer_ids": [0, 1], "spool_dir": None}, "spool_dir"),
        ({"layer_ids": [0, 0], "spool_dir": "s"}, "distinct"),
        ({"layer_ids": [-1], "spool_dir": "s"}, "distinct"),
        ({"layer_ids": [0], "spool_dir": "s", "max_logprobs": 4}, "max_logprobs"),
    ],
)
def test_command_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vllm_server_command("m", host="h", port=1, dtype="float32", served_model_name="m", **kwargs)


def test_capture_flags_need_layers():
    with pytest.raises(ValueError):
        capture_flags([], "spool")


def test_env_cpu(tmp_path):
    env = vllm_server_env(
        {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}, gpu=None, cache_dir=tmp_path
    )
    assert env["PATH"] == "/bin"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        assert env[name].startswith(str(tmp_path) + os.sep), name
    assert 1 <= int(env["VLLM_CPU_KVCACHE_SPACE"]) <= 4
    assert "VLLM_PLUGINS" not in env  # unset means every plugin loads, hallulog's included


def test_env_gpu_and_plugin_allowlist(tmp_path):
    base = {"VLLM_CPU_KVCACHE_SPACE": "40", "VLLM_PLUGINS": "other"}
    env = vllm_server_env(base, gpu=3, cache_dir=tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_PLUGINS"] == "other,hallulog"
    assert base == {"VLLM_CPU_KVCACHE_SPACE": "40", "VLLM_PLUGINS": "other"}  # not mutated


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 3.0
vllm:num_requests_running{engine="1",model_name="smollm2"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 0.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="smollm2"} 1234.0
vllm:generation_tokens_total{engine="1",model_name="smollm2"} 6.0 1700000000000
vllm:generation_tokens_created{engine="0",model_name="smollm2"} 1.7e+09
vllm:prompt_tokens_total{engine="0",model_name="smollm2"} NaN
vllm:num_requests_running_other 99
"""


def test_parse_prometheus_counters_sums_label_sets():
    assert parse_prometheus_counters(METRICS) == {
        "vllm:num_requests_running": 4.0,
        "vllm:num_requests_waiting": 0.0,
        "vllm:generation_tokens_total": 1240.0,
    }


def test_parse_prometheus_counters_missing_and_custom_names():
    assert parse_prometheus_counters("") == {}
    assert parse_prometheus_counters(METRICS, names=["vllm:prompt_tokens_total"]) == {}


def test_engine_child_pids_finds_grandchildren():
    # parent -> child -> grandchild, like api_server -> EngineCore -> Worker
    leaf = "import time; time.sleep(60)"
    middle = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {leaf!r}]); time.sleep(60)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {middle!r}]); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while len(pids := engine_child_pids(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pids) == 2, pids
        assert parent.pid not in pids
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()
    deadline = time.monotonic() + 10
    while engine_child_pids(parent.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine_child_pids(parent.pid) == []


def test_engine_child_pids_of_unknown_pid_is_empty():
    assert engine_child_pids(2**22 + 12345) == []


def test_a_run_hands_vllm_its_listening_socket(tmp_path):
    """With ``inherited_socket`` the server is ``hallulog_vllm.serve``: vLLM's own server on the
    socket the run bound, given as ``--fd N`` (anywhere on the line); the rest is vLLM's."""
    from hallulog_vllm.serve import split_fd

    argv = vllm_server_command(
        tmp_path / "model",
        host="127.0.0.1",
        port=8123,
        layer_ids=None,
        spool_dir=None,
        dtype="float32",
        served_model_name="smol",
        python="/venv/bin/python",
        inherited_socket=True,
    )
    assert argv[:3] == ["/venv/bin/python", "-m", "hallulog_vllm.serve"]
    fd, rest = split_fd([*argv[3:], "--fd", "7"])
    assert fd == 7 and rest == argv[3:]
    assert split_fd(["--fd=9", "--port", "1"]) == (9, ["--port", "1"])
    with pytest.raises(SystemExit, match="--fd N"):
        split_fd(["--port", "1"])
