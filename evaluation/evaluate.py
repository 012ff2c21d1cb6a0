"""``evaluate(root)``: score every detector of seed 003 from a run's ``consolidated/``."""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path

import numpy as np
from hallulog.evaluation.data import EvaluationInputError, Run
from hallulog.evaluation.features import EMBEDDING_METHODS, collect
from hallulog.evaluation.hidden_methods import HiddenContext
from hallulog.evaluation.methods import (
    ALL_METHODS,
    FAMILIES,
    HIDDEN_METHODS,
    NOT_SCORED,
    export_of,
    resolve_methods,
)
from hallulog.evaluation.probes import PROBABILITY_PROBES, PROBES, run_probes
from hallulog.evaluation.protocol import Split, make_split
from hallulog.evaluation.scores import ScoreTable, grader_summary, rankings, summarize_scores

__all__ = ["FAMILIES", "ALL_METHODS", "resolve_methods", "evaluate"]

log = logging.getLogger(__name__)

_ROW_HINT = {
    "last": "a response row",
    "tbg": "the last prompt row (sequence_mode response or all, or --positions tbg)",
    "slt": "the second-last response row (sequence_mode response or all, or --positions slt)",
    "exact": "the exact-answer rows (sequence_mode response or all, or --positions exact_answer)",
}


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
    from hallulog.evaluation.embeddings import EmbeddingUnavailable, check_available

    try:
        check_available()
    except EmbeddingUnavailable as exc:
        for m in emb:
            unavailable(m, str(exc))
        return None
    from hallulog.evaluation.background import EmbeddingJob

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
        raise EvaluationInputError(
            f"{run.exports}: the exports changed during the evaluation; run evaluate again"
        )
    scores.update(emb_scores)
    timings.update(emb_timings)


def evaluate(
    root: Path | str,
    *,
    methods: list[str] | None = None,
    seed: int = 0,
    folds: int = 5,
    n_boot: int = 1000,
    embeddings: bool = True,
    train_root: Path | str | None = None,
) -> dict:
    """Run the methods, return the report dict (``report.write_report`` writes it).

    ``train_root``: fit the probes on that run's labelled prompts and score them on every
    labelled prompt of ``root`` (transfer; the unsupervised methods score ``root`` alone).

    The embedding methods run in a child process (background.py) while this one streams the
    other text methods and fits the label probes; the SEP probes, whose target is the
    embedding-clustered semantic entropy, come after it.
    """
    t_start = time.monotonic()
    run = Run(root)
    train = None
    if train_root is not None:
        from hallulog.evaluation.transfer import check_compatible

        train = Run(train_root)
        check_compatible(train, run)
    wanted, explicit = resolve_methods(methods)
    skipped: dict[str, str] = {} if explicit else dict(NOT_SCORED)

    def unavailable(method: str, reason: str) -> None:
        if explicit:
            raise EvaluationInputError(f"{method}: {reason}")
        skipped[method] = reason

    imported = bool(run.manifest().get("imported"))
    for m in list(wanted):
        export = export_of(m)
        if imported and (m in PROBES or m in HIDDEN_METHODS):
            unavailable(
                m,
                "an imported run (python -m orchestrator import) holds no "
                "activations; the hidden-state methods need a run of the orchestrator",
            )
            wanted.remove(m)
        elif not run.has_export(export):
            unavailable(
                m,
                f"{run.export_path(export)} is missing; re-export with "
                f"`python -m orchestrator run --artifact-root {run.root} "
                "--consolidate-only`",
            )
            wanted.remove(m)
    job = _start_embeddings(run, wanted, embeddings, unavailable, skipped)
    if job is None:
        wanted = [m for m in wanted if m not in EMBEDDING_METHODS]
    try:
        return _evaluate(
            run, wanted, job, skipped, unavailable, seed, folds, n_boot, t_start, train
        )
    finally:
        if job is not None:
            job.cancel()


def _evaluate(
    run, wanted, job, skipped, unavailable, seed, folds, n_boot, t_start, train=None
) -> dict:
    timings: dict[str, float] = {}
    t = time.monotonic()
    feats = collect(run, set(wanted) - EMBEDDING_METHODS)
    timings["text_methods_s"] = time.monotonic() - t
    labels, scores, rows = feats.arrays()
    n1, n0 = int((labels == 1).sum()), int((labels == 0).sum())
    if n1 == 0 or n0 == 0:
        raise EvaluationInputError(
            f"{run.consolidated}: {n0} correct / {n1} hallucinated labelled prompts; AUROC needs "
            "both classes: run more prompts (--limit) or grade them (docs/labels.md)"
        )
    if "semantic_energy_exact" in wanted and feats.logit_sources == {"logprobs_only"}:
        for m in [m for m in wanted if m.startswith("semantic_energy")]:
            unavailable(
                m,
                "the run holds no raw logits (logit_source logprobs_only); use the "
                "embedded backend or vLLM with --logprobs-mode raw_logits",
            )
            wanted.remove(m)
            scores.pop(m, None)
    if train is None:
        split = make_split(feats.prompt_ids, labels, seed=seed, k=folds)
    else:  # transfer: every labelled prompt of this run is a test prompt
        split = Split(fold=np.zeros(len(labels), np.int64), k=1, holdout=False, seed=seed)
    test = split.test_mask()
    probe_names = [m for m in wanted if m in PROBES]
    if probe_names:
        probe_names = _check_probe_inputs(run, feats, rows, probe_names, unavailable)
    probe_out: dict[str, dict] = {}
    reader = store_idx = None
    if probe_names:
        from hallulog.storage import open_store

        reader = open_store(run.consolidated)
        store_idx = np.array([_index(reader, k) for k in feats.activation_keys], np.int64)
    rest = probe_names
    t = time.monotonic()
    if train is not None:
        if job is not None:
            _join_embeddings(run, job, feats, scores, wanted, unavailable, timings)
            job = None
        if probe_names:
            from hallulog.evaluation.transfer import transfer_probes

            probe_out.update(
                transfer_probes(
                    train, reader, store_idx, rows, labels, probe_names, seed=seed, folds=folds
                )
            )
        rest = []
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
                unavailable(
                    p, "the SEP target needs semantic entropy: add semantic_entropy to --methods"
                )
                rest.remove(p)
        probe_out.update(run_probes(reader, store_idx, rows, labels, se, split, rest))
    if probe_names:
        timings["probes_s"] = timings.get("probes_s", 0.0) + time.monotonic() - t
    if reader is not None:
        reader.close()
    if "txtsim_tfidf" in wanted:
        t = time.monotonic()
        from hallulog.evaluation.text_similarity import tfidf_scores

        ids, scores["txtsim_tfidf"] = tfidf_scores(run)
        if ids != feats.prompt_ids:
            raise EvaluationInputError(
                f"{run.exports}: the exports changed during the evaluation; run evaluate again"
            )
        timings["text_similarity_s"] = time.monotonic() - t
    hidden_layers, hidden_out = _hidden(
        HiddenContext(run, feats, rows, labels, split, seed, folds, train),
        wanted,
        unavailable,
        timings,
    )
    scores.update(hidden_out)
    t = time.monotonic()
    per_layer: dict[str, dict] = {}
    columns: dict[str, np.ndarray] = {}
    for m in list(wanted):
        if m in scores and not np.isfinite(np.asarray(scores[m], np.float64)[test]).any():
            unavailable(
                m,
                "no prompt has the inputs it needs (token logprobs, top-k alternatives or samples)",
            )
            wanted.remove(m)
    for m in wanted:
        if m in scores:
            columns[m] = np.asarray(scores[m], np.float64)
        elif m in probe_out:
            r = probe_out[m]
            per_layer[m] = {
                "layer_ids": r["layer_ids"],
                "auroc": r["per_layer_auroc"],
                "selected_layers": r["selected_layers"],
            }
            columns[m] = r["scores"]
    from hallulog.evaluation.guards import collect_guards

    t_guards = time.monotonic()
    guards = collect_guards(run, list(feats.prompt_ids))
    timings["guards_s"] = time.monotonic() - t_guards
    probability = PROBABILITY_PROBES | {n for n, h in HIDDEN_METHODS.items() if h.probability}
    table = ScoreTable(
        prompt_ids=list(feats.prompt_ids),
        labels=labels,
        fold=split.fold,
        test=test,
        scores=columns,
        probability=[m for m in columns if m in probability],
        seed=seed,
        n_boot=n_boot,
        leaked=guards.leaked,
        graders=guards.graders,
        primary_grader=guards.primary_grader,
    )
    summary, comparison = summarize_scores(table)
    results: dict[str, dict] = {}
    for m, r in summary.items():
        kind = "probe" if m in probe_out else "unsupervised"
        if m in HIDDEN_METHODS:
            kind = HIDDEN_METHODS[m].kind
        results[m] = {"family": ALL_METHODS[m], "kind": kind, **r}
        if m in probe_out:
            results[m]["selected_layers"] = probe_out[m]["selected_layers"]
        if m in hidden_layers:
            results[m].update(hidden_layers[m])
    roc_scores = columns
    timings["bootstrap_s"] = time.monotonic() - t
    timings["total_s"] = time.monotonic() - t_start
    manifest = run.manifest()
    report = {
        "schema_version": 1,
        "artifact_root": str(run.root),
        "run": {
            k: manifest.get(k)
            for k in (
                "run_id",
                "model",
                "dataset",
                "split",
                "k_samples",
                "logging_profile",
                "sequence_mode",
                "storage_format",
            )
        },
        "labels": {
            "correct": n0,
            "hallucinated": n1,
            "unlabeled": feats.unlabeled,
            # reasoning that never closed (among the unlabeled): a key only when there is some
            **({"no_answer": feats.no_answer} if feats.no_answer else {}),
        },
        "protocol": {
            "seed": seed,
            "scheme": (
                "transfer"
                if train is not None
                else "holdout"
                if split.holdout
                else f"{split.k}-fold"
            ),
            **({"train_root": str(train.root)} if train is not None else {}),
            "test_prompts": int(test.sum()),
            "bootstrap": n_boot,
            "score_orientation": "higher = more likely hallucinated",
        },
        "methods": results,
        "ranking": rankings(results),
        "leakage": {
            **guards.summary(),
            "leaked_correct": int((guards.leaked & (labels == 0)).sum()),
            "leaked_hallucinated": int((guards.leaked & (labels == 1)).sum()),
        },
        "graders": {"primary": guards.primary_grader, "others": grader_summary(table)},
        "comparison": comparison,
        "per_layer": per_layer,
        "skipped": skipped,
        "timings_s": timings,
        "peak_rss_mib": max(_peak_rss_mib(), job.peak_rss_mib if job is not None else 0.0),
    }
    report["_curves"] = {
        "labels": labels[test],
        "scores": {m: v[test] for m, v in roc_scores.items()},
    }
    report["_scores"] = table
    return report


def _hidden(ctx: HiddenContext, wanted, unavailable, timings):
    """Scores of the wanted hidden methods (hidden_methods.py); ({method: extra report keys},
    {method: scores})."""
    extra: dict[str, dict] = {}
    out: dict[str, np.ndarray] = {}
    for name, method in HIDDEN_METHODS.items():
        if name not in wanted:
            continue
        t = time.monotonic()
        why = method.check(ctx)
        if why is not None:
            unavailable(name, why)
            wanted.remove(name)
            continue
        res = method.score(ctx)
        out[name] = np.asarray(res.scores, np.float64)
        extra[name] = {k: v for k, v in (("layer", res.layer),) if v is not None}
        if res.layers:
            extra[name]["layers_read"] = res.layers
        timings[f"{name}_s"] = time.monotonic() - t
    return extra, out


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
            unavailable(
                p,
                f"{run.consolidated}/activations holds no activation store; rerun "
                "with a logging profile that stores activations",
            )
        return []
    keep = []
    modes = ",".join(sorted(feats.sequence_modes)) or "unknown"
    for p in probe_names:
        r = rows[PROBES[p].row]
        cover = float((r >= 0).mean()) if len(r) else 0.0
        if cover < 0.5:
            unavailable(
                p,
                f"needs {_ROW_HINT[PROBES[p].row]} for most prompts, but the run "
                f"stored sequence_mode={modes} ({cover:.0%} have it); rerun with "
                "--logging-profile integrated or probes",
            )
            continue
        keep.append(p)
    return keep
