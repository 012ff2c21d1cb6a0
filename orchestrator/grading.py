"""Graders: one answer of one prompt → a :class:`Verdict` (label 0 correct / 1 hallucinated).

```python
from orchestrator.grading import grader_for, label_run
grader = grader_for("precisewikiqa", judge_url="http://127.0.0.1:8000", judge_model=None)
verdict = await grader.grade(prompt_row, answer_text)     # prompt_row: a prompt_index.jsonl row
counts = await label_run(root, task="precisewikiqa", judge_url=url, judge_model=None)
```

* :class:`AliasGrader` (triviaqa): :func:`orchestrator.labels.alias_match_label` plus a phrase
  list that flags abstentions (the label still follows the alias rule).
* :class:`JudgeGrader` (precisewikiqa, longwiki, mixedentities): an LLM judge over the OpenAI
  HTTP API, prompts in :mod:`orchestrator.judge_prompts`.
* :func:`label_run`: grades the primary answer of every prompt of a run into
  ``{artifact_root}/labels.jsonl`` (append-only, fsynced, resumable).

Every rule (and the longwiki response-level label): docs/labels.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from orchestrator import judge_prompts as jp
from orchestrator.errors import ArtifactError, HallulogError
from orchestrator.labels import CORRECT, HALLUCINATED, alias_match_label

__all__ = [
    "Verdict", "Grader", "AliasGrader", "JudgeGrader", "JudgeError", "grader_for", "label_run",
    "parse_choice", "parse_longwiki", "detect_abstention", "ABSTENTION_PHRASES",
    "LABELS_FILE", "load_labels", "label_row", "apply_label", "JUDGE_TASKS", "ALIAS_GRADER",
    "JUDGE_GRADER",
]

log = logging.getLogger(__name__)

LABELS_FILE = "labels.jsonl"
ALIAS_GRADER = "alias_match"
JUDGE_GRADER = "llm_judge"
JUDGE_TASKS = ("precisewikiqa", "longwiki", "mixedentities")


@dataclass(frozen=True)
class Verdict:
    """The grade of one answer."""

    label: int | None
    """0 correct, 1 hallucinated, None could not be graded (see ``verdict``)."""
    grader: str
    """``alias_match`` or ``llm_judge``."""
    verdict: str
    """correct | incorrect | unverifiable | abstained | no_claims | real_entity_treated_as_real |
    fake_entity_treated_as_real | no_reference | unparseable | judge_rejected (docs/labels.md)."""
    abstained: bool
    raw: str | None = None
    """The judge's raw text (several steps: ``[step] text`` blocks); None for alias match."""
    details: dict[str, Any] | None = None
    """Grader-specific extras (longwiki claim counts, which steps ran)."""


class Grader(Protocol):
    name: str
    judge_model: str | None

    async def grade(self, prompt_row: dict, answer: str) -> Verdict: ...

    async def aclose(self) -> None: ...


# ================================================================================ abstention

# Phrases that mark an answer as an abstention (matched case-insensitively, as whole words, after
# curly apostrophes become straight ones and whitespace collapses). Kept short and specific: a
# phrase must signal "I decline / do not know", never appear inside an ordinary factual answer.
ABSTENTION_PHRASES: tuple[str, ...] = (
    "i don't know", "i do not know", "i dont know",
    "i'm not sure", "i am not sure", "i'm not certain", "i am not certain",
    "i cannot answer", "i can't answer", "i can not answer", "cannot answer that",
    "unable to answer", "i'm unable to", "i am unable to",
    "i don't have enough information", "i do not have enough information",
    "i don't have information", "i do not have information",
    "i don't have any information", "i do not have any information",
    "i couldn't find", "i could not find", "i can't find", "i cannot find",
    "i'm not aware of", "i am not aware of", "i have no information", "i have no knowledge",
    "no information available", "i'm not familiar with", "i am not familiar with",
    "i cannot provide", "i can't provide", "i don't have access to", "i do not have access to",
    "i can't verify", "i cannot verify",
)

_ABSTENTION_RE = re.compile(
    r"(?<![\w'])(?:" + "|".join(re.escape(p) for p in ABSTENTION_PHRASES) + r")(?![\w'])")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u00b4": "'", "`": "'"})


def detect_abstention(text: str | None) -> bool:
    """True when ``text`` contains one of :data:`ABSTENTION_PHRASES` (or is blank)."""
    if text is None or not text.strip():
        return True
    norm = " ".join(text.translate(_APOSTROPHES).lower().split())
    return _ABSTENTION_RE.search(norm) is not None


# ================================================================================== parsing

def _keyword_re(choices: Iterable[str]) -> re.Pattern[str]:
    # A keyword matches as a whole word, with "_" and spaces interchangeable (NO_CLAIMS, NO CLAIMS).
    alts = sorted({c.upper() for c in choices}, key=len, reverse=True)
    parts = [r"[\s_]+".join(map(re.escape, a.split("_"))) for a in alts]
    return re.compile(r"(?<![A-Za-z0-9])(" + "|".join(parts) + r")(?![A-Za-z0-9])", re.IGNORECASE)


def _canon(word: str) -> str:
    return re.sub(r"[\s_]+", "_", word.strip().upper())


def parse_choice(text: str | None, choices: Iterable[str]) -> str | None:
    """The keyword of a constrained judge answer, or None when there is none or it is ambiguous.

    Rule: the earliest whole-word, case-insensitive occurrence of any keyword in ``choices`` wins
    ("Grade: **correct**." → CORRECT; INCORRECT never matches CORRECT). Exception: when the first
    line holding a keyword holds two or more *different* keywords (the judge echoed the option
    list, "CORRECT, INCORRECT or UNVERIFIABLE"), the answer is ambiguous → None.
    """
    if not text:
        return None
    choices = tuple(choices)
    pattern = _keyword_re(choices)
    for line in text.splitlines():
        found = [_canon(m.group(1)) for m in pattern.finditer(line)]
        if not found:
            continue
        if len(set(found)) > 1:
            return None
        return found[0]
    return None


# "CLAIM: ...", "1. CLAIM 1: ...", "- **Claim**: ..." (list markers and numbering allowed)
_CLAIM_LINE = re.compile(r"^[\W\d]*claim\s*\d*\W*[:.)\-]", re.IGNORECASE)
_VERDICT_LINE = re.compile(r"^[\W\d]*verdict\b", re.IGNORECASE)


def parse_longwiki(text: str | None) -> dict[str, Any] | None:
    """Claim counts and the response-level decision of a longwiki judge answer.

    Lines starting with ``CLAIM`` count when they hold exactly one distinct keyword of
    SUPPORTED / CONTRADICTED / UNSUPPORTED (lines echoing the option list are skipped). The
    decision comes from the claims when there are any (any CONTRADICTED or UNSUPPORTED claim →
    HALLUCINATED, else FAITHFUL) — the claims define the label, a ``VERDICT:`` line that disagrees
    with them is overruled; with no countable claim the ``VERDICT:`` line decides (only NO_CLAIMS
    is accepted there without claims). Returns None when neither gives an answer.
    """
    if not text:
        return None
    counts = {jp.SUPPORTED: 0, jp.CONTRADICTED: 0, jp.UNSUPPORTED: 0}
    claim_re = _keyword_re(jp.CLAIM_CHOICES)
    verdict_line: str | None = None
    for line in text.splitlines():
        if _CLAIM_LINE.match(line):
            found = {_canon(m.group(1)) for m in claim_re.finditer(line)}
            if len(found) == 1:
                counts[found.pop()] += 1
        elif verdict_line is None and _VERDICT_LINE.match(line):
            verdict_line = parse_choice(line, jp.LONGWIKI_VERDICT_CHOICES)
    n = sum(counts.values())
    if n:
        bad = counts[jp.CONTRADICTED] + counts[jp.UNSUPPORTED]
        decision = jp.HALLUCINATED if bad else jp.FAITHFUL
    elif verdict_line == jp.NO_CLAIMS:
        decision = jp.NO_CLAIMS
    else:
        return None
    return {"decision": decision, "verdict_line": verdict_line, "claims": n,
            "supported": counts[jp.SUPPORTED], "contradicted": counts[jp.CONTRADICTED],
            "unsupported": counts[jp.UNSUPPORTED]}


# =================================================================================== graders

def _question(row: dict) -> str:
    meta = row.get("meta") or {}
    return str(meta.get("question") or row.get("prompt") or "")


def _reference(row: dict) -> dict[str, Any]:
    ref = row.get("reference")
    if isinstance(ref, dict):
        return ref
    if ref is None:
        value = row.get("reference_answer")
        return {"value": value} if value is not None else {}
    return {"value": ref}


class AliasGrader:
    """triviaqa: alias match (label) + abstention phrase list (flag only)."""

    name = ALIAS_GRADER
    judge_model: str | None = None

    async def grade(self, prompt_row: dict, answer: str) -> Verdict:
        ref = _reference(prompt_row)
        aliases = ref.get("aliases")
        if not aliases:
            aliases = [ref["value"]] if ref.get("value") else []
        abstained = detect_abstention(answer)
        if not aliases:
            return Verdict(None, self.name, "no_reference", abstained)
        label = alias_match_label(answer, [str(a) for a in aliases])
        return Verdict(label, self.name, "correct" if label == CORRECT else "incorrect",
                       abstained)

    async def aclose(self) -> None:
        return None


class JudgeError(HallulogError):
    """The judge could not be asked (retries exhausted, or it refused the request)."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def _clip(text: str | None, limit: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + " [...]"


class JudgeGrader:
    """An LLM judge over the OpenAI chat API (temperature 0, short outputs), one task's rules.

    ``judge_url`` is the server's base URL (with or without ``/v1``). ``judge_model`` None asks
    the server's ``/v1/models`` and uses the first model. The openai client's own retries are
    off; tenacity retries timeouts, connection errors, 429 and 5xx (``attempts`` tries, backoff
    ``backoff`` s doubling up to 4x) — the same policy as the worker's client.
    """

    name = JUDGE_GRADER

    def __init__(self, task: str, *, judge_url: str, judge_model: str | None = None,
                 timeout: float = 120.0, attempts: int = 3, backoff: float = 1.0,
                 short_max_tokens: int = 16, claims_max_tokens: int = 512,
                 max_reference_chars: int = 8000, max_answer_chars: int = 6000,
                 seed: int = 0) -> None:
        if task not in JUDGE_TASKS:
            raise ValueError(f"JudgeGrader has no rules for task {task!r}; "
                             f"choose one of {', '.join(JUDGE_TASKS)}")
        import openai

        base = judge_url.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        self.task = task
        self.judge_url = base
        self.judge_model = judge_model
        self.short_max_tokens = short_max_tokens
        self.claims_max_tokens = claims_max_tokens
        self.max_reference_chars = max_reference_chars
        self.max_answer_chars = max_answer_chars
        self.seed = seed
        self._attempts = attempts
        self._backoff = backoff
        self._client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="hallulog",
                                          max_retries=0, timeout=timeout)
        self._model_lock = asyncio.Lock()
        self.requests_sent = 0

    async def aclose(self) -> None:
        await self._client.close()

    # -------------------------------------------------------------------------- transport
    async def _retrying(self, call, *args, **kwargs):
        import openai
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

        from workers.client import is_retryable

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential(multiplier=self._backoff, min=self._backoff,
                                  max=4 * self._backoff),
            retry=retry_if_exception(is_retryable), reraise=True,
            before_sleep=lambda rs: log.warning("judge %s: retrying after %s (attempt %d)",
                                                self.judge_url, rs.outcome.exception(),
                                                rs.attempt_number))
        try:
            async for attempt in retrying:
                with attempt:
                    return await call(*args, **kwargs)
        except openai.APIStatusError as exc:
            raise JudgeError(f"judge {self.judge_url} answered HTTP {exc.status_code}: "
                             f"{_clip(str(exc), 500)}",
                             permanent=not is_retryable(exc)) from exc
        except openai.OpenAIError as exc:
            raise JudgeError(f"judge {self.judge_url} unreachable: {exc}", permanent=False) from exc

    async def model(self) -> str:
        """The judge model's name (asked once from ``/v1/models`` when not given)."""
        if self.judge_model:
            return self.judge_model
        async with self._model_lock:
            if not self.judge_model:
                page = await self._retrying(self._client.models.list)
                ids = [m.id for m in page.data]
                if not ids:
                    raise JudgeError(f"judge {self.judge_url}/v1/models lists no model; "
                                     "pass --judge-model", permanent=True)
                self.judge_model = ids[0]
        return self.judge_model

    async def ask(self, prompt: str, max_tokens: int) -> str:
        """One judge request (chat, temperature 0); returns the reply text."""
        model = await self.model()
        self.requests_sent += 1
        resp = await self._retrying(
            self._client.chat.completions.create, model=model,
            messages=[{"role": "user", "content": prompt}], temperature=0.0, top_p=1.0,
            max_tokens=max_tokens, seed=self.seed, n=1)
        return (resp.choices[0].message.content or "") if resp.choices else ""

    # ----------------------------------------------------------------------------- grading
    async def grade(self, prompt_row: dict, answer: str) -> Verdict:
        """Grade ``answer`` by this task's rules; raises :class:`JudgeError` when the judge
        cannot be asked (transport); an unusable judge reply is a Verdict ``unparseable``."""
        if self.task == "precisewikiqa":
            return await self._grade_precisewikiqa(prompt_row, answer)
        if self.task == "longwiki":
            return await self._grade_longwiki(prompt_row, answer)
        return await self._grade_mixedentities(prompt_row, answer)

    async def _abstention_step(self, row: dict, answer: str, raws: list[str]) -> str | None:
        text = await self.ask(jp.render(jp.ABSTENTION_PROMPT, question=_question(row),
                                        response=_clip(answer, self.max_answer_chars)),
                              self.short_max_tokens)
        raws.append(f"[abstention] {text}")
        return parse_choice(text, jp.ABSTENTION_CHOICES)

    def _verdict(self, label: int | None, verdict: str, abstained: bool, raws: list[str],
                 **details: Any) -> Verdict:
        return Verdict(label, self.name, verdict, abstained, "\n".join(raws) if raws else None,
                       {"task": self.task, **details} if details or raws else None)

    async def _grade_precisewikiqa(self, row: dict, answer: str) -> Verdict:
        raws: list[str] = []
        ref = _reference(row)
        gold = ref.get("value") or (ref.get("aliases") or [None])[0]
        if not answer or not answer.strip():
            return self._verdict(None, "abstained", True, raws, reason="empty answer")
        step1 = await self._abstention_step(row, answer, raws)
        if step1 is None:
            return self._verdict(None, "unparseable", False, raws, step="abstention")
        if step1 == jp.ABSTAINED:
            return self._verdict(None, "abstained", True, raws)
        if not gold:
            return self._verdict(None, "no_reference", False, raws)
        text = await self.ask(jp.render(jp.CORRECTNESS_PROMPT, question=_question(row),
                                        reference=gold,
                                        response=_clip(answer, self.max_answer_chars)),
                              self.short_max_tokens)
        raws.append(f"[correctness] {text}")
        choice = parse_choice(text, jp.CORRECTNESS_CHOICES)
        if choice is None:
            return self._verdict(None, "unparseable", False, raws, step="correctness")
        label = {jp.CORRECT: CORRECT, jp.INCORRECT: HALLUCINATED, jp.UNVERIFIABLE: None}[choice]
        return self._verdict(label, choice.lower(), False, raws)

    async def _grade_longwiki(self, row: dict, answer: str) -> Verdict:
        raws: list[str] = []
        ref = _reference(row)
        document = ref.get("document") or ref.get("value")
        if not answer or not answer.strip():
            return self._verdict(None, "abstained", True, raws, reason="empty answer")
        step1 = await self._abstention_step(row, answer, raws)
        if step1 is None:
            return self._verdict(None, "unparseable", False, raws, step="abstention")
        if step1 == jp.ABSTAINED:
            return self._verdict(None, "abstained", True, raws)
        if not document:
            return self._verdict(None, "no_reference", False, raws)
        text = await self.ask(jp.render(jp.LONGWIKI_CLAIMS_PROMPT, question=_question(row),
                                        reference=_clip(document, self.max_reference_chars),
                                        response=_clip(answer, self.max_answer_chars)),
                              self.claims_max_tokens)
        raws.append(f"[claims] {text}")
        parsed = parse_longwiki(text)
        if parsed is None:
            return self._verdict(None, "unparseable", False, raws, step="claims")
        decision = parsed.pop("decision")
        if decision == jp.NO_CLAIMS:
            return self._verdict(None, "no_claims", False, raws, **parsed)
        label = HALLUCINATED if decision == jp.HALLUCINATED else CORRECT
        return self._verdict(label, "incorrect" if label else "correct", False, raws, **parsed)

    async def _grade_mixedentities(self, row: dict, answer: str) -> Verdict:
        raws: list[str] = []
        ref, meta = _reference(row), (row.get("meta") or {})
        name = ref.get("name") or meta.get("entity_name")
        etype = ref.get("type") or meta.get("entity_type") or "entity"
        exists = bool(ref.get("exists", meta.get("entity_exists", False)))
        if not name:
            return self._verdict(None, "no_reference", False, raws)
        if not answer or not answer.strip():
            return self._verdict(0 if not exists else None, "abstained", True, raws,
                                 entity_exists=exists, reason="empty answer")
        text = await self.ask(jp.render(jp.ENTITY_PROMPT, name=name, entity_type=etype,
                                        question=_question(row),
                                        response=_clip(answer, self.max_answer_chars)),
                              self.short_max_tokens)
        raws.append(f"[entity] {text}")
        choice = parse_choice(text, jp.ENTITY_CHOICES)
        if choice is None:
            return self._verdict(None, "unparseable", False, raws, entity_exists=exists)
        if exists:
            # Control item: a real entity. Recognising it is expected, declining is a false
            # refusal; neither says whether the description is true (no reference text) → None.
            if choice == jp.EXISTS:
                return self._verdict(None, "real_entity_treated_as_real", False, raws,
                                     entity_exists=True)
            return self._verdict(None, "abstained", True, raws, entity_exists=True)
        if choice == jp.EXISTS:
            return self._verdict(HALLUCINATED, "fake_entity_treated_as_real", False, raws,
                                 entity_exists=False)
        return self._verdict(CORRECT, "abstained", True, raws, entity_exists=False)


def grader_for(task: str, *, judge_url: str | None, judge_model: str | None = None,
               **judge_options: Any) -> Grader:
    """The grader of ``task``: triviaqa → :class:`AliasGrader`, the HalluLens tasks →
    :class:`JudgeGrader` (which needs ``judge_url``)."""
    if task == "triviaqa":
        return AliasGrader()
    if task in JUDGE_TASKS:
        if not judge_url:
            raise HallulogError(f"task {task!r} is graded by an LLM judge: pass --judge-url "
                                "(the base URL of an OpenAI-compatible server, e.g. "
                                "http://127.0.0.1:8000) and optionally --judge-model")
        return JudgeGrader(task, judge_url=judge_url, judge_model=judge_model, **judge_options)
    raise ValueError(f"no grader for task {task!r}; choose one of triviaqa, "
                     f"{', '.join(JUDGE_TASKS)}")


# ================================================================================= label_run

def _read_jsonl(path: Path, *, tolerate_torn_tail: bool = True) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a torn last line (no trailing newline) is ignored, a malformed
    complete line is logged with file:line and skipped."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1 if tolerate_torn_tail else len(data)
    if complete < len(data) and data[complete:].strip():
        log.warning("%s: ignoring a torn last line (%d bytes)", path, len(data) - complete)
    rows = []
    for lineno, line in enumerate(data[:complete].split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            log.warning("%s:%d: malformed JSON line skipped (%s)", path, lineno, exc)
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            log.warning("%s:%d: not a JSON object, skipped", path, lineno)
    return rows


def load_labels(artifact_root: str | Path) -> dict[str, dict[str, Any]]:
    """``prompt_id → labels.jsonl row`` (the last row wins; torn tail ignored)."""
    out: dict[str, dict[str, Any]] = {}
    for row in _read_jsonl(Path(artifact_root) / LABELS_FILE):
        pid = row.get("prompt_id")
        if isinstance(pid, str):
            out[pid] = row
    return out


def _cut_torn_tail(path: Path) -> None:
    """Truncate ``path`` after its last newline so that the next append starts a fresh line."""
    if not path.exists():
        return
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        keep = data.rfind(b"\n") + 1
        if keep < size:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def label_row(prompt_id: str, verdict: Verdict, judge_model: str | None) -> dict[str, Any]:
    """The ``labels.jsonl`` line of one graded prompt."""
    return {"prompt_id": prompt_id, "label": verdict.label, "label_grader": verdict.grader,
            "verdict": verdict.verdict, "abstained": verdict.abstained,
            "judge_model": judge_model if verdict.grader == JUDGE_GRADER else None,
            "judge_raw": verdict.raw, "judge_details": verdict.details, "graded_at": _now()}


async def label_run(artifact_root: str | Path, *, task: str | None, judge_url: str | None = None,
                    judge_model: str | None = None, concurrency: int = 4,
                    grader: Grader | None = None,
                    max_consecutive_errors: int = 8) -> dict[str, Any]:
    """Grade the primary answer (sample_id 0) of every prompt of a run into ``labels.jsonl``.

    Reads every ``worker_*/prompt_index.jsonl`` and ``worker_*/generations.jsonl``; prompts
    already in ``{artifact_root}/labels.jsonl`` are skipped (resumable; a torn last line is cut
    off first). One line per prompt, appended and fsynced as soon as it is graded. ``task`` None
    grades every prompt by its own ``dataset``; a task given grades only that task's prompts.
    Transient judge failures (retries exhausted) are not written, so a later call retries them;
    a judge that rejects the request (4xx) gets a ``judge_rejected`` line.

    After ``max_consecutive_errors`` transient failures in a row (the judge is down) the
    remaining prompts are left for a later call and ``aborted`` is True.

    Returns counts over all of ``labels.jsonl`` afterwards: ``correct`` (label 0),
    ``hallucinated`` (1), ``ungraded`` (None), ``abstained`` (flag; overlaps the three), plus
    ``total``, ``graded_now``, ``errors`` (+ ``first_error``), ``missing_primary``,
    ``skipped_other_task``, ``aborted``. ``grader`` overrides the grader choice (tests, custom
    judges); it is not closed here.
    """
    root = Path(artifact_root)
    if not root.is_dir():
        raise ArtifactError(f"{root}: no such artifact directory")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    prompts: dict[str, dict[str, Any]] = {}
    primaries: dict[str, str] = {}
    for wdir in sorted(p for p in root.glob("worker_*") if p.is_dir()):
        for row in _read_jsonl(wdir / "prompt_index.jsonl"):
            pid = row.get("prompt_id")
            if isinstance(pid, str):
                prompts.setdefault(pid, row)
        for row in _read_jsonl(wdir / "generations.jsonl"):
            if row.get("sample_id") == 0 and isinstance(row.get("prompt_id"), str):
                primaries.setdefault(row["prompt_id"], row.get("text") or "")

    labels_path = root / LABELS_FILE
    _cut_torn_tail(labels_path)
    done = set(load_labels(root))
    counts: dict[str, Any] = {"graded_now": 0, "errors": 0, "missing_primary": 0,
                              "skipped_other_task": 0, "aborted": False}
    todo: list[tuple[str, dict[str, Any], str]] = []
    for pid, row in prompts.items():
        if pid in done:
            continue
        if task is not None and row.get("dataset") not in (None, task):
            counts["skipped_other_task"] += 1
            continue
        if pid not in primaries:
            counts["missing_primary"] += 1
            continue
        todo.append((pid, row, primaries[pid]))

    graders: dict[str, Grader] = {}

    def grader_of(row: dict[str, Any]) -> Grader:
        if grader is not None:
            return grader
        name = task or row.get("dataset")
        if not isinstance(name, str):
            raise ArtifactError(f"prompt {row.get('prompt_id')}: no dataset to pick a grader by; "
                                "pass task=")
        if name not in graders:
            graders[name] = grader_for(name, judge_url=judge_url, judge_model=judge_model)
        return graders[name]

    try:
        # fail fast (e.g. no --judge-url) before any file is opened or request sent
        for _pid, row, _answer in todo:
            grader_of(row)
    except Exception:
        await _close_all(graders.values())
        raise

    first_error: list[str] = []
    streak = [0]
    write_lock = asyncio.Lock()
    sem = asyncio.Semaphore(concurrency)

    async def one(fh, pid: str, row: dict[str, Any], answer: str) -> None:
        g = grader_of(row)
        async with sem:
            if streak[0] >= max_consecutive_errors:
                counts["aborted"] = True
                return
            try:
                verdict = await g.grade(row, answer)
                streak[0] = 0
            except JudgeError as exc:
                if not exc.permanent:
                    streak[0] += 1
                    counts["errors"] += 1
                    if not first_error:
                        first_error.append(str(exc))
                    log.warning("prompt %s not graded: %s", pid, exc)
                    return
                verdict = Verdict(None, JUDGE_GRADER, "judge_rejected", False, str(exc))
        line = json.dumps(label_row(pid, verdict, g.judge_model), ensure_ascii=False) + "\n"
        async with write_lock:
            await asyncio.to_thread(_append_fsync, fh, line)
            counts["graded_now"] += 1

    try:
        if todo:
            with open(labels_path, "a", encoding="utf-8") as fh:
                results = await asyncio.gather(
                    *(one(fh, pid, row, answer) for pid, row, answer in todo),
                    return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                raise failures[0]
    finally:
        await _close_all(graders.values())

    summary = {"correct": 0, "hallucinated": 0, "ungraded": 0, "abstained": 0}
    final = load_labels(root)
    for row in final.values():
        label = row.get("label")
        summary["correct" if label == CORRECT else "hallucinated" if label == HALLUCINATED
                else "ungraded"] += 1
        summary["abstained"] += bool(row.get("abstained"))
    summary["total"] = len(final)
    summary.update(counts)
    if first_error:
        summary["first_error"] = first_error[0]
    return summary


async def _close_all(graders: Iterable[Grader]) -> None:
    for g in list(graders):
        await g.aclose()


def _append_fsync(fh, line: str) -> None:
    fh.write(line)
    fh.flush()
    os.fsync(fh.fileno())


def apply_label(prompt_row: dict[str, Any], label: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of a prompt_index row with the label fields of its ``labels.jsonl`` row
    (``label``, ``label_grader``, ``judge_verdict`` = the judge's raw text, plus ``verdict``,
    ``abstained``, ``judge_model``) — what consolidation writes to consolidated/prompt_index."""
    out = dict(prompt_row)
    if label is None:
        out.setdefault("judge_verdict", None)
        return out
    out.update({"label": label.get("label"), "label_grader": label.get("label_grader"),
                "judge_verdict": label.get("judge_raw"), "verdict": label.get("verdict"),
                "abstained": label.get("abstained"), "judge_model": label.get("judge_model")})
    return out


