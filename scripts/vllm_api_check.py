"""Every vLLM internal that hallulog relies on, checked in a vLLM source tree (docs/vllm.md,
"Versions checked").

hallulog_vllm/ (the plugin) subclasses vLLM's hidden-states connector and patches a CPU kernel;
backends/vllm.py and workers/client.py speak vLLM's command line and request fields. None of
that is a public API, so each vLLM release is read before the ``vllm`` extra's range admits it:

    python scripts/vllm_api_check.py check SRC          # each item present in SRC
    python scripts/vllm_api_check.py diff OLD NEW       # each item's source equal in both

SRC is a folder holding ``vllm/`` (an unpacked sdist from PyPI, ``pip download --no-deps
--no-binary :all: vllm==X`` or the files page, or an installed site-packages). ``check`` needs
every item; ``diff`` prints ``same`` or ``CHANGED`` per item (a class is compared whole: the
plugin's subclass relies on its internals). The last line is one JSON object; exit 1 when an
item is missing (``check``) or missing or changed (``diff``).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"
CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
CHAT = "vllm/entrypoints/openai/chat_completion/protocol.py"
COMPLETION = "vllm/entrypoints/openai/completion/protocol.py"
#: the frontend flags' dataclass moved in 0.33; either file
FRONTEND = ("vllm/entrypoints/common/cli_args.py", "vllm/entrypoints/launchers/cli_args.py")

#: (who uses it, file or candidate files, kind, name): kind "symbol" is a class, function,
#: method (``Class.method``) or class attribute; "text" a string the file must contain
ITEMS: list[tuple[str, str | tuple[str, ...], str, str]] = [
    # hallulog_vllm/plugin.py: the connector's registration and the expand-kernel fix
    ("plugin", FACTORY, "symbol", "KVConnectorFactory.register_connector"),
    ("plugin", FACTORY, "symbol", "KVConnectorFactory._registry"),
    ("plugin", "vllm/plugins/__init__.py", "text", '"vllm.general_plugins"'),
    ("plugin", "vllm/platforms/interface.py", "symbol", "Platform.is_cpu"),
    ("plugin", "vllm/platforms/interface.py", "symbol", "Platform.import_kernels"),
    ("plugin", "vllm/triton_utils/__init__.py", "text", "HAS_TRITON"),
    ("plugin", "vllm/triton_utils/dispatcher.py", "symbol", "register_kernels"),
    ("plugin", "vllm/triton_utils/dispatcher.py", "symbol", "_registry"),
    ("plugin", "vllm/utils/cpu_triton_utils.py", "symbol", "_expand_kernel_impl"),
    ("plugin", "vllm/v1/sample/rejection_sampler.py", "symbol", "expand_kernel"),
    # hallulog_vllm/connector.py: a subclass of upstream's connector, on its internals
    ("connector", CONNECTOR, "symbol", "ExampleHiddenStatesConnector"),
    ("connector", CONNECTOR, "symbol", "PendingSave"),
    ("connector", CONNECTOR, "symbol", "extract_from_kv_cache"),
    ("connector", "vllm/v1/core/sched/scheduler.py", "symbol", "Scheduler._connector_finished"),
    ("connector", "vllm/v1/request.py", "text", "self.kv_transfer_params"),
    ("connector", "vllm/v1/request.py", "text", "self.num_prompt_tokens"),
    # backends/vllm.py capture_flags: --speculative-config and --kv-transfer-config
    ("capture", "vllm/config/speculative.py", "text", '"extract_hidden_states"'),
    ("capture", "vllm/transformers_utils/configs/extract_hidden_states.py", "symbol", "ExtractHiddenStatesConfig"),
    ("capture", "vllm/v1/spec_decode/extract_hidden_states.py", "text", "eagle_aux_hidden_state_layer_ids"),
    ("capture", "vllm/model_executor/models/extract_hidden_states.py", "symbol", "ExtractHiddenStatesModel"),
    ("capture", "vllm/config/kv_transfer.py", "symbol", "KVTransferConfig.kv_connector"),
    ("capture", "vllm/config/kv_transfer.py", "symbol", "KVTransferConfig.kv_role"),
    ("capture", "vllm/config/kv_transfer.py", "symbol", "KVTransferConfig.kv_connector_extra_config"),
    ("capture", CONNECTOR, "text", '"shared_storage_path"'),
    ("capture", CONNECTOR, "text", '"hidden_states_path"'),
    # workers/client.py: request and response fields
    ("client", CHAT, "symbol", "ChatCompletionRequest.return_token_ids"),
    ("client", CHAT, "symbol", "ChatCompletionRequest.kv_transfer_params"),
    ("client", CHAT, "symbol", "ChatCompletionRequest.chat_template_kwargs"),
    ("client", CHAT, "symbol", "ChatMessage.reasoning"),
    ("client", CHAT, "symbol", "ChatCompletionResponse.prompt_token_ids"),
    ("client", CHAT, "symbol", "ChatCompletionResponse.kv_transfer_params"),
    ("client", COMPLETION, "symbol", "CompletionRequest.return_token_ids"),
    ("client", COMPLETION, "symbol", "CompletionRequest.kv_transfer_params"),
    ("client", COMPLETION, "symbol", "CompletionResponse.kv_transfer_params"),
    ("client", COMPLETION, "symbol", "CompletionResponseChoice.prompt_token_ids"),
    # backends/vllm.py vllm_server_command / engine_flags: the flags (EngineArgs fields)
    ("flags", "vllm/entrypoints/openai/api_server.py", "text", '__name__ == "__main__"'),
    # hallulog_vllm/serve.py: the listening socket the run bound, handed to vLLM's launcher
    ("serve", "vllm/entrypoints/launchers/launcher.py", "symbol", "create_server_socket"),
    *[
        ("flags", "vllm/engine/arg_utils.py", "symbol", f"EngineArgs.{field}")
        for field in (
            "model", "served_model_name", "dtype", "max_logprobs", "logprobs_mode",
            "generation_config", "speculative_config", "kv_transfer_config",
            "tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend",
            "max_model_len", "gpu_memory_utilization", "quantization", "enforce_eager",
            "trust_remote_code", "reasoning_parser",
        )
    ],
    ("flags", "vllm/config/model.py", "text", '"raw_logprobs"'),
    *[("flags", FRONTEND, "symbol", f"FrontendArgs.{f}") for f in ("host", "port", "disable_uvicorn_access_log")],
    # backends/vllm.py vllm_server_env and the watchdog's metrics
    *[
        ("env", "vllm/envs.py", "text", f'"{name}"')
        for name in (
            "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_PLUGINS",
            "VLLM_CACHE_ROOT", "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK",
        )
    ],
    *[
        ("metrics", "vllm/v1/metrics/loggers.py", "text", f'"vllm:{name}"')
        for name in ("generation_tokens", "num_requests_running", "num_requests_waiting")
    ],
]  # fmt: skip


def _file(root: Path, where: str | tuple[str, ...]) -> Path | None:
    for rel in (where,) if isinstance(where, str) else where:
        if (root / rel).is_file():
            return root / rel
    return None


def _symbol(source: str, dotted: str) -> str | None:
    """The source text of a top-level or class-level definition (``Class.name``), else None."""
    body = ast.parse(source).body
    node = None
    for part in dotted.split("."):
        node = next((n for n in body if _defines(n, part)), None)
        if node is None:
            return None
        body = getattr(node, "body", [])
    return ast.get_source_segment(source, node)


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name == name
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    return False


def read(root: Path, item: tuple) -> str | None:
    """What the item is in ``root``: its source text (a symbol), the string (a text), or None."""
    _who, where, kind, name = item
    path = _file(root, where)
    if path is None:
        return None
    source = path.read_text(encoding="utf-8")
    if kind == "symbol":
        return _symbol(source, name)
    return name if name in source else None


def _root(arg: str) -> Path:
    root = Path(arg)
    if not (root / "vllm" / "__init__.py").is_file():
        sys.exit(f"{root}: no vllm/__init__.py here (give the folder that holds vllm/)")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("check").add_argument("src")
    d = sub.add_parser("diff")
    d.add_argument("old")
    d.add_argument("new")
    args = parser.parse_args(argv)
    roots = [_root(args.src)] if args.mode == "check" else [_root(args.old), _root(args.new)]
    missing, changed = [], []
    for item in ITEMS:
        who, where, _kind, name = item
        seen = [read(root, item) for root in roots]
        label = f"{who:9} {name}  ({where if isinstance(where, str) else ' or '.join(where)})"
        if any(s is None for s in seen):
            missing.append(name)
            print(f"MISSING  {label}")
        elif len(seen) == 2 and seen[0] != seen[1]:
            changed.append(name)
            print(f"CHANGED  {label}")
        else:
            print(f"{'same' if len(seen) == 2 else 'ok':8} {label}")
    print(json.dumps({"items": len(ITEMS), "missing": missing, "changed": changed}))
    return 1 if missing or changed else 0


if __name__ == "__main__":
    sys.exit(main())
