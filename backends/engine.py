"""The engine options of a run's servers (tensor/pipeline parallel size, context length, memory
share, quantisation, eager mode, remote code, ``--engine-args``): their typed value, the checks
every backend shares, and how ``--gpus`` is cut into servers.

Which backend takes which option, and which flags its ``--engine-args`` may not give, is the
backend's own (``backends/base.py`` ``Backend.engine_problem``).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "EngineOptions",
    "ENGINE_FIELDS",
    "options_problem",
    "engine_args_problem",
    "gpus_problem",
    "gpu_groups",
]


@dataclass(frozen=True)
class EngineOptions:
    """A run's engine options (``RunConfig``'s fields of the same names); each default is the
    value that means "not set" (a command at the defaults is what it always was)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    quantization: str | None = None
    enforce_eager: bool = False
    trust_remote_code: bool = False
    engine_args: str | None = None
    max_memory_gb: float | None = None
    reasoning_parser: str = "auto"
    """vLLM's reasoning parser: ``auto`` (the backend picks by the model), ``none``, or a name."""

    @property
    def ranks(self) -> int:
        """Devices of one server (and of one Ray actor): tensor x pipeline parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def set_off_default(self) -> dict[str, object]:
        """The options set off their defaults, in field order."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }

    def given_flags(self) -> list[str]:
        """The flags of the options set off their defaults (``--quantization``, ...)."""
        return [f"--{name.replace('_', '-')}" for name in self.set_off_default()]

    def extra_args(self) -> list[str]:
        """``--engine-args`` split as a shell would (checked when the config was made)."""
        return shlex.split(self.engine_args) if self.engine_args else []


ENGINE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EngineOptions))
"""The option names (``RunConfig`` has a field of each name)."""


def options_problem(options: EngineOptions) -> str | None:
    """What is wrong with the values themselves, whatever the backend (one line), or None."""
    checks = [
        (options.tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1"),
        (options.pipeline_parallel_size >= 1, "--pipeline-parallel-size must be >= 1"),
        (
            options.max_model_len is None or options.max_model_len >= 2,
            "--max-model-len must be >= 2",
        ),
        (
            options.gpu_memory_utilization is None or 0 < options.gpu_memory_utilization <= 1,
            "--gpu-memory-utilization must be in (0, 1]",
        ),
        (
            options.max_memory_gb is None or options.max_memory_gb > 0,
            "--max-memory-gb must be > 0 (gigabytes)",
        ),
        (
            options.quantization is None or options.quantization.strip() != "",
            "--quantization must name a method (e.g. awq, gptq, fp8)",
        ),
        (
            options.reasoning_parser.strip() != "",
            "--reasoning-parser must be auto, none or a parser name (e.g. qwen3, deepseek_r1)",
        ),
    ]
    return next((message for ok, message in checks if not ok), None)


def engine_args_problem(engine_args: str | None, reserved: Mapping[str, str]) -> str | None:
    """Why ``--engine-args`` cannot be used (one line), or None when it can: it must split as
    a shell line would and give none of the ``reserved`` flags (flag → what to use instead)."""
    if not engine_args:
        return None
    try:
        argv = shlex.split(engine_args)
    except ValueError as exc:
        return f"--engine-args {engine_args!r}: {exc} (quote it as a shell would)"
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")  # vLLM takes --max_model_len too
        if flag in reserved:
            return f"--engine-args may not give {flag} (hallulog sets it: {reserved[flag]})"
    return None


def gpus_problem(gpus: tuple[int, ...], options: EngineOptions) -> str | None:
    """Why ``--gpus`` cannot be cut into servers of ``options.ranks`` GPUs, or None."""
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        return f"--gpus lists GPU {', '.join(map(str, twice))} more than once"
    tp, pp = options.tensor_parallel_size, options.pipeline_parallel_size
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
