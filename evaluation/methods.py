"""Every method ``evaluate`` knows: its family, the export it reads, and the ones one pass
cannot score.

Four kinds, each with its own registry: the text methods (features.py: exports only), the
per-layer probes (probes.py), the hidden methods (hidden_methods.py: the store read otherwise,
e.g. EigenScore, the ICR probe) and the separate text passes (text_similarity.py). ``--methods``
takes a family or a method name from the union.
"""

from __future__ import annotations

from hallulog.evaluation.data import EvaluationInputError
from hallulog.evaluation.features import FAMILY_EXPORT, TEXT_METHODS
from hallulog.evaluation.hidden_methods import hidden_methods
from hallulog.evaluation.probes import PROBES

__all__ = [
    "ALL_METHODS",
    "FAMILIES",
    "HIDDEN_METHODS",
    "NOT_SCORED",
    "export_of",
    "resolve_methods",
]

HIDDEN_METHODS = hidden_methods()
ALL_METHODS = {
    **TEXT_METHODS,
    **{p.name: p.family for p in PROBES.values()},
    **{m.name: m.family for m in HIDDEN_METHODS.values()},
}
FAMILIES = sorted(set(ALL_METHODS.values()))

#: methods of LM-Polygraph's and TruthTorchLM's lists that one pass cannot score offline
NOT_SCORED = {
    "se_nli / num_sem_sets_nli / eigval_laplacian_nli / degmat_nli / eccentricity_nli": (
        "need an NLI model (DeBERTa-large-MNLI) that is not shipped for offline use; the "
        "exact-match, Jaccard and sentence-embedding variants are scored instead"
    ),
    "kernel_language_entropy / luq / semantic_density": (
        "need NLI entailment probabilities between the samples (no offline NLI model)"
    ),
    "ccp (NLI)": "needs an NLI model to compare token alternatives; ccp_lexical compares them by "
    "text",
    "token_sar / sentence_sar": "need a cross-encoder relevance model (no offline copy)",
    "p_true / verbalized_confidence / pmi / cond_pmi": (
        "need further model passes (a judgement prompt, or the answer without the question) "
        "that one pass does not store"
    ),
    "focus": (
        "propagates attention over every key of the answer; the stored attention summaries "
        "(--attention-features) keep five numbers per token and head, not the weights"
    ),
}


def export_of(method: str) -> str:
    """The export a method reads (the probes and hidden methods: the geometry export)."""
    fam = ALL_METHODS[method]
    return {**FAMILY_EXPORT, "sep": "semantic_entropy"}.get(fam, "geometry")


def resolve_methods(names: list[str] | None) -> tuple[list[str], bool]:
    """Method names from ``--methods`` (families or single methods); (methods, explicit)."""
    if not names or names == ["all"]:
        return list(ALL_METHODS), False
    out: list[str] = []
    for n in names:
        if n in ALL_METHODS:
            out.append(n)
        elif n in FAMILIES:
            out.extend(m for m, f in ALL_METHODS.items() if f == n)
        else:
            raise EvaluationInputError(
                f"--methods: unknown method {n!r}; choose from the families {FAMILIES} or the "
                f"methods {sorted(ALL_METHODS)}"
            )
    return list(dict.fromkeys(out)), True
