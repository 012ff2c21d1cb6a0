"""Servers larger than one GPU and the engine pass-through: how ``--gpus`` is cut into servers,
each server's CUDA_VISIBLE_DEVICES and command line, the Ray actors' GPU requests, the one-line
refusals, and the manifest's parallel sizes. No process is started, no GPU or Ray needed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from hallulog.backends import servers as servers_mod
from hallulog.backends.engine import gpu_groups
from hallulog.backends.models import ModelInfo
from hallulog.backends.ports import release_port
from hallulog.backends.servers import server_command, start_servers
from hallulog.backends.vllm import VllmBackend, cpu_thread_binding, vllm_server_env
from hallulog.config.manifest import build_manifest
from hallulog.config.plan import plan_run, server_spec
from hallulog.config.run_config import ConfigError, RunConfig
from hallulog.contracts.config_cli import int_list
from hallulog.orchestrator.run.ray_executor import (
    RayExecutorError,
    actor_options,
    plan_actors,
    server_launch,
)
from hallulog.workers.ray_actor import SlotActor, _fill

MODEL = ModelInfo(
    path=Path("/models/llama-70b"), num_hidden_layers=80, hidden_size=8192, name="llama-70b"
)
LAYERS = [0, 40, 80]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class _Board:
    def __init__(self) -> None:
        self.updates: list[tuple[str, str]] = []

    def server_update(self, url: str, *, health: str, **_: object) -> None:
        self.updates.append((url, health))


@pytest.fixture
def spawned(monkeypatch, tmp_path):
    """start_servers with the processes not started: returns the ServerProcess objects."""
    monkeypatch.setattr(servers_mod.ServerProcess, "start", lambda self: None)
    # the command lines are built for vLLM, which this fast test does not need installed
    monkeypatch.setattr(VllmBackend, "require", lambda self: None)

    started: list = []

    def run(**kw) -> list:
        config = RunConfig(artifact_root=tmp_path / "run", **kw)
        servers, urls = start_servers(
            server_spec(config, MODEL, LAYERS),
            config.artifact_root,
            tmp_path / "cache",
            _Board(),
            wait=False,
        )
        assert urls == [s.url for s in servers]
        started.extend(servers)
        return servers

    yield run
    for server in started:  # the ports this process reserved for them (never started)
        release_port(server.port)


# ---- --gpus: ranges ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, ids",
    [
        ("0-7", tuple(range(8))),
        ("0,2-3", (0, 2, 3)),
        ("1,3", (1, 3)),
        ("4", (4,)),
        ("", ()),
        ("-1", (-1,)),
        (" 0 - 1 , 5", (0, 1, 5)),
    ],
)
def test_int_lists_take_ranges(text, ids):
    assert int_list(text) == ids


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "0-x"])
def test_int_lists_refuse_bad_ranges(text):
    with pytest.raises(argparse.ArgumentTypeError, match="ranges"):
        int_list(text)


# ---- grouping --------------------------------------------------------------------------------


def test_eight_gpus_tensor_parallel_two_make_four_servers(spawned):
    config = RunConfig(backend="vllm", gpus=int_list("0-7"), tensor_parallel_size=2)
    assert config.server_count == 4 and config.worker_count == 4
    assert gpu_groups(config.gpus, config.gpus_per_server) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    servers = spawned(backend="vllm", gpus=int_list("0-7"), tensor_parallel_size=2)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0,1", "2,3", "4,5", "6,7"]
    for i, s in enumerate(servers):
        assert _flag(s.command, "--tensor-parallel-size") == "2"
        assert "--pipeline-parallel-size" not in s.command
        assert _flag(s.command, "--distributed-executor-backend") == "mp"
        assert s.name == f"server_{i}" and s.url.endswith(f":{_flag(s.command, '--port')}")
    assert len({s.url for s in servers}) == 4


def test_tensor_and_pipeline_parallel_take_their_product(spawned):
    config = RunConfig(
        backend="vllm", gpus=int_list("0-7"), tensor_parallel_size=2, pipeline_parallel_size=2
    )
    assert config.gpus_per_server == 4 and config.server_count == 2
    servers = spawned(
        backend="vllm", gpus=int_list("0-7"), tensor_parallel_size=2, pipeline_parallel_size=2
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0,1,2,3", "4,5,6,7"]
    for s in servers:
        assert _flag(s.command, "--tensor-parallel-size") == "2"
        assert _flag(s.command, "--pipeline-parallel-size") == "2"


def test_uneven_gpu_lists_keep_their_order(spawned):
    servers = spawned(backend="vllm", gpus=(3, 1, 6, 7), tensor_parallel_size=2)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["3,1", "6,7"]


def test_one_gpu_per_server_is_unchanged(spawned):
    servers = spawned(backend="vllm", gpus=(0, 1))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0", "1"]
    for s in servers:
        for flag in (
            "--tensor-parallel-size",
            "--pipeline-parallel-size",
            "--distributed-executor-backend",
            "--max-model-len",
            "--quantization",
            "--enforce-eager",
            "--trust-remote-code",
            "--gpu-memory-utilization",
        ):
            assert flag not in s.command


def test_a_cpu_vllm_server_may_be_tensor_parallel(spawned):
    config = RunConfig(backend="vllm", tensor_parallel_size=2)
    assert config.server_count == 1 and gpu_groups((), config.gpus_per_server) == []
    (server,) = spawned(backend="vllm", tensor_parallel_size=2)
    assert server.env["CUDA_VISIBLE_DEVICES"] == ""
    assert _flag(server.command, "--tensor-parallel-size") == "2"


def test_cpu_ranks_get_their_own_cpus(spawned, tmp_path):
    assert cpu_thread_binding(2, range(16)) == "0-7|8-15"
    assert cpu_thread_binding(3, range(8)) == "0-2|3-5|6-7"
    assert cpu_thread_binding(2, [0, 2, 4, 6]) == "0,2|4,6"
    assert cpu_thread_binding(2, [0]) == "nobind"
    env = vllm_server_env({}, gpu=None, cache_dir=tmp_path, ranks=2)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == cpu_thread_binding(2)
    mine = vllm_server_env(
        {"VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7"}, gpu=None, cache_dir=tmp_path, ranks=2
    )
    assert mine["VLLM_CPU_OMP_THREADS_BIND"] == "0-3|4-7"  # the user's binding stands
    for env in (
        vllm_server_env({}, gpu=None, cache_dir=tmp_path),
        vllm_server_env({}, gpu=[0, 1], cache_dir=tmp_path, ranks=2),
    ):
        assert "VLLM_CPU_OMP_THREADS_BIND" not in env
    (server,) = spawned(backend="vllm", tensor_parallel_size=2)
    assert server.env["VLLM_CPU_OMP_THREADS_BIND"] == cpu_thread_binding(2)


def test_gpus_not_divisible_is_one_line_naming_both_flags():
    with pytest.raises(ConfigError) as info:
        RunConfig(backend="vllm", gpus=tuple(range(6)), tensor_parallel_size=4)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "--gpus gives 6 GPU(s), not a multiple of "
        "--tensor-parallel-size 4 x --pipeline-parallel-size 1"
    )
    with pytest.raises(ConfigError, match=r"--pipeline-parallel-size 2 = 4 GPU\(s\)"):
        RunConfig(backend="vllm", gpus=(0, 1, 2), tensor_parallel_size=2, pipeline_parallel_size=2)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"tensor_parallel_size": 0}, "--tensor-parallel-size must be >= 1"),
        ({"pipeline_parallel_size": 0}, "--pipeline-parallel-size must be >= 1"),
        ({"gpus": (0, 0)}, "--gpus lists GPU 0 more than once"),
        ({"gpu_memory_utilization": 1.5}, r"--gpu-memory-utilization must be in \(0, 1\]"),
        ({"max_model_len": 1}, "--max-model-len must be >= 2"),
        ({"num_workers": 1, "gpus": (0, 1, 2, 3), "tensor_parallel_size": 2}, "2 server"),
    ],
)
def test_bad_engine_values_are_refused(kw, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(backend="vllm", **kw)


def test_unmanaged_servers_ignore_the_gpu_grouping():
    config = RunConfig(
        backend="vllm",
        manage_servers=False,
        server_urls=("http://a:1",),
        gpus=(0, 1, 2),
        tensor_parallel_size=2,
    )
    assert config.server_count == 1


# ---- engine pass-through -------------------------------------------------------------------


def test_every_engine_option_reaches_the_vllm_command():
    config = RunConfig(
        backend="vllm",
        max_model_len=8192,
        gpu_memory_utilization=0.85,
        quantization="awq",
        enforce_eager=True,
        trust_remote_code=True,
        engine_args="--kv-cache-dtype fp8 --swap-space 8 --override-generation-config '{\"a\": 1}'",
    )
    spec = server_spec(config, MODEL, LAYERS)
    argv = server_command(spec, host="127.0.0.1", port=8100, spool_dir="/spool")
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--max-model-len") == "8192"
    assert _flag(argv, "--gpu-memory-utilization") == "0.85"
    assert _flag(argv, "--quantization") == "awq"
    assert "--enforce-eager" in argv and "--trust-remote-code" in argv
    assert argv[-6:] == [
        "--kv-cache-dtype",
        "fp8",
        "--swap-space",
        "8",
        "--override-generation-config",
        '{"a": 1}',
    ]  # last, split as a shell
    assert _flag(argv, "--model") == str(MODEL.path) and _flag(argv, "--port") == "8100"
    assert "--speculative-config" in argv and "--kv-transfer-config" in argv


@pytest.mark.parametrize(
    "engine_args, flag",
    [
        ("--port 9000", "--port"),
        ("--max_model_len=4096", "--max-model-len"),
        ("-tp 4", "-tp"),
        ("--dtype half", "--dtype"),
        ("--model other", "--model"),
        ("--tensor-parallel-size=2", "--tensor-parallel-size"),
    ],
)
def test_engine_args_may_not_give_what_hallulog_sets(engine_args, flag):
    with pytest.raises(ConfigError) as info:
        RunConfig(backend="vllm", engine_args=engine_args)
    assert str(info.value).startswith(f"--engine-args may not give {flag} (hallulog sets it")


def test_engine_args_must_split_as_a_shell_line():
    with pytest.raises(ConfigError, match="No closing quotation"):
        RunConfig(backend="vllm", engine_args="--chat-template 'x")


@pytest.mark.parametrize(
    "kw, flag",
    [
        ({"tensor_parallel_size": 2}, "--tensor-parallel-size 2"),
        ({"pipeline_parallel_size": 2}, "--pipeline-parallel-size 2"),
        ({"quantization": "awq"}, "--quantization awq"),
        ({"trust_remote_code": True}, "--trust-remote-code"),
        ({"enforce_eager": True}, "--enforce-eager"),
        ({"gpu_memory_utilization": 0.5}, "--gpu-memory-utilization 0.5"),
    ],
)
def test_vllm_only_options_are_refused_with_the_embedded_server(kw, flag):
    with pytest.raises(ConfigError) as info:
        RunConfig(**kw)
    assert str(info.value).startswith(f"{flag} is vLLM only (--backend vllm): the embedded")
    assert "\n" not in str(info.value)


def test_the_embedded_server_takes_max_model_len_and_engine_args(spawned):
    (server,) = spawned(max_model_len=512, engine_args="--num-threads 2 --max-batch-size 8")
    argv = server.command
    assert argv[:3] == [sys.executable, "-m", "hallulog.serving"]
    assert _flag(argv, "--max-model-len") == "512"
    assert argv[-4:] == ["--num-threads", "2", "--max-batch-size", "8"]
    with pytest.raises(ConfigError, match="--engine-args may not give --spool-dir"):
        RunConfig(engine_args="--spool-dir /x")


def test_embedded_servers_on_gpus_see_their_gpu(spawned):
    servers = spawned(gpus=(2, 5))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["2", "5"]


def test_unmanaged_servers_are_not_changed_and_say_so(caplog):
    config = RunConfig(
        backend="vllm",
        manage_servers=False,
        server_urls=("http://h:1",),
        tensor_parallel_size=4,
        quantization="fp8",
    )
    with caplog.at_level("INFO", logger="orchestrator.startup"):
        servers, urls = start_servers(
            server_spec(config, MODEL, LAYERS), Path("/nonexistent"), Path("/c"), _Board()
        )
    assert (servers, urls) == ([], ["http://h:1"])
    assert "--tensor-parallel-size, --quantization only recorded" in caplog.text


# ---- Ray ---------------------------------------------------------------------------------------


def test_ray_actors_ask_for_tensor_x_pipeline_gpus():
    config = RunConfig(
        backend="vllm",
        executor="ray",
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        ray_cpus_per_actor=4,
    )
    plan = plan_run(config, MODEL)
    assert plan_actors(config, plan, {"GPU": 16, "CPU": 64}) == (2, 16)
    options = actor_options(config, plan, gpu=True)
    assert options["num_gpus"] == 8 and options["num_cpus"] == 4
    assert actor_options(config, plan, gpu=False)["num_gpus"] == 0
    one = RunConfig(backend="vllm", executor="ray")
    assert actor_options(one, plan_run(one, MODEL), gpu=True)["num_gpus"] == 1
    assert plan_actors(one, plan_run(one, MODEL), {"GPU": 8, "CPU": 8}) == (8, 8)


def test_ray_plan_refuses_clusters_too_small_for_one_server():
    config = RunConfig(backend="vllm", executor="ray", tensor_parallel_size=4)
    with pytest.raises(
        RayExecutorError,
        match="--tensor-parallel-size 4 x "
        "--pipeline-parallel-size 1 needs 4 GPUs per actor; .* has 2",
    ):
        plan_actors(config, plan_run(config, MODEL), {"GPU": 2, "CPU": 8})
    many = RunConfig(backend="vllm", executor="ray", tensor_parallel_size=2, ray_actors=3)
    with pytest.raises(RayExecutorError, match="--ray-actors 3 needs 6 GPUs .*has 4"):
        plan_actors(many, plan_run(many, MODEL), {"GPU": 4, "CPU": 8})


def test_ray_server_launch_carries_the_engine_flags(tmp_path):
    config = RunConfig(
        backend="vllm",
        executor="ray",
        tensor_parallel_size=2,
        max_model_len=4096,
        engine_args="--swap-space 4",
    )
    plan = plan_run(config, MODEL)
    launch = server_launch(plan, tmp_path, gpu=True)
    argv = launch["command"]
    assert argv[0] == "{python}" and _flag(argv, "--port") == "{port}"
    assert _flag(argv, "--tensor-parallel-size") == "2"
    assert _flag(argv, "--max-model-len") == "4096" and argv[-2:] == ["--swap-space", "4"]
    assert "{spool_dir}" in _flag(argv, "--kv-transfer-config")
    assert launch["gpus"] == 2 and "CUDA_VISIBLE_DEVICES" not in launch["env"]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in launch["env"]
    filled = [_fill(a, {"{python}": "/py", "{port}": "7", "{spool_dir}": "/tmp/s"}) for a in argv]
    assert '"shared_storage_path":"/tmp/s"' in _flag(filled, "--kv-transfer-config")
    assert filled[0] == "/py" and _flag(filled, "--port") == "7"
    cpu = server_launch(plan, tmp_path, gpu=False)
    assert cpu["gpus"] == 0 and cpu["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"  # the node is not known here


def _actor(gpus: int) -> SlotActor:
    actor = SlotActor.__new__(SlotActor)
    actor.slot, actor.launch = 3, {"gpus": gpus}
    return actor


def test_an_actor_that_sees_fewer_gpus_than_its_server_spans_refuses(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert _actor(2)._devices() == "4,5"
    with pytest.raises(RuntimeError, match="spans 4 GPUs .*CUDA_VISIBLE_DEVICES='4,5'"):
        _actor(4)._devices()
    assert _actor(0)._devices() == ""


# ---- manifest ----------------------------------------------------------------------------------


def _manifest(config: RunConfig) -> dict:
    return build_manifest(
        config,
        run_id="r",
        model_name="m",
        model_path="/m",
        layer_ids=[0],
        hidden_size=1,
        num_hidden_layers=1,
        dataset="triviaqa",
        split="dev",
        prompt_template="t",
        worker_count=config.worker_count,
        total_prompts=1,
    )


def test_the_manifest_records_the_parallel_sizes():
    m = _manifest(
        RunConfig(
            backend="vllm", gpus=int_list("0-7"), tensor_parallel_size=4, pipeline_parallel_size=2
        )
    )
    assert (m["tensor_parallel_size"], m["pipeline_parallel_size"]) == (4, 2)
    assert m["worker_count"] == 1
    m = _manifest(RunConfig())
    assert (m["tensor_parallel_size"], m["pipeline_parallel_size"]) == (1, 1)
    # the layout is not part of the fingerprint: a run resumes with another one
    assert (
        _manifest(RunConfig(backend="vllm", tensor_parallel_size=2))["config_fingerprint"]
        == _manifest(RunConfig(backend="vllm"))["config_fingerprint"]
    )
