"""A planted leakage: a real study whose context passage holds the answer for half the prompts.

24 TriviaQA questions of the bundled sample become a ``--task qa`` JSONL with a ``context``
field; for every other question the context names the answer (the HaluEval-style artifact
PARALLAX describes), for the others it says nothing about it. The run shows the context
(``--with-context true``) to the real SmolLM2. Every planted prompt must be flagged (source
``context``), no other one, and the report's unleaked figures must differ from the all-prompt
ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hallulog.contracts.answer_match import answer_tokens
from hallulog.tasks import bundled_path

from tests.e2e.conftest import REPO, run_orchestrator

pytestmark = pytest.mark.e2e

N = 24


def _records() -> list[dict]:
    data = json.loads(bundled_path("triviaqa").read_text())["Data"]
    out = []
    for item in data:
        q, aliases = item["Question"], item["Answer"]["Aliases"]
        qt = answer_tokens(q)
        if any(t and " ".join(t) in " ".join(qt) for t in map(answer_tokens, aliases)):
            continue  # the question itself names the answer: not a planted leak
        i = len(out)
        context = (
            f"Background: a quiz card. The answer to this question is {item['Answer']['Value']}."
            if i % 2 == 0
            else "Background: a quiz card from a general-knowledge round."
        )
        out.append(
            {"id": item["QuestionId"], "question": q, "aliases": aliases, "context": context}
        )
        if len(out) == N:
            return out
    raise AssertionError("the bundled sample has too few questions")


def test_planted_leakage_is_flagged_and_changes_the_metrics(tmp_path):
    records = _records()
    data = tmp_path / "leaky.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    root = tmp_path / "run"
    proc = run_orchestrator(
        root,
        *("--task", "qa", "--task-path", str(data), "--answers-field", "aliases"),
        *("--id-field", "id", "--context-field", "context", "--with-context", "true"),
        *("--k-samples", "2", "--max-tokens", "16"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ev = subprocess.run(
        [sys.executable, "-m", "orchestrator", "evaluate", "--artifact-root", str(root)]
        + ["--no-embeddings", "--bootstrap", "100"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ),
        timeout=900,
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    out = root / "evaluation"
    report = json.loads((out / "report.json").read_text())
    import pyarrow.parquet as pq

    table = pq.read_table(out / "scores.parquet").to_pydict()
    prompts = {
        json.loads(line)["prompt_id"]: json.loads(line)["dataset_id"]
        for line in (root / "consolidated" / "prompt_index.jsonl").read_text().splitlines()
    }
    planted = {r["id"] for i, r in enumerate(records) if i % 2 == 0}
    flagged = {prompts[p] for p, lk in zip(table["prompt_id"], table["leaked"]) if lk}
    labelled = {prompts[p] for p in table["prompt_id"]}
    assert flagged == planted & labelled
    lk = report["leakage"]
    assert lk["leaked"] == len(flagged) and lk["by_source"] == {"context": len(flagged)}
    differ = [
        m
        for m, r in report["methods"].items()
        if r["unleaked"]["n"] < r["n"]
        and r["unleaked"].get("metrics", {}).get("auroc") is not None
        and abs(r["unleaked"]["metrics"]["auroc"] - r["auroc"]) > 1e-9
    ]
    assert differ, report["methods"]
    md = (out / "report.md").read_text()
    assert "## Leakage" in md and "AUROC unleaked" in md
    assert f"{lk['leaked']} of {lk['checked']} checked prompts leaked" in md
