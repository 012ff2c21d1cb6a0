"""A real embedded server (real SmolLM2 model) started once per test session."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import httpx
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = float(os.environ.get("HALLULOG_SERVER_TIMEOUT", "300"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(
        self, base_url: str, spool: pathlib.Path, proc: subprocess.Popen, log: pathlib.Path
    ):
        self.base_url = base_url
        self.spool = spool
        self.proc = proc
        self.log = log

    def post(self, path: str, body: dict, timeout: float = 120) -> httpx.Response:
        return httpx.post(self.base_url + path, json=body, timeout=timeout)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.base_url + path, timeout=30)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    from hallulog.serving import default_model_dir

    default_model_dir()  # convert once, outside the server's startup timeout
    root = tmp_path_factory.mktemp("serving")
    spool, log = root / "spool", root / "server.log"
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "hallulog.serving",
        "--model",
        "default",
        "--port",
        str(port),
        "--spool-dir",
        str(spool),
        "--max-batch-size",
        "8",
        "--batch-wait-ms",
        "30",
        "--num-threads",
        os.environ.get("HALLULOG_TEST_THREADS", "1"),
        "--log-level",
        "warning",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"server not healthy after {STARTUP_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield ServerProcess(base, spool, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def reference():
    """The same model in this process, fp32, for comparing captures; and its tokenizer."""
    import torch
    from hallulog.serving import default_model_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)
