"""Graders: judge-output parsing, alias grader and the other answer kinds after the run, the
generic judge, LLM judge against the real embedded server, label_run (append-only, resumable),
label_counts."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hallulog.contracts.errors import HallulogError
from hallulog.postrun.labels import apply_label, label_counts, label_run, load_labels
from hallulog.tasks import judge_prompts as jp
from hallulog.tasks.grading import grader_for, judge_grader, needs_judge, needs_judge_for
from hallulog.tasks.hallulens_grading import JudgeGrader, accepted_answers
from hallulog.tasks.judge_parsing import parse_choice, parse_longwiki
from hallulog.tasks.triviaqa import AliasGrader
from hallulog.tasks.verdict import Verdict, detect_abstention

REPO = Path(__file__).resolve().parents[2]


def run(coro):
    return asyncio.run(coro)


def grade_once(grader, row: dict, answer: str) -> Verdict:
    """Grade and close the grader in one event loop (the client's connections belong to it)."""

    async def go():
        try:
            return await grader.grade(row, answer)
        finally:
            await grader.aclose()

    return run(go())


def label_with(root: Path, grader, task: str) -> dict:
    async def go():
        try:
            return await label_run(root, task=task, grader=grader)
        finally:
            await grader.aclose()

    return run(go())


# ====================================================================================== parsing


@pytest.mark.parametrize(
    "text,expected",
    [
        ("CORRECT", "CORRECT"),
        ("correct.", "CORRECT"),
        ("Grade: **Incorrect**", "INCORRECT"),
        ("INCORRECT - the answer names another city", "INCORRECT"),
        ("  unverifiable\n", "UNVERIFIABLE"),
        ('{"grade": "INCORRECT"}', "INCORRECT"),
        ("The answer is correct because ...\nINCORRECT", "CORRECT"),  # earliest keyword wins
        ("CORRECT, INCORRECT or UNVERIFIABLE", None),  # echoed option list
        ("Sure! Let me think.\nCORRECT", "CORRECT"),
        ("The answer is right", None),
        ("", None),
        (None, None),
        ("INCORRECTLY stated", None),  # whole words only
    ],
)
def test_parse_choice_correctness(text, expected):
    assert parse_choice(text, jp.CORRECTNESS_CHOICES) == expected


def test_parse_choice_abstention_and_entity():
    assert parse_choice("ABSTAINED", jp.ABSTENTION_CHOICES) == "ABSTAINED"
    assert parse_choice("Decision: answered", jp.ABSTENTION_CHOICES) == "ANSWERED"
    assert parse_choice("The response is EXISTS.", jp.ENTITY_CHOICES) == "EXISTS"
    assert parse_choice("unknown", jp.ENTITY_CHOICES) == "UNKNOWN"
    assert parse_choice("EXISTS or UNKNOWN", jp.ENTITY_CHOICES) is None


def test_parse_longwiki_claims_decide():
    text = (
        "CLAIM: Gutenberg built a press in Mainz => SUPPORTED\n"
        "CLAIM: He did it around 1440 => supported\n"
        "CLAIM: He was born in Paris => CONTRADICTED\n"
        "VERDICT: FAITHFUL\n"
    )  # disagrees with the claims: claims win
    parsed = parse_longwiki(text)
    assert parsed["decision"] == "HALLUCINATED"
    assert (parsed["claims"], parsed["supported"], parsed["contradicted"]) == (3, 2, 1)
    assert parsed["verdict_line"] == "FAITHFUL"


def test_parse_longwiki_all_supported_unsupported_and_no_claims():
    ok = parse_longwiki("1. CLAIM: Chlorophyll absorbs red light => SUPPORTED\nVERDICT: FAITHFUL")
    assert ok["decision"] == "FAITHFUL" and ok["claims"] == 1
    bad = parse_longwiki("CLAIM 1: It is green => UNSUPPORTED\nCLAIM 2: x => SUPPORTED")
    assert bad["decision"] == "HALLUCINATED" and bad["unsupported"] == 1
    # an echo of the format line holds every keyword: skipped, not counted
    echo = parse_longwiki(
        "CLAIM: <the claim> => SUPPORTED | CONTRADICTED | UNSUPPORTED\nVERDICT: NO_CLAIMS"
    )
    assert echo["decision"] == "NO_CLAIMS" and echo["claims"] == 0
    assert parse_longwiki("VERDICT: no claims")["decision"] == "NO_CLAIMS"
    assert parse_longwiki("VERDICT: FAITHFUL") is None  # no claims to back it
    assert parse_longwiki("I think the answer is fine.") is None
    assert parse_longwiki("") is None


@pytest.mark.parametrize(
    "text,expected",
    [
        ("I don't know.", True),
        ("I\u2019m not sure, but it might be Paris.", True),
        ("Sorry, I cannot answer that question.", True),
        ("I could not find any information about Zorvanex.", True),
        ("", True),
        ("Paris is the capital of France.", False),
        ("Nobody knows for sure; it is Paris.", False),
        ("The band 'I Don't Knowsters' formed in 1990.", False),
    ],
)
def test_detect_abstention(text, expected):
    assert detect_abstention(text) is expected


def test_prompts_render_and_name_their_keywords():
    text = jp.render(jp.CORRECTNESS_PROMPT, question="Q?", reference=None, response="  A  ")
    assert "(none)" in text and "Answer to grade:\nA\n" in text
    for template, choices in [
        (jp.ABSTENTION_PROMPT, jp.ABSTENTION_CHOICES),
        (jp.CORRECTNESS_PROMPT, jp.CORRECTNESS_CHOICES),
        (jp.LONGWIKI_CLAIMS_PROMPT, jp.CLAIM_CHOICES + jp.LONGWIKI_VERDICT_CHOICES),
        (jp.ENTITY_PROMPT, jp.ENTITY_CHOICES),
    ]:
        for choice in choices:
            assert choice in template


# ================================================================================ alias grader

TRIVIA_ROW = {
    "prompt_id": "t1",
    "dataset": "triviaqa",
    "prompt": "Capital of France?",
    "reference": {"value": "Paris", "aliases": ["Paris", "Paris, France"]},
    "meta": {"question": "Capital of France?"},
}


def test_alias_grader():
    g = AliasGrader()
    v = run(g.grade(TRIVIA_ROW, "It is Paris."))
    assert v == Verdict(0, "alias_match", "correct", False)
    v = run(g.grade(TRIVIA_ROW, "Lyon"))
    assert (v.label, v.verdict, v.abstained) == (1, "incorrect", False)
    v = run(g.grade(TRIVIA_ROW, "I don't know."))
    assert (v.label, v.verdict, v.abstained) == (1, "incorrect", True)
    v = run(g.grade(TRIVIA_ROW, "I'm not sure, maybe Paris?"))  # label follows the alias rule
    assert (v.label, v.abstained) == (0, True)
    v = run(g.grade({"prompt_id": "t2", "reference": None}, "Paris"))
    assert (v.label, v.verdict) == (None, "no_reference")


def test_grader_for():
    assert isinstance(grader_for("triviaqa", judge_url=None), AliasGrader)
    for task in ("precisewikiqa", "longwiki", "mixedentities"):
        with pytest.raises(HallulogError, match="--judge-url"):
            grader_for(task, judge_url=None, judge_model=None)
    g = grader_for("longwiki", judge_url="http://127.0.0.1:1/v1/", judge_model="m")
    assert isinstance(g, JudgeGrader) and g.judge_url == "http://127.0.0.1:1"
    run(g.aclose())
    with pytest.raises(ValueError, match="no grader"):
        grader_for("squad", judge_url=None)


# ================================================================================ label_run


def _write_jsonl(path: Path, rows: list[dict], torn: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)


def _trivia_artifacts(root: Path) -> None:
    answers = {"a": "Paris", "b": "Lyon", "c": "I don't know", "d": "Berlin"}
    for wid, pids in enumerate([["a", "b"], ["c", "d"]]):
        prompts, gens = [], []
        for pid in pids:
            prompts.append({**TRIVIA_ROW, "prompt_id": pid, "worker_id": wid})
            gens.append({"prompt_id": pid, "sample_id": 0, "text": answers[pid]})
            gens.append({"prompt_id": pid, "sample_id": 1, "text": "Paris"})
        if wid == 1:  # "d" has no primary generation (its group never committed)
            gens = [g for g in gens if g["prompt_id"] != "d"]
        _write_jsonl(root / f"worker_{wid}" / "prompt_index.jsonl", prompts)
        _write_jsonl(
            root / f"worker_{wid}" / "generations.jsonl",
            gens,
            torn='{"prompt_id": "x", "samp' if wid == 1 else "",
        )


def test_label_run_skips_answers_whose_reasoning_never_closed(tmp_path):
    """A ``no_answer`` primary (reasoning cut by --max-tokens) is never sent to a grader."""
    prompts = [
        {**TRIVIA_ROW, "prompt_id": "a", "worker_id": 0},
        {**TRIVIA_ROW, "prompt_id": "b", "worker_id": 0, "label_status": "no_answer"},
    ]
    gens = [
        {"prompt_id": "a", "sample_id": 0, "text": "Paris"},
        {"prompt_id": "b", "sample_id": 0, "text": "", "label_status": "no_answer"},
    ]
    _write_jsonl(tmp_path / "worker_0" / "prompt_index.jsonl", prompts)
    _write_jsonl(tmp_path / "worker_0" / "generations.jsonl", gens)
    counts = run(label_run(tmp_path, task="triviaqa", judge_url=None, judge_model=None))
    assert counts["graded_now"] == 1 and counts["no_answer"] == 1
    rows = (tmp_path / "labels.jsonl").read_text().splitlines()
    assert [json.loads(r)["prompt_id"] for r in rows] == ["a"]
    assert label_counts(tmp_path)["no_answer"] == 1


def test_label_run_alias_resumable(tmp_path):
    _trivia_artifacts(tmp_path)
    counts = run(label_run(tmp_path, task="triviaqa", judge_url=None, judge_model=None))
    assert counts["graded_now"] == 3 and counts["missing_primary"] == 1
    assert (counts["correct"], counts["hallucinated"], counts["abstained"]) == (1, 2, 1)
    rows = [json.loads(line) for line in (tmp_path / "labels.jsonl").read_text().splitlines()]
    assert sorted(r["prompt_id"] for r in rows) == ["a", "b", "c"]
    for r in rows:
        assert set(r) >= {
            "prompt_id",
            "label",
            "label_grader",
            "verdict",
            "abstained",
            "judge_model",
            "judge_raw",
            "graded_at",
        }
        assert r["label_grader"] == "alias_match" and r["judge_model"] is None

    again = run(label_run(tmp_path, task="triviaqa", judge_url=None, judge_model=None))
    assert again["graded_now"] == 0 and again["total"] == 3

    # a torn last line (crash mid-append) is cut off and its prompt graded again
    labels = (tmp_path / "labels.jsonl").read_text().splitlines()
    (tmp_path / "labels.jsonl").write_text("\n".join(labels[:1]) + "\n" + labels[1][:20])
    third = run(label_run(tmp_path, task="triviaqa", judge_url=None, judge_model=None))
    assert third["graded_now"] == 2 and third["total"] == 3
    text = (tmp_path / "labels.jsonl").read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 3
    assert set(load_labels(tmp_path)) == {"a", "b", "c"}


def test_label_run_judge_task_needs_url(tmp_path):
    row = {
        "prompt_id": "m1",
        "dataset": "mixedentities",
        "prompt": "Describe Zorvanex.",
        "reference": {"name": "Zorvanex", "type": "medicine", "exists": False},
    }
    _write_jsonl(tmp_path / "worker_0" / "prompt_index.jsonl", [row])
    _write_jsonl(
        tmp_path / "worker_0" / "generations.jsonl",
        [{"prompt_id": "m1", "sample_id": 0, "text": "It is a pill."}],
    )
    with pytest.raises(HallulogError, match="--judge-url"):
        run(label_run(tmp_path, task=None, judge_url=None, judge_model=None))
    assert not (tmp_path / "labels.jsonl").exists() or (tmp_path / "labels.jsonl").read_text() == ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_label_run_judge_down_writes_nothing(tmp_path):
    row = {
        "prompt_id": "m1",
        "dataset": "mixedentities",
        "prompt": "Describe Zorvanex.",
        "reference": {"name": "Zorvanex", "type": "medicine", "exists": False},
    }
    _write_jsonl(tmp_path / "worker_0" / "prompt_index.jsonl", [row])
    _write_jsonl(
        tmp_path / "worker_0" / "generations.jsonl",
        [{"prompt_id": "m1", "sample_id": 0, "text": "It is a pill."}],
    )
    grader = JudgeGrader(
        "mixedentities",
        judge_url=f"http://127.0.0.1:{_free_port()}",
        judge_model="m",
        attempts=2,
        backoff=0.01,
        timeout=5,
    )
    counts = label_with(tmp_path, grader, "mixedentities")
    assert counts["errors"] == 1 and counts["graded_now"] == 0 and counts["total"] == 0
    assert "unreachable" in counts["first_error"]


def test_apply_label():
    row = {"prompt_id": "a", "label": None, "label_grader": None}
    out = apply_label(
        row,
        {
            "prompt_id": "a",
            "label": 1,
            "label_grader": "llm_judge",
            "verdict": "incorrect",
            "abstained": False,
            "judge_model": "m",
            "judge_raw": "[correctness] INCORRECT",
        },
    )
    assert (out["label"], out["label_grader"], out["judge_verdict"]) == (
        1,
        "llm_judge",
        "[correctness] INCORRECT",
    )
    assert row["label"] is None
    assert apply_label(row, None)["judge_verdict"] is None


# ================================================================== answer kinds after the run


def test_alias_grader_other_kinds():
    g = AliasGrader()
    choice = {
        "prompt_id": "c1",
        "dataset": "mmlu",
        "reference": {"kind": "choice", "value": "B", "choices": ["cat", "dog"], "answer_index": 1},
    }
    assert run(g.grade(choice, "B.")) == Verdict(0, "choice_match", "correct", False)
    assert run(g.grade(choice, "No idea.")) == Verdict(1, "choice_match", "unparsed", False)
    numeric = {
        "prompt_id": "n1",
        "dataset": "gsm8k",
        "reference": {"kind": "numeric", "value": "18", "number": 18.0, "tolerance": 0},
    }
    assert run(g.grade(numeric, "So #### 18")) == Verdict(0, "numeric_match", "correct", False)
    squad = {
        "prompt_id": "s1",
        "dataset": "squad",
        "reference": {"kind": "aliases", "value": None, "aliases": [], "unanswerable": True},
    }
    assert run(g.grade(squad, "I don't know.")) == Verdict(0, "alias_match", "abstained", True)
    assert run(g.grade(squad, "Paris")) == Verdict(1, "alias_match", "incorrect", False)
    judged = {"prompt_id": "j1", "reference": {"kind": "judge", "value": "Paris"}}
    assert run(g.grade(judged, "Paris")).verdict == "no_reference"
    # an old reference with a value and no aliases: the value is the alias (as before)
    assert run(g.grade({"prompt_id": "v", "reference": {"value": "Paris"}}, "paris")).label == 0


def test_needs_judge_and_judge_grader():
    assert needs_judge("precisewikiqa") and not needs_judge("triviaqa")
    assert needs_judge_for(None, "longwiki") and not needs_judge_for(None, "nq_open")
    assert needs_judge_for("judge", "nq_open") and needs_judge_for("judge", "triviaqa")
    assert not needs_judge_for("choice", "precisewikiqa")
    with pytest.raises(HallulogError, match="--judge-url"):
        judge_grader(None, task="nq_open")
    g = grader_for("nq_open", judge_url="http://127.0.0.1:1", answer_kind="judge")
    assert isinstance(g, JudgeGrader) and (g.task, g.style) == ("nq_open", "precisewikiqa")
    run(g.aclose())
    for kind in ("aliases", "choice", "numeric"):
        assert isinstance(grader_for("mmlu", judge_url=None, answer_kind=kind), AliasGrader)
    g = grader_for("longwiki", judge_url="http://127.0.0.1:1", answer_kind="judge")
    assert g.style == "longwiki"  # the built-in task keeps its rules
    run(g.aclose())
    with pytest.raises(ValueError, match="no grader"):
        grader_for("nq_open", judge_url=None)


def test_accepted_answers():
    assert accepted_answers({"value": "Paris"}) == "Paris"
    assert (
        accepted_answers({"value": "Paris", "aliases": ["Paris", "City of Light", " "]})
        == "Paris (also accepted: City of Light)"
    )
    assert accepted_answers({"value": None, "aliases": ["a", "b"]}) == "a (also accepted: b)"
    assert accepted_answers({"value": None}) is None


class _ScriptedJudge(JudgeGrader):
    """A JudgeGrader whose judge replies from a script (no server); records the prompts."""

    def __init__(self, replies: list[str], **kw) -> None:
        super().__init__(
            kw.pop("task", "nq_open"),
            judge_url="http://127.0.0.1:1",
            judge_model="m",
            style="precisewikiqa",
            **kw,
        )
        self.replies, self.prompts = list(replies), []

    async def ask(self, prompt: str, max_tokens: int) -> str:
        self.prompts.append(prompt)
        return self.replies.pop(0)


def test_generic_judge_lists_accepted_answers():
    row = {
        "prompt_id": "q1",
        "dataset": "nq_open",
        "prompt": "Capital of France?",
        "reference": {"kind": "judge", "value": "Paris", "aliases": ["Paris", "Paris, FR"]},
        "meta": {"question": "Capital of France?"},
    }
    g = _ScriptedJudge(["ANSWERED", "CORRECT"])
    v = grade_once(g, row, "Paris")
    assert (v.label, v.verdict, v.details["task"]) == (0, "correct", "nq_open")
    assert "Paris (also accepted: Paris, FR)" in g.prompts[1]


@pytest.mark.parametrize(
    "replies,label,verdict", [(["ABSTAINED"], 0, "abstained"), (["ANSWERED"], 1, "incorrect")]
)
def test_generic_judge_unanswerable(replies, label, verdict):
    row = {
        "prompt_id": "q2",
        "prompt": "Who?",
        "reference": {"kind": "judge", "value": None, "unanswerable": True},
    }
    v = grade_once(_ScriptedJudge(replies), row, "Someone")
    assert (v.label, v.verdict) == (label, verdict)


def test_label_counts_and_summary_count_unparsed(tmp_path):
    rows = [
        {"prompt_id": "a", "label": 0, "label_status": "correct"},
        {"prompt_id": "b", "label": 1, "label_status": "unparsed"},
        {"prompt_id": "c", "label": 1, "label_status": "incorrect"},
        {"prompt_id": "d", "label": None},  # an older row: no status
        {"prompt_id": "e", "label": 1, "label_status": "unparsed"},
    ]
    _write_jsonl(tmp_path / "worker_0" / "prompt_index.jsonl", rows)
    _write_jsonl(
        tmp_path / "labels.jsonl",  # labels.jsonl wins
        [
            {"prompt_id": "e", "label": 0, "verdict": "correct"},
            {"prompt_id": "d", "label": 1, "verdict": "unparsed"},
        ],
    )
    counts = label_counts(tmp_path)
    assert counts == {"correct": 2, "hallucinated": 3, "unlabeled": 0, "unparsed": 2}
    from hallulog.cli.commands import format_result
    from hallulog.orchestrator.run import RunResult

    result = RunResult(artifact_root=tmp_path, total=5, done_before=0)
    result.labels = counts
    assert "3 hallucinated / 0 unlabeled (60% hallucinated); 2 unparsed" in format_result(result)
    result.labels = {**counts, "unparsed": 0}
    assert "unparsed" not in format_result(result)


def test_label_run_picks_the_grader_by_reference_kind(tmp_path):
    rows = [
        {
            "prompt_id": "c1",
            "dataset": "mmlu",
            "reference": {
                "kind": "choice",
                "value": "B",
                "choices": ["cat", "dog"],
                "answer_index": 1,
            },
        },
        {
            "prompt_id": "n1",
            "dataset": "gsm8k",
            "reference": {"kind": "numeric", "value": "3", "number": 3, "tolerance": 0},
        },
    ]
    _write_jsonl(tmp_path / "worker_0" / "prompt_index.jsonl", rows)
    _write_jsonl(
        tmp_path / "worker_0" / "generations.jsonl",
        [
            {"prompt_id": "c1", "sample_id": 0, "text": "Maybe a bird"},
            {"prompt_id": "n1", "sample_id": 0, "text": "It is 3."},
        ],
    )
    counts = run(label_run(tmp_path, task=None, judge_url=None, judge_model=None))
    assert (counts["graded_now"], counts["correct"], counts["unparsed"]) == (2, 1, 1)
    labels = load_labels(tmp_path)
    assert (labels["c1"]["label_grader"], labels["c1"]["verdict"]) == ("choice_match", "unparsed")
    assert (labels["n1"]["label_grader"], labels["n1"]["label"]) == ("numeric_match", 0)


# ================================================================== real judge (embedded server)
# A 135M judge is weak: these tests check the plumbing (request sent, raw reply kept, label in
# {0, 1, None}, verdict consistent with the label), never the judge's wisdom. Marked e2e (they
# start the real embedded server); deselect with -m "not e2e".


@pytest.fixture(scope="module")
def judge_server():
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hallulog.serving",
            "--model",
            "default",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"embedded server exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("embedded server did not become healthy in 600 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


PWQA_ROW = {
    "prompt_id": "w1",
    "dataset": "precisewikiqa",
    "prompt": "For which event was the Eiffel Tower built?",
    "reference": {
        "value": "the 1889 World's Fair",
        "aliases": ["the 1889 World's Fair"],
        "document": "The Eiffel Tower was built for the 1889 World's Fair.",
    },
    "meta": {"question": "For which event was the Eiffel Tower built?"},
}
ENTITY_ROW = {
    "prompt_id": "m1",
    "dataset": "mixedentities",
    "prompt": "Tell me what you know about the medicine Zorvanex.",
    "reference": {"value": None, "name": "Zorvanex", "type": "medicine", "exists": False},
    "meta": {"question": "Tell me what you know about the medicine Zorvanex."},
}


def _check_plumbing(v: Verdict, task: str) -> None:
    assert v.grader == "llm_judge"
    assert v.label in (0, 1, None)
    assert isinstance(v.raw, str) and v.raw.startswith("[")  # the raw reply is kept
    if v.label is None:
        assert v.verdict in {"unparseable", "unverifiable", "abstained", "no_claims"}
    if v.verdict == "unparseable":
        assert v.label is None
    assert v.details["task"] == task


@pytest.mark.e2e
def test_judge_precisewikiqa_real_server(judge_server):
    g = JudgeGrader("precisewikiqa", judge_url=judge_server, judge_model=None)
    v = grade_once(g, PWQA_ROW, "It was built for the 1889 World's Fair in Paris.")
    assert g.judge_model == "smollm2-135m-instruct"  # asked from /v1/models
    assert g.requests_sent in (1, 2)  # 2nd step only after "ANSWERED"
    _check_plumbing(v, "precisewikiqa")
    assert v.raw.startswith("[abstention] ")


@pytest.mark.e2e
def test_judge_longwiki_real_server(judge_server):
    row = {**PWQA_ROW, "prompt_id": "l1", "dataset": "longwiki"}
    g = JudgeGrader(
        "longwiki",
        judge_url=judge_server,
        judge_model="smollm2-135m-instruct",
        short_max_tokens=4,
        claims_max_tokens=24,
    )
    v = grade_once(g, row, "The Eiffel Tower was built for the 1889 World's Fair.")
    _check_plumbing(v, "longwiki")


@pytest.mark.e2e
def test_judge_rejected_request_is_recorded(judge_server, tmp_path):
    _write_jsonl(tmp_path / "worker_0" / "prompt_index.jsonl", [ENTITY_ROW])
    _write_jsonl(
        tmp_path / "worker_0" / "generations.jsonl",
        [{"prompt_id": "m1", "sample_id": 0, "text": "Zorvanex treats headaches."}],
    )
    grader = JudgeGrader("mixedentities", judge_url=judge_server, judge_model="no-such-model")
    counts = label_with(tmp_path, grader, "mixedentities")
    row = load_labels(tmp_path)["m1"]
    assert counts["graded_now"] == 1 and row["verdict"] == "judge_rejected"
    assert row["label"] is None and "404" in row["judge_raw"]


@pytest.mark.e2e
def test_label_run_mixedentities_real_server(judge_server, tmp_path):
    _write_jsonl(tmp_path / "worker_0" / "prompt_index.jsonl", [ENTITY_ROW])
    _write_jsonl(
        tmp_path / "worker_0" / "generations.jsonl",
        [
            {
                "prompt_id": "m1",
                "sample_id": 0,
                "text": "Zorvanex is a prescription drug used to treat migraines.",
            },
            {"prompt_id": "m1", "sample_id": 1, "text": "I don't know it."},
        ],
    )
    counts = run(
        label_run(
            tmp_path, task="mixedentities", judge_url=judge_server, judge_model=None, concurrency=2
        )
    )
    assert counts["graded_now"] == 1 and counts["total"] == 1 and counts["errors"] == 0
    row = load_labels(tmp_path)["m1"]
    assert row["label_grader"] == "llm_judge"
    assert row["judge_model"] == "smollm2-135m-instruct"
    assert row["judge_raw"].startswith("[entity] ")
    assert row["label"] in (0, 1, None)
    assert row["verdict"] in {"fake_entity_treated_as_real", "abstained", "unparseable"}
    assert (row["label"] == 0) == (row["verdict"] == "abstained")
    again = run(label_run(tmp_path, task="mixedentities", judge_url=judge_server, judge_model=None))
    assert again["graded_now"] == 0 and again["total"] == 1
