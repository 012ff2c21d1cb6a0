"""The run end to end on the embedded server with the real SmolLM2 model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import REPO, orchestrator_cmd, run_orchestrator, worker_rows

pytestmark = pytest.mark.e2e

NUM_LAYERS, HIDDEN = 30, 576


def test_every_prompt_has_all_artifacts(small_run: Path):
    manifest = json.loads((small_run / "run_manifest.json").read_text())
    assert manifest["k_samples"] == 2 and manifest["logging_profile"] == "integrated"
    assert manifest["layer_ids"] == list(range(NUM_LAYERS + 1))
    prompts = worker_rows(small_run, "prompt_index.jsonl")
    gens = worker_rows(small_run, "generations.jsonl")
    acts = {r["activation_key"]: r for r in worker_rows(small_run, "activation_index.jsonl")}
    assert len(prompts) == 10 and len({p["prompt_id"] for p in prompts}) == 10
    assert len(gens) == 30
    for p in prompts:
        assert p["label"] in (0, 1) and p["label_grader"] == "alias_match"
        assert p["prompt_token_ids"] and p["reference_answer"]
        mine = sorted(
            (g for g in gens if g["prompt_id"] == p["prompt_id"]), key=lambda g: g["sample_id"]
        )
        assert [g["sample_id"] for g in mine] == [0, 1, 2]
        assert mine[0]["role"] == "primary" and mine[0]["request_params"]["temperature"] == 0.0
        for g in mine:
            assert g["token_ids"] and len(g["logprobs"]) == len(g["token_ids"])
            assert all(len(t["top_logprobs"]) == 5 for t in g["logprobs"])
            assert g["usage"]["completion_tokens"] == len(g["token_ids"])
            row = acts[g["activation_key"]]
            assert row["layers"] == list(range(NUM_LAYERS + 1))
            r = row["response_token_count"]
            # response mode, captured during generation: last prompt token + all but the last
            # response token = R rows, starting at position P-1
            assert row["shape"] == [NUM_LAYERS + 1, r, HIDDEN]
            assert row["row0_position"] == row["prompt_token_count"] - 1
            path = small_run / f"worker_{row['worker_id']}" / row["file_path"]
            arr = np.load(path, mmap_mode="r")
            assert arr.shape == tuple(row["shape"]) and arr.dtype == np.float16
    completed = json.loads((small_run / "completed_prompts.json").read_text())["completed"]
    assert sorted(completed) == sorted(p["prompt_id"] for p in prompts)
    assert not list((small_run / "spool").rglob("*.safetensors")), "spool files left behind"


def test_stored_activations_equal_transformers(small_run: Path):
    """Capture is right: stored rows equal what transformers computes for the same ids."""
    import torch
    from hallulog.serving.model_loader import default_model_dir
    from transformers import AutoModelForCausalLM

    prompts = {p["prompt_id"]: p for p in worker_rows(small_run, "prompt_index.jsonl")}
    gens = worker_rows(small_run, "generations.jsonl")
    acts = {r["activation_key"]: r for r in worker_rows(small_run, "activation_index.jsonl")}
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32)
    model.eval()
    pre_norm = {}
    model.model.norm.register_forward_pre_hook(lambda m, a: pre_norm.__setitem__("x", a[0]))
    checked = 0
    for g in [gens[0], gens[-1]]:  # a primary and a sampled generation
        row = acts[g["activation_key"]]
        ids = prompts[g["prompt_id"]]["prompt_token_ids"] + g["token_ids"][:-1]
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
        ref = [h[0] for h in out.hidden_states[:NUM_LAYERS]] + [pre_norm["x"][0]]
        ref = torch.stack(ref).numpy()[:, row["row0_position"] :]  # (L, rows, H)
        stored = np.load(small_run / f"worker_{row['worker_id']}" / row["file_path"])
        assert stored.shape == ref.shape
        for layer in range(NUM_LAYERS + 1):
            scale = max(1.0, float(np.abs(ref[layer]).max()))
            err = float(np.abs(stored[layer].astype(np.float32) - ref[layer]).max())
            assert err <= 2e-3 * scale, (layer, err, scale)
        checked += 1
    assert checked == 2


def test_labels_are_alias_matches(small_run: Path):
    from hallulog.contracts.answer_match import alias_match_label

    gens = {
        (g["prompt_id"], g["sample_id"]): g for g in worker_rows(small_run, "generations.jsonl")
    }
    for p in worker_rows(small_run, "prompt_index.jsonl"):
        primary = gens[(p["prompt_id"], 0)]
        assert p["label"] == alias_match_label(primary["text"], p["reference"]["aliases"])


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _committed(root: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in root.glob("worker_*/prompt_index.jsonl"))


def test_resume_after_sigkill(tmp_path: Path):
    """SIGKILL the orchestrator mid-run; the rerun completes with no prompt missing or doubled."""
    args = [
        "--limit",
        "12",
        "--k-samples",
        "1",
        "--max-tokens",
        "16",
        "--checkpoint-every",
        "1",
        "--groups-in-flight",
        "2",
    ]
    cmd = orchestrator_cmd(tmp_path, *args)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(
            lambda: _committed(tmp_path) >= 3 or proc.poll() is not None, 600, "3 committed prompts"
        )
        assert proc.poll() is None, "run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = _committed(tmp_path)
    assert before < 12
    # the workers die with the orchestrator (PDEATHSIG); the server is cleaned up by the rerun
    rerun = run_orchestrator(tmp_path, *args)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    prompts = worker_rows(tmp_path, "prompt_index.jsonl")
    ids = [p["prompt_id"] for p in prompts]
    assert len(ids) == 12 and len(set(ids)) == 12
    gens = worker_rows(tmp_path, "generations.jsonl")
    keys = [(g["prompt_id"], g["sample_id"]) for g in gens]
    assert len(keys) == 24 and len(set(keys)) == 24
    acts = worker_rows(tmp_path, "activation_index.jsonl")
    assert len({a["activation_key"] for a in acts}) == len(acts) == 24
    completed = json.loads((tmp_path / "completed_prompts.json").read_text())["completed"]
    assert sorted(completed) == sorted(ids)
    # the default store (packed) survived the kill: every sample reads back through the
    # consolidated manifest over the worker shards, with the shape the index records
    from hallulog import storage

    reader = storage.open_store(tmp_path / "consolidated" / "activations")
    keys = {k: i for i, k in enumerate(reader.keys())}
    assert set(keys) == {a["activation_key"] for a in acts}
    for a in acts:
        arr = reader.read(keys[a["activation_key"]], 0)
        assert arr.shape == (a["shape"][1], a["shape"][2])
    reader.close()
    report = json.loads((tmp_path / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report["problem_counts"]
    assert "12/12 prompts done" in rerun.stdout, rerun.stdout


def test_malformed_dataset_line_names_file_and_line(tmp_path: Path):
    bad = tmp_path / "bad-dev.json"
    bad.write_text(
        '{"Data": [\n  {"Question": "Q1?", "QuestionId": "q1",\n'
        '   "Answer": {"Value": "A", "Aliases": ["A"], "NormalizedAliases": ["a"]}},\n'
        '  {"Question": "Q2?", "QuestionId": "q2"}\n], "Split": "dev"}\n'
    )
    proc = run_orchestrator(tmp_path / "out", "--task-path", str(bad), timeout=120)
    assert proc.returncode != 0
    assert f"{bad}:4" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out" / "run_manifest.json").exists()


def test_resume_with_other_config_is_refused(small_run: Path):
    proc = run_orchestrator(small_run, "--limit", "10", "--k-samples", "3", timeout=300)
    assert proc.returncode == 1
    assert "k_samples: 2 -> 3" in proc.stderr


def test_hung_server_is_restarted_and_the_run_completes(tmp_path: Path):
    """SIGSTOP the embedded server mid-run: the watchdog restarts it, the run completes."""
    args = [
        "--limit",
        "6",
        "--k-samples",
        "1",
        "--max-tokens",
        "16",
        "--groups-in-flight",
        "1",
        "--watchdog-stall-seconds",
        "8",
        "--request-timeout",
        "120",
    ]
    proc = subprocess.Popen(
        orchestrator_cmd(tmp_path, *args),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pidfile = tmp_path / "servers" / "server_0.pid"
    try:
        _wait_for(
            lambda: _committed(tmp_path) >= 1 or proc.poll() is not None, 600, "a committed prompt"
        )
        assert proc.poll() is None
        server_pid = int(pidfile.read_text().split()[0])
        os.kill(server_pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    assert "6/6 prompts done" in out
    assert "restarting server_0 (stalled)" in err
    new_pid = None if not pidfile.exists() else int(pidfile.read_text().split()[0])
    assert new_pid != server_pid
    with pytest.raises(ProcessLookupError):  # the hung process is gone, not left stopped
        os.kill(server_pid, 0)
    ids = [p["prompt_id"] for p in worker_rows(tmp_path, "prompt_index.jsonl")]
    assert len(ids) == len(set(ids)) == 6
