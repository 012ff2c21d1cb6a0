"""Every preset and the generic ``qa`` task, run end to end on the real embedded model.

One embedded server serves every run (``--manage-servers false``); each run reads its preset's
bundled sample in the released layout, and must come out labelled, consolidated, exported and
validated like a TriviaQA run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, free_port_block, read_jsonl

pytestmark = pytest.mark.e2e

PRESET_KINDS = {
    "nq_open": "aliases",
    "squad": "aliases",
    "hotpotqa": "aliases",
    "popqa": "aliases",
    "truthfulqa": "judge",
    "sciq": "choice",
    "mmlu": "choice",
    "gsm8k": "numeric",
    "svamp": "numeric",
    "bioasq": "aliases",
}
GRADERS = {
    "aliases": "alias_match",
    "choice": "choice_match",
    "numeric": "numeric_match",
    "judge": "llm_judge",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> str:
    from hallulog.backends.servers import wait_healthy
    from hallulog.serving.model_loader import default_model_dir

    port = free_port_block(1)
    spool = tmp_path_factory.mktemp("spool")
    proc = subprocess.Popen(
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
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 300, process=proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _run(server: str, root: Path, *args: str, command: str = "run") -> subprocess.CompletedProcess:
    from hallulog.serving.model_loader import default_model_dir

    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        command,
        "--artifact-root",
        str(root),
        "--manage-servers",
        "false",
        "--server-urls",
        server,
        "--model",
        str(default_model_dir()),
        "--progress",
        "false",
        "--k-samples",
        "1",
        "--max-tokens",
        "12",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)


def _check_clean_run(root: Path, kind: str, prompts: int) -> list[dict]:
    manifest = json.loads((root / "run_manifest.json").read_text())
    assert manifest["answer_kind"] == kind
    assert manifest["prompt_template"] and manifest["prompt_template_hash"]
    rows = read_jsonl(root / "consolidated" / "prompt_index.jsonl")
    assert len(rows) == prompts
    for row in rows:
        assert row["reference"]["kind"] == kind
        assert row["label_grader"] == GRADERS[kind]
        assert row["label"] in (0, 1) if kind != "judge" else row["label"] in (0, 1, None)
    report = json.loads((root / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report["problem_counts"]
    exports = root / "consolidated" / "exports"
    assert len(read_jsonl(exports / "selfcheck_samples.jsonl")) == prompts
    return rows


@pytest.mark.parametrize("preset", sorted(PRESET_KINDS))
def test_preset_runs_and_labels(server: str, tmp_path: Path, preset: str):
    root = tmp_path / preset
    extra = ["--judge-url", server] if PRESET_KINDS[preset] == "judge" else []
    proc = _run(server, root, "--task", preset, "--limit", "3", *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_clean_run(root, PRESET_KINDS[preset], 3)


def test_squad_with_context_and_a_system_prompt(server: str, tmp_path: Path):
    root = tmp_path / "squad-ctx"
    proc = _run(
        server,
        root,
        "--task",
        "squad",
        "--limit",
        "2",
        "--with-context",
        "true",
        "--system-prompt",
        "You answer in a few words.",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _check_clean_run(root, "aliases", 2)
    for row in rows:
        assert row["messages"][0] == {"role": "system", "content": "You answer in a few words."}
        assert "Passage:" in row["messages"][-1]["content"]


def test_generic_qa_csv_with_fewshot_completions_then_evaluate(server: str, tmp_path: Path):
    """--task qa over a CSV with a context column, few-shot examples, the chat template off
    (the completions route), and `evaluate` on the result."""
    data = tmp_path / "study.csv"
    lines = ["qid,query,gold,passage"]
    facts = [
        ("Paris", "France"),
        ("Rome", "Italy"),
        ("Madrid", "Spain"),
        ("Berlin", "Germany"),
        ("Lisbon", "Portugal"),
        ("Vienna", "Austria"),
        ("Oslo", "Norway"),
        ("Athens", "Greece"),
        ("Dublin", "Ireland"),
        ("Warsaw", "Poland"),
    ]
    for i, (city, country) in enumerate(facts):
        # every third reference is a made-up city, so the labels hold both classes
        gold = "Zarnivek" if i % 3 == 2 else city
        lines.append(
            f'q{i},What is the capital of {country}?,"[""{gold}""]",'
            f"{city} is the capital of {country}."
        )
    data.write_text("\n".join(lines) + "\n")
    shots = tmp_path / "shots.csv"
    shots.write_text(
        "qid,query,gold,passage\ns1,What is the capital of Japan?,Tokyo,x\n"
        "s2,What is the capital of Peru?,Lima,x\n"
    )
    template = tmp_path / "prompt.j2"
    template.write_text("Q: {{ question }}\nA:")
    root = tmp_path / "qa"
    mapping = [
        "--task",
        "qa",
        "--question-field",
        "query",
        "--answers-field",
        "gold",
        "--id-field",
        "qid",
        "--context-field",
        "passage",
    ]
    proc = _run(
        server,
        root,
        *mapping,
        "--task-path",
        str(data),
        "--prompt-template-file",
        str(template),
        "--fewshot-path",
        str(shots),
        "--fewshot-k",
        "2",
        "--chat",
        "false",
        "--k-samples",
        "2",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _check_clean_run(root, "aliases", len(facts))
    assert rows[0]["messages"] == []
    assert rows[0]["prompt"].startswith("Q: What is the capital of Japan?\nA: Tokyo\n\n")
    # the same study resumed with another prompt is refused
    other = _run(
        server,
        root,
        *mapping,
        "--task-path",
        str(data),
        "--prompt-template",
        "Question: {{ question }}\nAnswer:",
        "--fewshot-path",
        str(shots),
        "--fewshot-k",
        "2",
        "--chat",
        "false",
        "--k-samples",
        "2",
    )
    assert other.returncode != 0 and "prompt_template_hash" in other.stderr, other.stderr
    ev = subprocess.run(
        [sys.executable, "-m", "orchestrator", "evaluate", "--artifact-root", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert ev.returncode == 0, ev.stdout + ev.stderr
