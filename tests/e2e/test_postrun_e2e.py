"""After the queue drains: consolidation, validation, repair, exports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, free_port_block, read_jsonl, run_orchestrator
from tests.e2e.faulty_proxy import FaultyProxy

pytestmark = pytest.mark.e2e


def _cli(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_orchestrator(root, *args, timeout=timeout)


def test_consolidated_is_clean_hardlinked_and_exported(small_run: Path):
    out = small_run / "consolidated"
    report = json.loads((out / "validation_report.json").read_text())
    assert report["ok"] and report["problems"] == [], report["problem_counts"]
    assert report["counts"] == {"prompts": 10, "generations": 30, "activations": 30}
    for row in read_jsonl(out / "activation_index.jsonl"):
        consolidated = out / row["file_path"]
        original = small_run / row["source_path"]
        assert os.stat(consolidated).st_ino == os.stat(original).st_ino
    manifest = json.loads((small_run / "run_manifest.json").read_text())
    assert manifest["consolidation"]["prompts"] == 10
    assert manifest["consolidation"]["activation_modes"] == {"link": 30}

    exports = out / "exports"
    selfcheck = read_jsonl(exports / "selfcheck_samples.jsonl")
    assert len(selfcheck) == 10
    for row in selfcheck:
        assert row["sample_ids"] == [0, 1, 2] and len(row["samples"]) == 2
        assert row["label"] in (0, 1) and row["primary"]["sample_id"] == 0
    for row in read_jsonl(exports / "semantic_entropy_inputs.jsonl"):
        assert len(row["samples"]) == 2
        for s in [row["primary"], *row["samples"]]:
            assert abs(s["sum_logprob"] - sum(s["token_logprobs"])) < 1e-6
    for row in read_jsonl(exports / "semantic_energy_inputs.jsonl"):
        assert row["logit_source"] == "raw_logits" and len(row["samples"]) == 3
        assert all(len(s["token_logits"]) == len(s["token_logprobs"]) for s in row["samples"])
    for row in read_jsonl(exports / "geometry_inputs.jsonl"):
        assert row["activation_key"] == f"{row['prompt_id']}_0" and row["reference_answer"]
        assert row["prompt_end_row"] == 0  # response mode: row 0 is the last prompt token
        assert row["answer_token_rows"][0] == 1
    for row in read_jsonl(exports / "logprob_inputs.jsonl"):
        assert len(row["tokens"]) == len(row["token_logprobs"]) == len(row["top_logprobs"])
    _fields_match_docs(exports)


def _fields_match_docs(exports: Path) -> None:
    """Every top-level field of every export is documented in docs/exports.md, and vice versa."""
    doc = (REPO / "docs" / "exports.md").read_text()
    for path in exports.glob("*.jsonl"):
        section = doc.split(f"## `{path.name}`")[1].split("\n## ")[0]
        documented = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
        fields = set(read_jsonl(path)[0])
        assert fields == documented, (path.name, fields ^ documented)


def test_validation_names_problems_and_repairs_fix_them(small_run: Path, tmp_path: Path):
    root = tmp_path / "run"
    shutil.copytree(small_run, root)
    out = root / "consolidated"
    # 1. a corrupted JSONL line
    lines = (out / "generations.jsonl").read_text().splitlines(keepends=True)
    lines[4] = lines[4][: len(lines[4]) // 2] + "\n"
    # 2. a duplicated prompt group (its prompt row and generations once more)
    dup_pid = json.loads(lines[0])["prompt_id"]
    lines += [ln for ln in lines[:3]]
    (out / "generations.jsonl").write_text("".join(lines))
    prompts = (out / "prompt_index.jsonl").read_text().splitlines(keepends=True)
    (out / "prompt_index.jsonl").write_text("".join(prompts + [p for p in prompts if dup_pid in p]))
    # 3. a deleted activation file
    act = read_jsonl(out / "activation_index.jsonl")[7]
    (out / act["file_path"]).unlink()

    proc = _cli(root, "--validate-only")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((out / "validation_report.json").read_text())
    by_class = {}
    for p in report["problems"]:
        by_class.setdefault(p["class"], []).append(p)
    assert by_class["consolidated_malformed_line"][0]["file"] == "consolidated/generations.jsonl"
    assert by_class["consolidated_malformed_line"][0]["line"] == 5
    assert any(
        p["file"] == "consolidated/prompt_index.jsonl" and p["line"] == 11
        for p in by_class["duplicate_id"]
    )
    missing = by_class["missing_activation_file"][0]
    assert missing["file"] == "consolidated/activation_index.jsonl" and missing["line"] == 8
    assert "hallulog consolidate" in report["repair"]["duplicate_id"]
    assert "repair:" in proc.stdout

    fixed = _cli(root, "--consolidate-only")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert json.loads((out / "validation_report.json").read_text())["ok"]


def test_injected_server_failures_then_retry_failed(tmp_path: Path, monkeypatch):
    """A proxy fails every request of one question; the group is queued again twice (run
    .dispatch), then recorded as failed; --retry-failed finishes the run."""
    monkeypatch.setenv("HALLULOG_GROUP_RETRIES", "2")
    monkeypatch.setenv("HALLULOG_GROUP_RETRY_BACKOFF", "0.5")
    from hallulog.serving.model_loader import default_model_dir

    model_dir = default_model_dir()
    port = free_port_block(1)
    spool = tmp_path / "spool"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hallulog.serving",
            "--model",
            str(model_dir),
            "--port",
            str(port),
            "--spool-dir",
            str(spool),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from hallulog.backends.servers import wait_healthy

        wait_healthy(f"http://127.0.0.1:{port}", 300, process=server)
        root = tmp_path / "run"
        args = [
            "--limit",
            "4",
            "--k-samples",
            "1",
            "--max-tokens",
            "12",
            "--manage-servers",
            "false",
            "--model",
            str(model_dir),
        ]
        from hallulog.tasks import load_task

        victim = load_task("triviaqa", limit=4).groups[2]
        needle = victim.meta["question"][:30]
        with FaultyProxy(f"http://127.0.0.1:{port}", needle) as proxy:
            first = _cli(root, *args, "--server-urls", proxy.url)
            # 3 attempts for each of the 2 requests, 3 times (the first try, 2 re-queues)
            assert proxy.failed == 3 * 2 * 3
        assert first.returncode == 3, first.stdout + first.stderr
        errors = read_jsonl(root / "worker_0" / "errors.jsonl")
        assert {e["prompt_id"] for e in errors} == {victim.prompt_id}
        assert len(errors) == 3  # one line per attempt of the group
        assert errors[0]["error_type"] == "generation_failed" and errors[0]["stack_trace"]
        with FaultyProxy(f"http://127.0.0.1:{port}", None) as proxy:
            second = _cli(root, *args, "--server-urls", proxy.url, "--retry-failed")
        assert second.returncode == 0, second.stdout + second.stderr
        assert "retrying 1 prompt(s)" in second.stdout
        report = json.loads((root / "consolidated" / "validation_report.json").read_text())
        assert report["ok"] and report["counts"]["prompts"] == 4
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_judge_task_is_labelled_after_the_run(tmp_path: Path):
    """A HalluLens task: the run's own server judges the answers before consolidation."""
    root = tmp_path / "run"
    proc = _cli(
        root, "--task", "mixedentities", "--limit", "2", "--k-samples", "1", "--max-tokens", "16"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    labels = read_jsonl(root / "labels.jsonl")
    assert len(labels) == 2 and all(row["judge_raw"] for row in labels)
    prompts = read_jsonl(root / "consolidated" / "prompt_index.jsonl")
    assert len(prompts) == 2
    for row in prompts:
        assert row["label_grader"] == "llm_judge" and row["judge_verdict"]
        assert row["label"] in (0, 1, None)
    report = json.loads((root / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report["problem_counts"]
