"""One streaming pass over the exports → compact per-prompt scores and probe row positions.

The five exports are read in lockstep, ``chunk`` prompts at a time (the embedding model
encodes a chunk's texts in one call); per prompt only the label, one float per text method and
four row indices are kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from hallulog.evaluation import baselines, energy, sample_methods, selfcheck
from hallulog.evaluation import semantic_entropy as se_mod
from hallulog.evaluation.data import Run, iter_joined

__all__ = [
    "TEXT_METHODS",
    "EMBEDDING_METHODS",
    "FAMILY_EXPORT",
    "SEPARATE_PASS",
    "Features",
    "collect",
    "probe_rows",
]

log = logging.getLogger(__name__)

TEXT_METHODS = {
    **{m: "logprob" for m in baselines.LOGPROB_METHODS},
    "selfcheck_unigram": "selfcheck",
    "selfcheck_unigram_max": "selfcheck",
    "selfcheck_embedding": "selfcheck",
    "se_discrete_exact": "semantic_entropy",
    "se_weighted_exact": "semantic_entropy",
    "se_discrete_embedding": "semantic_entropy",
    "se_weighted_embedding": "semantic_entropy",
    "semantic_energy_exact": "semantic_energy",
    "semantic_energy_embedding": "semantic_energy",
    "mean_token_entropy": "token_entropy",
    "max_token_entropy": "token_entropy",
    "ccp_lexical": "ccp",
    "mc_sequence_entropy": "mc_entropy",
    "mc_normalized_sequence_entropy": "mc_entropy",
    "lexsim_rouge1": "lexical_similarity",
    "lexsim_rouge2": "lexical_similarity",
    "lexsim_rougeL": "lexical_similarity",
    "num_sem_sets_exact": "graph",
    "num_sem_sets_embedding": "graph",
    **{
        f"{g}_{sim}": "graph"
        for g in ("eigval_laplacian", "degmat", "eccentricity")
        for sim in ("jaccard", "embedding")
    },
    "probability_margin": "probability_margin",
    "exact_match_rate": "consistency",
    "consistency_confidence_embedding": "consistency",
    "monte_carlo_probability": "mc_entropy",
    "txtsim_tfidf": "text_similarity",
    "txtsim_embedding": "text_similarity",
}
EMBEDDING_METHODS = {
    "selfcheck_embedding",
    "se_discrete_embedding",
    "se_weighted_embedding",
    "semantic_energy_embedding",
    "num_sem_sets_embedding",
    "eigval_laplacian_embedding",
    "degmat_embedding",
    "eccentricity_embedding",
    "consistency_confidence_embedding",
    "txtsim_embedding",
}
#: the export each text family reads
FAMILY_EXPORT = {
    "logprob": "logprob",
    "token_entropy": "logprob",
    "ccp": "logprob",
    "selfcheck": "selfcheck",
    "semantic_entropy": "semantic_entropy",
    "mc_entropy": "semantic_entropy",
    "lexical_similarity": "semantic_entropy",
    "graph": "semantic_entropy",
    "semantic_energy": "semantic_energy",
    "probability_margin": "logprob",
    "consistency": "semantic_entropy",
    "text_similarity": "selfcheck",
}
#: text methods computed by a pass of their own (text_similarity.py), not per prompt here
SEPARATE_PASS = {"txtsim_tfidf"}
ROW_KINDS = ("last", "tbg", "slt", "exact")


@dataclass
class Features:
    prompt_ids: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    scores: dict[str, list[float]] = field(default_factory=dict)
    activation_keys: list[str | None] = field(default_factory=list)
    rows: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in ROW_KINDS})
    sequence_modes: set[str] = field(default_factory=set)
    unlabeled: int = 0
    no_answer: int = 0
    """Of the unlabeled, primaries whose reasoning never closed (exports' ``no_answer``)."""
    logit_sources: set[str] = field(default_factory=set)
    named_positions: bool = False  # the run names its rows (--positions): rows are not contiguous

    def arrays(self):
        return (
            np.asarray(self.labels, np.int64),
            {m: np.asarray(v, np.float64) for m, v in self.scores.items()},
            {k: np.asarray(v, np.int64) for k, v in self.rows.items()},
        )


def _rows(geo: dict | None, tokens: list[str] | None) -> dict[str, int]:
    """Stored row of each probe kind for one primary answer (-1: not stored).

    A run with ``--positions`` names its rows (the geometry export's ``positions``): ``tbg``,
    ``slt``, ``last`` and the last row of ``exact_answer`` (the exact answer's last token, as
    LLMs-Know-More probes it) are read by name. Otherwise, and for kinds the run did not name,
    the row is found by its absolute position (docs/alignment.md).
    """
    out = dict.fromkeys(ROW_KINDS, -1)
    if not geo or not geo.get("activation_key"):
        return out
    n, row0 = int(geo.get("num_rows") or 0), int(geo.get("row0_position") or 0)
    at = geo.get("token_positions")
    row_at = {pos: j for j, pos in enumerate(at if at is not None else range(row0, row0 + n))}
    answer = geo.get("answer_token_positions") or []
    p = int(geo["prompt_end_position"]) + 1 if geo.get("prompt_end_position") is not None else None
    named = geo.get("positions")

    def row_of(pos):
        return row_at.get(pos, -1) if pos is not None else -1

    if n:
        out["last"] = n - 1
    if p is not None:
        out["tbg"] = row_of(p - 1)
        if len(answer) >= 2:  # the answer's positions (a reasoning model's start past it)
            out["slt"] = row_of(answer[-2])
        if answer and (named is None or "exact_answer" not in named):
            e = baselines.exact_answer_index(tokens or [])
            if e is not None:
                out["exact"] = row_of(answer[0] + e)
    if named is not None:
        if at and p is not None and "last" not in named:  # last captured: P+R-2 or P+R-1
            out["last"] = n - 1 if at[-1] >= (answer[-1] - 1 if answer else p - 2) else -1
        for kind, name in (
            ("tbg", "tbg"),
            ("slt", "slt"),
            ("last", "last"),
            ("exact", "exact_answer"),
        ):
            if name in named:
                out[kind] = named[name][-1] if named[name] else -1
    return out


#: the stored row of each probe kind for one primary answer (public name of ``_rows``)
probe_rows = _rows


def _input_text(selfcheck_row: dict | None) -> str:
    """What the model was asked: the rendered prompt (question, and the context passage when the
    run shows it), else the question."""
    row = selfcheck_row or {}
    return row.get("prompt") or row.get("question") or ""


def collect(run: Run, methods: set[str], embedder=None, chunk: int = 256) -> Features:
    """Scores of every text method in ``methods`` and probe rows, for each labelled prompt."""
    feats = Features(
        scores={m: [] for m in methods if m in TEXT_METHODS and m not in SEPARATE_PASS}
    )
    names = ["logprob", "selfcheck", "semantic_entropy", "semantic_energy", "geometry"]
    buf: list[dict] = []
    for rows in iter_joined(run, names):
        lab = rows["logprob"].get("label")
        if lab not in (0, 1):
            feats.unlabeled += 1
            feats.no_answer += bool(rows["logprob"].get("no_answer"))
            continue
        buf.append(rows)
        if len(buf) >= chunk:
            _process(buf, feats, methods, embedder)
            buf = []
    if buf:
        _process(buf, feats, methods, embedder)
    return feats


def _process(buf: list[dict], feats: Features, methods: set[str], embedder) -> None:
    want = set(feats.scores)
    embs = prompt_embs = None
    if embedder is not None and want & EMBEDDING_METHODS:
        texts = []
        for rows in buf:
            sc = rows.get("selfcheck") or {}
            texts.append((sc.get("primary") or {}).get("text", ""))
            texts.extend(s.get("text", "") for s in sc.get("samples") or [])
        if "txtsim_embedding" in want:
            texts.extend(_input_text(rows.get("selfcheck")) for rows in buf)
        flat = embedder.encode(texts)
        embs, k = [], 0
        for rows in buf:
            m = 1 + len((rows.get("selfcheck") or {}).get("samples") or [])
            embs.append(flat[k : k + m])
            k += m
        if "txtsim_embedding" in want:
            prompt_embs = flat[k:]
    for j, rows in enumerate(buf):
        lp = rows["logprob"]
        feats.prompt_ids.append(lp["prompt_id"])
        feats.labels.append(int(lp["label"]))
        geo = rows.get("geometry")
        feats.activation_keys.append(geo.get("activation_key") if geo else None)
        if geo and geo.get("sequence_mode"):
            feats.sequence_modes.add(geo["sequence_mode"])
        if geo and geo.get("positions") is not None:
            feats.named_positions = True
        for k, v in _rows(geo, lp.get("tokens")).items():
            feats.rows[k].append(v)
        s: dict[str, float] = {}
        s.update(baselines.logprob_scores(lp.get("token_logprobs")))
        if want & {"mean_token_entropy", "max_token_entropy", "ccp_lexical"}:
            s["mean_token_entropy"], s["max_token_entropy"] = sample_methods.token_entropies(
                lp.get("top_logprobs")
            )
            s["ccp_lexical"] = sample_methods.ccp_lexical(lp.get("tokens"), lp.get("top_logprobs"))
        if "probability_margin" in want:
            s["probability_margin"] = sample_methods.probability_margin(lp.get("top_logprobs"))
        sc = rows.get("selfcheck")
        if sc:
            prim = (sc.get("primary") or {}).get("text", "")
            samples = [x.get("text", "") for x in sc.get("samples") or []]
            s["selfcheck_unigram"], s["selfcheck_unigram_max"] = selfcheck.unigram_scores(
                prim, samples
            )
            s["exact_match_rate"] = sample_methods.exact_match_rate(prim, samples)
            if embs is not None:
                s["selfcheck_embedding"] = selfcheck.embedding_score(embs[j][0], embs[j][1:])
            if prompt_embs is not None and prim.strip():
                s["txtsim_embedding"] = float(1.0 - prompt_embs[j] @ embs[j][0])
        se_row = rows.get("semantic_entropy")
        if se_row:
            samples = se_row.get("samples") or []
            texts = [x.get("text", "") for x in samples]
            mlp = [x.get("mean_logprob") for x in samples]
            ex = se_mod.cluster_exact(texts)
            s["se_discrete_exact"] = se_mod.discrete_entropy(ex)
            s["se_weighted_exact"] = se_mod.weighted_entropy(ex, mlp)
            s["num_sem_sets_exact"] = float(len(set(ex))) if ex else float("nan")
            s["mc_sequence_entropy"], s["mc_normalized_sequence_entropy"] = (
                sample_methods.mc_entropies(samples)
            )
            prim_mlp = (se_row.get("primary") or {}).get("mean_logprob")
            s["monte_carlo_probability"] = sample_methods.monte_carlo_probability([prim_mlp, *mlp])
            if embs is not None and len(embs[j]) > 1:
                s["consistency_confidence_embedding"] = sample_methods.consistency_confidence(
                    embs[j][0], embs[j][1:], prim_mlp
                )
            if want & {"lexsim_rouge1", "lexsim_rouge2", "lexsim_rougeL"}:
                for metric in ("rouge1", "rouge2", "rougeL"):
                    s[f"lexsim_{metric}"] = sample_methods.lexical_similarity(texts, metric)
            if texts and want & {
                "eigval_laplacian_jaccard",
                "degmat_jaccard",
                "eccentricity_jaccard",
            }:
                (s["eigval_laplacian_jaccard"], s["degmat_jaccard"], s["eccentricity_jaccard"]) = (
                    sample_methods.graph_scores(sample_methods.jaccard_matrix(texts))
                )
            if embs is not None:
                emb_ids = se_mod.cluster_embedding(embs[j][1:])
                s["se_discrete_embedding"] = se_mod.discrete_entropy(emb_ids)
                s["se_weighted_embedding"] = se_mod.weighted_entropy(emb_ids, mlp)
                s["num_sem_sets_embedding"] = float(len(set(emb_ids))) if emb_ids else float("nan")
                if len(embs[j]) > 1:
                    (
                        s["eigval_laplacian_embedding"],
                        s["degmat_embedding"],
                        s["eccentricity_embedding"],
                    ) = sample_methods.graph_scores(sample_methods.cosine_matrix(embs[j][1:]))
        en = rows.get("semantic_energy")
        if en:
            feats.logit_sources.add(en.get("logit_source"))
            gens = en.get("samples") or []
            energies = [energy.answer_energy(g.get("token_logits")) for g in gens]
            texts = [g.get("text", "") for g in gens]
            s["semantic_energy_exact"] = energy.semantic_energy(
                se_mod.cluster_exact(texts), energies
            )
            if embs is not None and len(embs[j]) == len(gens):
                s["semantic_energy_embedding"] = energy.semantic_energy(
                    se_mod.cluster_embedding(embs[j]), energies
                )
        for m in want:
            feats.scores[m].append(s.get(m, float("nan")))
