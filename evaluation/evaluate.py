"""``evaluate(root)``: score every detector of seed 003 from a run's ``consolidated/``."""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path

import numpy as np

from .data import EvaluationInputError, Run
from .features import EMBEDDING_METHODS, TEXT_METHODS, collect
from .probes import PROBES, run_probes
from .protocol import make_split, summarize

__all__ = ["FAMILIES", "ALL_METHODS", "resolve_methods", "evaluate"]

log = logging.getLogger(__name__)

ALL_METHODS = {**TEXT_METHODS, **{p.name: p.family for p in PROBES.values()}}
FAMILIES = sorted(set(ALL_METHODS.values()))

_ROW_HINT = {
    "last": "a response row",
    "tbg": "the last prompt row (sequence_mode response or all, or --positions tbg)",
    "slt": "the second-last response row (sequence_mode response or all, or --positions slt)",
    "exact": "the exact-answer rows (sequence_mode response or all, or --positions "
             "exact_answer)",
}


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
                f"methods {sorted(ALL_METHODS)}")
    return list(dict.fromkeys(out)), True


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _start_embeddings(run: Run, wanted: list[str], embeddings: bool, unavailable, skipped):
    """The child process of the embedding methods, or None (then they are skipped)."""
    emb = [m for m in wanted if m in EMBEDDING_METHODS]
    if not emb:
        return None
    if not embeddings:
        for m in emb:
            skipped.setdefault(m, "embedding methods disabled (--no-embeddings)")
        return None
    from .embeddings import EmbeddingUnavailable, check_available

    try:
        check_available()
    except EmbeddingUnavailable as exc:
        for m in emb:
            unavailable(m, str(exc))
        return None
    from .background import EmbeddingJob

    return EmbeddingJob(run.root, emb)


def _join_embeddings(run, job, feats, scores, wanted, unavailable, timings) -> None:
    """Merge the child's scores into ``scores`` (same prompts, same order)."""
    out = job.result()
    emb = [m for m in wanted if m in EMBEDDING_METHODS]
    if isinstance(out, str):
        for m in emb:
            unavailable(m, out)
            wanted.remove(m)
        return
    ids, emb_scores, emb_timings = out
    if ids != feats.prompt_ids:
        raise EvaluationInputError(f"{run.exports}: the exports changed during the evaluation; "
                                   "run evaluate again")
    scores.update(emb_scores)
    timings.update(emb_timings)


def evaluate(root: Path | str, *, methods: list[str] | None = None, seed: int = 0,
             folds: int = 5, n_boot: int = 1000, embeddings: bool = True) -> dict:
    """Run the methods, return the report dict (``report.write_report`` writes it).

    The embedding methods run in a child process (background.py) while this one streams the
    other text methods and fits the label probes; the SEP probes, whose target is the
    embedding-clustered semantic entropy, come after it.
    """
    t_start = time.monotonic()
    run = Run(root)
    wanted, explicit = resolve_methods(methods)
    skipped: dict[str, str] = {}

    def unavailable(method: str, reason: str) -> None:
        if explicit:
            raise EvaluationInputError(f"{method}: {reason}")
        skipped[method] = reason

    for m in list(wanted):
        fam = ALL_METHODS[m]
        export = {"logprob": "logprob", "selfcheck": "selfcheck",
                  "semantic_entropy": "semantic_entropy", "sep": "semantic_entropy",
                  "semantic_energy": "semantic_energy"}.get(fam, "geometry")
        if not run.has_export(export):
            unavailable(m, f"{run.export_path(export)} is missing; re-export with "
                           f"`python -m orchestrator run --artifact-root {run.root} "
                           "--consolidate-only`")
            wanted.remove(m)
    job = _start_embeddings(run, wanted, embeddings, unavailable, skipped)
    if job is None:
        wanted = [m for m in wanted if m not in EMBEDDING_METHODS]
    try:
        return _evaluate(run, wanted, job, skipped, unavailable, seed, folds, n_boot, t_start)
    finally:
        if job is not None:
            job.cancel()


def _evaluate(run, wanted, job, skipped, unavailable, seed, folds, n_boot, t_start) -> dict:
    timings: dict[str, float] = {}
    t = time.monotonic()
    feats = collect(run, set(wanted) - EMBEDDING_METHODS)
    timings["text_methods_s"] = time.monotonic() - t
    labels, scores, rows = feats.arrays()
    n1, n0 = int((labels == 1).sum()), int((labels == 0).sum())
    if n1 == 0 or n0 == 0:
        raise EvaluationInputError(
            f"{run.consolidated}: {n0} correct / {n1} hallucinated labelled prompts; AUROC needs "
            "both classes: run more prompts (--limit) or grade them (docs/labels.md)")
    if "semantic_energy_exact" in wanted and feats.logit_sources == {"logprobs_only"}:
        for m in [m for m in wanted if m.startswith("semantic_energy")]:
            unavailable(m, "the run holds no raw logits (logit_source logprobs_only); use the "
                           "embedded backend or vLLM with --logprobs-mode raw_logits")
            wanted.remove(m)
            scores.pop(m, None)
    split = make_split(feats.prompt_ids, labels, seed=seed, k=folds)
    test = split.test_mask()
    probe_names = [m for m in wanted if m in PROBES]
    if probe_names:
        probe_names = _check_probe_inputs(run, feats, rows, probe_names, unavailable)
    probe_out: dict[str, dict] = {}
    reader = store_idx = None
    if probe_names:
        from storage import open_store

        reader = open_store(run.consolidated)
        store_idx = np.array([_index(reader, k) for k in feats.activation_keys], np.int64)
    rest = probe_names
    t = time.monotonic()
    if job is not None:  # label probes while the child embeds; the SEP target needs its SE
        first = [p for p in probe_names if PROBES[p].target == "label"]
        if first:
            probe_out.update(run_probes(reader, store_idx, rows, labels, None, split, first))
        rest = [p for p in probe_names if p not in first]
        timings["probes_s"] = time.monotonic() - t
        t = time.monotonic()
        _join_embeddings(run, job, feats, scores, wanted, unavailable, timings)
        timings["embeddings_wait_s"] = time.monotonic() - t
        t = time.monotonic()
    if rest:
        se = scores.get("se_discrete_embedding", scores.get("se_discrete_exact"))
        if se is None:
            for p in [p for p in rest if PROBES[p].target == "se"]:
                unavailable(p, "the SEP target needs semantic entropy: add semantic_entropy "
                               "to --methods")
                rest.remove(p)
        probe_out.update(run_probes(reader, store_idx, rows, labels, se, split, rest))
    if probe_names:
        timings["probes_s"] = timings.get("probes_s", 0.0) + time.monotonic() - t
    if reader is not None:
        reader.close()
    t = time.monotonic()
    results: dict[str, dict] = {}
    per_layer: dict[str, dict] = {}
    roc_scores: dict[str, np.ndarray] = {}
    for m in wanted:
        if m in scores:
            results[m] = {"family": ALL_METHODS[m], "kind": "unsupervised",
                          **summarize(labels[test], scores[m][test], n_boot=n_boot, seed=seed)}
            roc_scores[m] = scores[m]
        elif m in probe_out:
            r = probe_out[m]
            per_layer[m] = {"layer_ids": r["layer_ids"], "auroc": r["per_layer_auroc"],
                            "selected_layers": r["selected_layers"]}
            results[m] = {"family": PROBES[m].family, "kind": "probe",
                          "selected_layers": r["selected_layers"],
                          **summarize(labels[test], r["scores"][test], n_boot=n_boot, seed=seed)}
            roc_scores[m] = r["scores"]
    timings["bootstrap_s"] = time.monotonic() - t
    timings["total_s"] = time.monotonic() - t_start
    manifest = run.manifest()
    report = {
        "schema_version": 1,
        "artifact_root": str(run.root),
        "run": {k: manifest.get(k) for k in ("run_id", "model", "dataset", "split", "k_samples",
                                             "logging_profile", "sequence_mode", "storage_format")},
        "labels": {"correct": n0, "hallucinated": n1, "unlabeled": feats.unlabeled},
        "protocol": {"seed": seed, "scheme": "holdout" if split.holdout else f"{split.k}-fold",
                     "test_prompts": int(test.sum()), "bootstrap": n_boot,
                     "score_orientation": "higher = more likely hallucinated"},
        "methods": results,
        "per_layer": per_layer,
        "skipped": skipped,
        "timings_s": timings,
        "peak_rss_mib": max(_peak_rss_mib(), job.peak_rss_mib if job is not None else 0.0),
    }
    report["_curves"] = {"labels": labels[test], "scores": {m: v[test] for m, v in roc_scores.items()}}
    return report


def _index(reader, key: str | None) -> int:
    if not key:
        return -1
    try:
        return reader.index_of(key)
    except KeyError:
        return -1


def _check_probe_inputs(run: Run, feats, rows, probe_names, unavailable) -> list[str]:
    if not run.has_activations():
        for p in probe_names:
            unavailable(p, f"{run.consolidated}/activations holds no activation store; rerun "
                           "with a logging profile that stores activations")
        return []
    keep = []
    modes = ",".join(sorted(feats.sequence_modes)) or "unknown"
    for p in probe_names:
        r = rows[PROBES[p].row]
        cover = float((r >= 0).mean()) if len(r) else 0.0
        if cover < 0.5:
            unavailable(p, f"needs {_ROW_HINT[PROBES[p].row]} for most prompts, but the run "
                           f"stored sequence_mode={modes} ({cover:.0%} have it); rerun with "
                           "--logging-profile integrated or probes")
            continue
        keep.append(p)
    return keep
