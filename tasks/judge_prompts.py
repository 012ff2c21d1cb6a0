"""The LLM-judge prompts of hallulog's graders (written for this project, in the spirit of
HalluLens: a constrained answer format whose keyword a parser can find without guessing).

Every prompt ends by asking for one keyword from a fixed set (or, for longwiki, one keyword per
claim line plus a final ``VERDICT:`` line). The templates are data (``data/judge_prompts/*.txt``,
``{field}`` placeholders); the keywords are module constants so that the parser
(:mod:`hallulog.tasks.judge_parsing`) and the prompts cannot drift apart (a test checks each
template names its keywords). Outline and rules:
docs/labels.md.
"""

from __future__ import annotations

from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent / "data" / "judge_prompts"


def _load(name: str) -> str:
    """The prompt template ``data/judge_prompts/{name}.txt`` (trailing newline dropped)."""
    return (PROMPTS_DIR / f"{name}.txt").read_text(encoding="utf-8").removesuffix("\n")


__all__ = [
    "ABSTAINED",
    "ANSWERED",
    "ABSTENTION_CHOICES",
    "ABSTENTION_PROMPT",
    "CORRECT",
    "INCORRECT",
    "UNVERIFIABLE",
    "CORRECTNESS_CHOICES",
    "CORRECTNESS_PROMPT",
    "SUPPORTED",
    "CONTRADICTED",
    "UNSUPPORTED",
    "CLAIM_CHOICES",
    "FAITHFUL",
    "HALLUCINATED",
    "NO_CLAIMS",
    "LONGWIKI_VERDICT_CHOICES",
    "LONGWIKI_CLAIMS_PROMPT",
    "EXISTS",
    "UNKNOWN",
    "ENTITY_CHOICES",
    "ENTITY_PROMPT",
    "render",
]

# ------------------------------------------------------------------ step 1: abstention check
ABSTAINED = "ABSTAINED"
ANSWERED = "ANSWERED"
ABSTENTION_CHOICES = (ABSTAINED, ANSWERED)

ABSTENTION_PROMPT = _load("abstention")

# ---------------------------------------------------------- step 2 (precisewikiqa): correctness
CORRECT = "CORRECT"
INCORRECT = "INCORRECT"
UNVERIFIABLE = "UNVERIFIABLE"
CORRECTNESS_CHOICES = (CORRECT, INCORRECT, UNVERIFIABLE)

CORRECTNESS_PROMPT = _load("correctness")

# ---------------------------------------------------------- step 2 (longwiki): claim checking
SUPPORTED = "SUPPORTED"
CONTRADICTED = "CONTRADICTED"
UNSUPPORTED = "UNSUPPORTED"
CLAIM_CHOICES = (SUPPORTED, CONTRADICTED, UNSUPPORTED)

FAITHFUL = "FAITHFUL"
HALLUCINATED = "HALLUCINATED"
NO_CLAIMS = "NO_CLAIMS"
LONGWIKI_VERDICT_CHOICES = (FAITHFUL, HALLUCINATED, NO_CLAIMS)

LONGWIKI_CLAIMS_PROMPT = _load("longwiki_claims")

# --------------------------------------------------------------------------- mixedentities
EXISTS = "EXISTS"
UNKNOWN = "UNKNOWN"
ENTITY_CHOICES = (EXISTS, UNKNOWN)

ENTITY_PROMPT = _load("entity")


def render(template: str, **fields: str) -> str:
    """Fill ``template``; every value is stripped (a missing text becomes ``(none)``)."""
    clean = {
        k: (str(v).strip() if v is not None and str(v).strip() else "(none)")
        for k, v in fields.items()
    }
    return template.format(**clean)
