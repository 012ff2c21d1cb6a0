"""The engine options of a run (tensor/pipeline parallel size, context length, memory share,
quantisation, eager mode, remote code, ``--engine-args``): which backend takes which, which
flags ``--engine-args`` may not give, how ``--gpus`` is cut into servers.

Pure functions of the config's values, imported by ``hallulog.config.run_config`` (the checks) and by
``hallulog.orchestrator.run`` (the command lines); they import nothing of the project.
"""

from __future__ import annotations

import shlex
from typing import Any

__all__ = [
    "VLLM_ONLY",
    "VLLM_RESERVED",
    "EMBEDDED_RESERVED",
    "engine_problem",
    "engine_args_problem",
    "gpu_groups",
    "set_engine_options",
]

#: RunConfig fields only vLLM has, with the value that means "not set".
VLLM_ONLY: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "gpu_memory_utilization": None,
    "quantization": None,
    "enforce_eager": False,
    "trust_remote_code": False,
}

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
}

# The same for ``hallulog serve`` (the embedded server).
EMBEDDED_RESERVED: dict[str, str] = {
    "--model": "use --model",
    "--served-model-name": "the name comes from --model",
    "--host": "servers listen on loopback",
    "--port": "use --server-base-port",
    "--spool-dir": "use --spool-root",
    "--dtype": "use --model-dtype",
    "--capture-layers": "use --layers / --logging-profile",
    "--max-model-len": "use --max-model-len",
}


def set_engine_options(config: Any) -> list[str]:
    """The flags of the engine options ``config`` sets off their defaults (``--quantization``,
    ...), in field order."""
    return [
        f"--{name.replace('_', '-')}"
        for name in (*VLLM_ONLY, "max_model_len", "engine_args")
        if getattr(config, name) != VLLM_ONLY.get(name)
    ]


def engine_args_problem(backend: str, engine_args: str | None) -> str | None:
    """Why ``--engine-args`` cannot be used with ``backend`` (one line), or None when it can:
    it must split as a shell line would and give no flag hallulog sets itself."""
    if not engine_args:
        return None
    try:
        argv = shlex.split(engine_args)
    except ValueError as exc:
        return f"--engine-args {engine_args!r}: {exc} (quote it as a shell would)"
    reserved = VLLM_RESERVED if backend == "vllm" else EMBEDDED_RESERVED
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")  # vLLM takes --max_model_len too
        if flag in reserved:
            return f"--engine-args may not give {flag} (hallulog sets it: {reserved[flag]})"
    return None


def engine_problem(config: Any) -> str | None:
    """What is wrong with ``config``'s engine options (a RunConfig), in one line naming the
    flags, or None."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    checks = [
        (tp >= 1, "--tensor-parallel-size must be >= 1"),
        (pp >= 1, "--pipeline-parallel-size must be >= 1"),
        (config.max_model_len is None or config.max_model_len >= 2, "--max-model-len must be >= 2"),
        (
            config.gpu_memory_utilization is None or 0 < config.gpu_memory_utilization <= 1,
            "--gpu-memory-utilization must be in (0, 1]",
        ),
        (
            config.quantization is None or config.quantization.strip() != "",
            "--quantization must name a method (e.g. awq, gptq, fp8)",
        ),
    ]
    for ok, message in checks:
        if not ok:
            return message
    if config.backend != "vllm":
        for name, unset in VLLM_ONLY.items():
            value = getattr(config, name)
            if value != unset:
                shown = "" if isinstance(value, bool) else f" {value}"
                why = (
                    "runs a model on one device"
                    if name.endswith("parallel_size")
                    else "has no such option"
                )
                return (
                    f"--{name.replace('_', '-')}{shown} is vLLM only (--backend vllm): "
                    f"the {config.backend} server {why}"
                )
    problem = engine_args_problem(config.backend, config.engine_args)
    if problem is not None:
        return problem
    gpus = tuple(config.gpus)
    if config.manage_servers and gpus:
        twice = sorted({g for g in gpus if gpus.count(g) > 1})
        if twice:
            return f"--gpus lists GPU {', '.join(map(str, twice))} more than once"
        if len(gpus) % (tp * pp):
            return (
                f"--gpus gives {len(gpus)} GPU(s), not a multiple of "
                f"--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} "
                f"= {tp * pp} GPU(s) per server"
            )
    return None


def gpu_groups(gpus: tuple[int, ...], per_server: int) -> list[tuple[int, ...]]:
    """``gpus`` cut in order into consecutive groups of ``per_server`` (a remainder is dropped:
    the config refuses it first). ``(0..7), 2`` → ``(0, 1), (2, 3), (4, 5), (6, 7)``."""
    return [
        tuple(gpus[i : i + per_server]) for i in range(0, len(gpus) - per_server + 1, per_server)
    ]
