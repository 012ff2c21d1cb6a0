"""The embedded transformers server as a backend (``python -m hallulog.serving``,
docs/serving.md): its command line, environment and the run-bound socket it serves on."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hallulog.backends.base import Backend, ServerSpec

__all__ = ["EmbeddedBackend", "embedded_server_command", "EMBEDDED_RESERVED"]

# Flags of ``python -m hallulog.serving`` that hallulog sets itself (``--engine-args`` may not
# give them). Value: what to use instead.
EMBEDDED_RESERVED: dict[str, str] = {
    "--model": "use --model",
    "--served-model-name": "the name comes from --model",
    "--host": "servers listen on loopback",
    "--port": "use --server-base-port",
    "--spool-dir": "use --spool-root",
    "--dtype": "use --model-dtype",
    "--capture-layers": "use --layers / --logging-profile",
    "--max-model-len": "use --max-model-len",
    "--max-memory-gb": "use --max-memory-gb",
}


def embedded_server_command(
    model_dir: Path,
    *,
    host: str,
    port: int,
    spool_dir: Path,
    dtype: str,
    layer_ids: Sequence[int],
    served_model_name: str,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """Command line of the embedded transformers server (``python -m hallulog.serving``);
    ``extra_args`` come last (``--max-model-len``, ``--engine-args``)."""
    return [
        python, "-m", "hallulog.serving", "--model", str(model_dir), "--host", host,
        "--port", str(port), *_capture_args(layer_ids, spool_dir), "--dtype", dtype,
        "--served-model-name", served_model_name, *map(str, extra_args),
    ]  # fmt: skip


def _capture_args(layer_ids: Sequence[int], spool_dir: str | os.PathLike[str]) -> list[str]:
    return ["--spool-dir", os.fspath(spool_dir), "--capture-layers", ",".join(map(str, layer_ids))]


class EmbeddedBackend(Backend):
    """``--backend embedded``: hallulog's own server (``hallulog serve``), one device per
    server; it always serves on the socket the run bound (``--fd``)."""

    name = "embedded"
    default_groups_in_flight = 32
    takes = frozenset({"max_model_len", "max_memory_gb", "engine_args"})
    reserved = EMBEDDED_RESERVED
    process_markers = (b"-m hallulog.serving ",)
    attention_in_pass = True  # serving/attention_capture.py

    def refuse_option(self, name: str, value: Any) -> str:
        shown = "" if isinstance(value, bool) else f" {value}"
        why = (
            "runs a model on one device" if name.endswith("parallel_size") else "has no such option"
        )
        return (
            f"--{name.replace('_', '-')}{shown} is vLLM only (--backend vllm): "
            f"the {self.name} server {why}"
        )

    def capture_args(
        self, layer_ids: Sequence[int], spool_dir: str | os.PathLike[str]
    ) -> list[str]:
        return _capture_args(layer_ids, spool_dir)

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
        extra = spec.engine.extra_args()
        if spec.engine.max_memory_gb is not None:
            extra = ["--max-memory-gb", f"{spec.engine.max_memory_gb:g}", *extra]
        if spec.engine.max_model_len is not None:
            extra = ["--max-model-len", str(spec.engine.max_model_len), *extra]
        return embedded_server_command(
            spec.model_path, host=host, port=port, spool_dir=Path(spool_dir),
            dtype=spec.model_dtype, layer_ids=spec.layer_ids, served_model_name=spec.model_name,
            extra_args=extra, python=python,
        )  # fmt: skip

    def environment(
        self,
        base: Mapping[str, str],
        *,
        gpus: tuple[int, ...] | None,
        cache_dir: Path,
        ranks: int,
        run_dir: str,
    ) -> dict[str, str]:
        env = dict(base)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        env["HALLULOG_CACHE_DIR"] = str(cache_dir)
        return env
