"""Grading the HalluLens tasks with an LLM judge: abstention → correctness (precisewikiqa),
abstention → claims (longwiki), entity existence (mixedentities). The precisewikiqa rules also
grade any task whose references are of the ``judge`` kind (``style="precisewikiqa"``).
Rules: docs/labels.md."""

from __future__ import annotations

from typing import Any

from hallulog.contracts.answer_match import CORRECT, HALLUCINATED
from hallulog.tasks import judge_prompts as jp
from hallulog.tasks.judge_client import JudgeClient, JudgeError, clip
from hallulog.tasks.judge_parsing import parse_choice, parse_longwiki
from hallulog.tasks.verdict import JUDGE_GRADER, JUDGE_TASKS, Verdict, question_of, reference_of

__all__ = ["JudgeGrader", "JudgeError", "accepted_answers"]


def accepted_answers(ref: dict[str, Any]) -> str | None:
    """The reference answer the correctness prompt shows: ``value`` (else the first alias),
    followed by the other accepted answers (``aliases``, de-duplicated) when there are any:
    ``"Paris (also accepted: Paris, France; City of Light)"``; None when there is none."""
    answers: list[str] = []
    aliases = ref.get("aliases")
    for a in [ref.get("value"), *(aliases if isinstance(aliases, (list, tuple)) else [])]:
        text = str(a).strip() if a is not None else ""
        if text and text not in answers:
            answers.append(text)
    if not answers:
        return None
    if len(answers) == 1:
        return answers[0]
    return f"{answers[0]} (also accepted: {'; '.join(answers[1:])})"


class JudgeGrader:
    """The HalluLens tasks' rules (precisewikiqa, longwiki, mixedentities) over a
    :class:`JudgeClient` (temperature 0, short outputs); prompts in ``data/judge_prompts/``.

    ``style`` picks the rules (default: the task's own); ``task`` is then only recorded in
    ``Verdict.details`` — e.g. ``JudgeGrader("nq_open", style="precisewikiqa", ...)`` grades a
    ``judge``-kind task like precisewikiqa."""

    name = JUDGE_GRADER

    def __init__(
        self,
        task: str,
        *,
        judge_url: str,
        judge_model: str | None = None,
        style: str | None = None,
        timeout: float = 120.0,
        attempts: int = 3,
        backoff: float = 1.0,
        short_max_tokens: int = 16,
        claims_max_tokens: int = 512,
        max_reference_chars: int = 8000,
        max_answer_chars: int = 6000,
        seed: int = 0,
    ) -> None:
        style = style or task
        if style not in JUDGE_TASKS:
            raise ValueError(
                f"JudgeGrader has no rules for task {style!r}; "
                f"choose one of {', '.join(JUDGE_TASKS)}"
            )
        self.task = task
        self.style = style
        self.short_max_tokens = short_max_tokens
        self.claims_max_tokens = claims_max_tokens
        self.max_reference_chars = max_reference_chars
        self.max_answer_chars = max_answer_chars
        self.client = JudgeClient(
            judge_url,
            judge_model=judge_model,
            timeout=timeout,
            attempts=attempts,
            backoff=backoff,
            seed=seed,
        )

    @property
    def judge_model(self) -> str | None:
        """The judge's model name (known once asked, or given)."""
        return self.client.judge_model

    @property
    def judge_url(self) -> str:
        return self.client.judge_url

    @property
    def requests_sent(self) -> int:
        return self.client.requests_sent

    async def aclose(self) -> None:
        await self.client.aclose()

    async def ask(self, prompt: str, max_tokens: int) -> str:
        return await self.client.ask(prompt, max_tokens)

    async def grade(self, prompt_row: dict, answer: str) -> Verdict:
        """Grade ``answer`` by this task's rules; raises :class:`JudgeError` when the judge
        cannot be asked (transport); an unusable judge reply is a Verdict ``unparseable``."""
        if self.style == "precisewikiqa":
            return await self._grade_precisewikiqa(prompt_row, answer)
        if self.style == "longwiki":
            return await self._grade_longwiki(prompt_row, answer)
        return await self._grade_mixedentities(prompt_row, answer)

    async def _abstention_step(self, row: dict, answer: str, raws: list[str]) -> str | None:
        text = await self.ask(
            jp.render(
                jp.ABSTENTION_PROMPT,
                question=question_of(row),
                response=clip(answer, self.max_answer_chars),
            ),
            self.short_max_tokens,
        )
        raws.append(f"[abstention] {text}")
        return parse_choice(text, jp.ABSTENTION_CHOICES)

    def _verdict(
        self, label: int | None, verdict: str, abstained: bool, raws: list[str], **details: Any
    ) -> Verdict:
        return Verdict(
            label,
            self.name,
            verdict,
            abstained,
            "\n".join(raws) if raws else None,
            {"task": self.task, **details} if details or raws else None,
        )

    async def _abstention_gate(self, row: dict, answer: str, raws: list[str]) -> Verdict | None:
        """Step 1 of precisewikiqa and longwiki: the verdict when the answer is empty, declined
        or the judge's reply unparseable; None when the answer goes on to step 2."""
        if not answer or not answer.strip():
            return self._verdict(None, "abstained", True, raws, reason="empty answer")
        step1 = await self._abstention_step(row, answer, raws)
        if step1 is None:
            return self._verdict(None, "unparseable", False, raws, step="abstention")
        if step1 == jp.ABSTAINED:
            return self._verdict(None, "abstained", True, raws)
        return None

    async def _grade_precisewikiqa(self, row: dict, answer: str) -> Verdict:
        raws: list[str] = []
        ref = reference_of(row)
        gold = accepted_answers(ref)
        declined = await self._abstention_gate(row, answer, raws)
        if ref.get("unanswerable") and not gold:  # no answer exists: declining is correct
            if declined is None:
                return self._verdict(HALLUCINATED, "incorrect", False, raws, unanswerable=True)
            if declined.verdict == "abstained":
                return self._verdict(CORRECT, "abstained", True, raws, unanswerable=True)
        if declined is not None:
            return declined
        if not gold:
            return self._verdict(None, "no_reference", False, raws)
        text = await self.ask(
            jp.render(
                jp.CORRECTNESS_PROMPT,
                question=question_of(row),
                reference=clip(gold, self.max_reference_chars),
                response=clip(answer, self.max_answer_chars),
            ),
            self.short_max_tokens,
        )
        raws.append(f"[correctness] {text}")
        choice = parse_choice(text, jp.CORRECTNESS_CHOICES)
        if choice is None:
            return self._verdict(None, "unparseable", False, raws, step="correctness")
        label = {jp.CORRECT: CORRECT, jp.INCORRECT: HALLUCINATED, jp.UNVERIFIABLE: None}[choice]
        return self._verdict(label, choice.lower(), False, raws)

    async def _grade_longwiki(self, row: dict, answer: str) -> Verdict:
        raws: list[str] = []
        ref = reference_of(row)
        document = ref.get("document") or ref.get("value")
        declined = await self._abstention_gate(row, answer, raws)
        if declined is not None:
            return declined
        if not document:
            return self._verdict(None, "no_reference", False, raws)
        text = await self.ask(
            jp.render(
                jp.LONGWIKI_CLAIMS_PROMPT,
                question=question_of(row),
                reference=clip(document, self.max_reference_chars),
                response=clip(answer, self.max_answer_chars),
            ),
            self.claims_max_tokens,
        )
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
        ref, meta = reference_of(row), (row.get("meta") or {})
        name = ref.get("name") or meta.get("entity_name")
        etype = ref.get("type") or meta.get("entity_type") or "entity"
        exists = bool(ref.get("exists", meta.get("entity_exists", False)))
        if not name:
            return self._verdict(None, "no_reference", False, raws)
        if not answer or not answer.strip():
            return self._verdict(
                0 if not exists else None,
                "abstained",
                True,
                raws,
                entity_exists=exists,
                reason="empty answer",
            )
        text = await self.ask(
            jp.render(
                jp.ENTITY_PROMPT,
                name=name,
                entity_type=etype,
                question=question_of(row),
                response=clip(answer, self.max_answer_chars),
            ),
            self.short_max_tokens,
        )
        raws.append(f"[entity] {text}")
        choice = parse_choice(text, jp.ENTITY_CHOICES)
        if choice is None:
            return self._verdict(None, "unparseable", False, raws, entity_exists=exists)
        if exists:
            # Control item: a real entity. Recognising it is expected, declining is a false
            # refusal; neither says whether the description is true (no reference text) → None.
            if choice == jp.EXISTS:
                return self._verdict(
                    None, "real_entity_treated_as_real", False, raws, entity_exists=True
                )
            return self._verdict(None, "abstained", True, raws, entity_exists=True)
        if choice == jp.EXISTS:
            return self._verdict(
                HALLUCINATED, "fake_entity_treated_as_real", False, raws, entity_exists=False
            )
        return self._verdict(CORRECT, "abstained", True, raws, entity_exists=False)
