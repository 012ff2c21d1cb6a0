"""``python -m orchestrator estimate``: what a run will store, and how long it takes, before it
runs (docs/budget.md).

The model's shape comes from its ``config.json`` (resolved as ``run`` does) or
``--model-shape``; the prompt count from the task streamed as the run streams it; the lengths
from ``--mean-*-tokens``, a pilot run (``--from-run``) or the task's prompts tokenized. The
projection itself is :mod:`hallulog.estimate.projection`'s.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hallulog.backends.models import ModelInfo
from hallulog.config.plan import plan_run
from hallulog.config.run_config import RunConfig
from hallulog.contracts import layout
from hallulog.contracts.errors import ConfigError
from hallulog.estimate.attention import attention_bytes, model_heads
from hallulog.estimate.measure import Lengths, free_bytes, measure_run, pilot_lengths, task_prompts
from hallulog.estimate.projection import Estimate, Selection, human_bytes, project

__all__ = [
    "estimate",
    "format_estimate",
    "parse_model_shape",
    "add_estimate_arguments",
    "run_estimate",
]


def parse_model_shape(text: str) -> tuple[int, int]:
    """``LAYERS:HIDDEN`` (``32:4096``) → (num_hidden_layers, hidden_size)."""
    layers, sep, hidden = str(text).partition(":")
    try:
        shape = int(layers), int(hidden)
    except ValueError:
        shape = (0, 0)
    if not sep or min(shape) < 1:
        raise ConfigError(f"--model-shape: expected LAYERS:HIDDEN such as 32:4096, got {text!r}")
    return shape


def estimate(
    config: RunConfig,
    *,
    model_shape: tuple[int, int] | None = None,
    mean_prompt_tokens: float | None = None,
    mean_response_tokens: float | None = None,
    mean_answer_tokens: float | None = None,
    from_run: Path | None = None,
    rate: float | None = None,
    free_space: bool = True,
) -> Estimate:
    """The projection of the run ``config`` describes (what ``estimate`` prints).

    The model's shape: ``model_shape``, else its ``config.json`` (resolved as ``run`` does).
    Lengths, first found: the ``mean_*`` figures, the run in ``from_run``, the task's prompts
    tokenized (prompt rows only).
    """
    model_dir: Path | None = None
    if model_shape is not None:
        num_layers, hidden = model_shape
        model = ModelInfo(Path(config.model), num_layers, hidden, f"{num_layers}x{hidden}")
    else:
        from hallulog.backends.models import hallulog_cache_dir, resolve_model

        model = resolve_model(config.model, hallulog_cache_dir(config.cache_dir))
        model_dir = model.path
    plan = plan_run(config, model)  # the prompts streamed as the run streams them
    num_layers, hidden, name = model.num_hidden_layers, model.hidden_size, model.name
    selection = Selection.of(plan.stored)
    measured = measure_run(from_run) if from_run is not None else None
    if from_run is not None and measured is None:
        raise ConfigError(
            f"--from-run {from_run}: no stored generation found (worker_*/"
            f"{layout.ACTIVATION_INDEX})"
        )
    lengths = pilot_lengths(measured) if measured is not None else Lengths()
    tokenize = selection.needs_prompt_length
    prompts = len(plan.task.prompt_ids)
    if tokenize:  # the bound always comes from the task itself
        _, task_lengths = task_prompts(
            plan.task.stream,
            chat=config.chat,
            tokenizer_dir=model_dir,
            lengths=True,
            template_kwargs=dict(plan.chat_template_kwargs),
        )
        lengths = _merge(
            lengths, prompt_max=task_lengths.prompt_max, prompt_source=task_lengths.prompt_source
        )
        if lengths.prompt_mean is None:
            lengths = _merge(lengths, prompt_mean=task_lengths.prompt_mean)
    given = {
        k: v
        for k, v in (
            ("prompt_mean", mean_prompt_tokens),
            ("response_mean", mean_response_tokens),
            ("answer_mean", mean_answer_tokens),
        )
        if v is not None
    }
    if given:
        lengths = _merge(lengths, samples=(), source="given", **given)
        if "prompt_mean" in given and lengths.prompt_max is None:  # no bound from the task
            lengths = _merge(
                lengths, prompt_source="given", prompt_max=math.ceil(mean_prompt_tokens)
            )
    est = project(
        selection,
        hidden_size=hidden,
        storage_format=plan.storage_format,
        max_tokens=config.max_tokens,
        k_samples=config.k_samples,
        prompts=prompts,
        lengths=lengths,
        model=name,
        num_hidden_layers=num_layers,
        metadata_bytes=measured.metadata_bytes_per_generation if measured else None,
    )
    if plan.stored.attention_features:
        est.attention_bytes = _attention_bytes(est, model_dir or model.path, config.max_tokens)
    if rate is not None:
        est.rate, est.rate_source = rate, "given"
    elif measured is not None and measured.rate:
        est.rate, est.rate_source = measured.rate, f"measured on {from_run}"
    if free_space:
        est.free_bytes = free_bytes(Path(config.artifact_root))
    if config.max_storage_gb is not None:
        est.cap_bytes = config.max_storage_gb * 1e9
    return est


def _attention_bytes(est: Estimate, model_dir: Path, max_tokens: int) -> float:
    """``--attention-features``' bytes per generation: the expected answer length where known,
    else --max-tokens; 0 (with a note) when the model's head count is unknown."""
    heads = model_heads(model_dir)
    if heads is None:
        est.notes.append(f"attention features not counted: no head count in {model_dir}")
        return 0.0
    mean = est.lengths.response_mean if est.basis == "pilot" else None
    tokens = min(mean, max_tokens) if mean is not None else max_tokens
    return attention_bytes(tokens, est.num_hidden_layers, heads)


def _merge(lengths: Lengths, **changes: Any) -> Lengths:
    return Lengths(**{**asdict(lengths), **changes})


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_estimate(est: Estimate) -> str:
    """The human-readable report."""
    sel, L = est.selection, est.lengths
    lines = [
        f"model: {est.model} ({est.num_hidden_layers} layers x {est.hidden_size} hidden); "
        f"stores {len(sel.layer_ids)} layer ids x rows of {','.join(sel.names)} x {sel.dtype} "
        f"({sel.capture_mode} capture, {est.storage_format} store)",
        f"prompts: {est.prompts} x (K+1 = {est.k_samples + 1}) = {est.generations} generations",
    ]
    if sel.fixed:
        rows = f"rows per generation: {est.rows_upper} (exact: the selection has a fixed size)"
    else:
        rows = (
            f"rows per generation: upper bound {est.rows_upper} (answers at --max-tokens "
            f"{est.max_tokens}"
            + (
                f", prompts up to {L.prompt_max} tokens by {L.prompt_source}"
                if sel.needs_prompt_length
                else ""
            )
            + ")"
        )
        if est.rows_expected is not None:
            rows += f"; expected {est.rows_expected:.1f} ({_lengths_text(L)})"
    lines.append(rows)
    per = (
        f"bytes per generation: {human_bytes(est.bytes_per_generation)} ({est.basis}"
        f"; {human_bytes(est.overhead_bytes)} of it the store's per-sample overhead)"
    )
    if est.basis == "pilot":
        per += f"; upper bound {human_bytes(est.bytes_upper)}"
    lines.append(per)
    lines.append(
        f"total: {human_bytes(est.total_bytes)} of activations ({est.basis})"
        + (
            f", upper bound {human_bytes(est.bytes_upper * est.generations)}"
            if est.basis == "pilot"
            else ""
        )
        + f"; with ~{human_bytes(est.metadata_bytes)} of metadata a generation"
        + (
            f" and {human_bytes(est.attention_bytes)} of attention features"
            if est.attention_bytes
            else ""
        )
        + f" ({est.metadata_basis}): {human_bytes(est.projected_bytes)}"
    )
    if est.basis == "pilot" and est.expected_range is not None:
        lo, hi = (b * est.generations for b in est.expected_range)
        lines.append(
            f"expected range (95 %): {human_bytes(lo)} to {human_bytes(hi)}, by the "
            f"spread between the pilot's {est.pilot_prompts} prompts; a pilot of "
            f"~{est.pilot_prompts_for_10_percent} prompts narrows it to +-10 %"
        )
    if est.seconds is not None:
        lines.append(
            f"time: {est.generations} generations at {est.rate:.3g} generations/s "
            f"({est.rate_source}): ~{_duration(est.seconds)}"
        )
    if est.free_bytes is not None:
        verdict = (
            "fits"
            if est.fits
            else "does NOT fit (run refuses to start; --check-free-space false overrides)"
        )
        if est.cap_bytes is not None and est.cap_bytes < est.projected_bytes:
            verdict += f" (the run stops at --max-storage-gb {est.cap_bytes / 1e9:g})"
        lines.append(f"free space: {human_bytes(est.free_bytes)}; the projection {verdict}")
    lines.extend(f"note: {n}" for n in est.notes)
    return "\n".join(lines)


def _lengths_text(L: Lengths) -> str:
    parts = [
        f"{name} {value:.1f}"
        for name, value in (
            ("prompt", L.prompt_mean),
            ("response", L.response_mean),
            ("answer", L.answer_mean),
        )
        if value is not None
    ]
    where = f"{len(L.samples)} pilot generations" if L.source == "pilot" else L.source
    return f"mean tokens {', '.join(parts)}: {where}"


def add_estimate_arguments(parser: Any) -> None:
    """The ``estimate`` subcommand's own flags (it takes every ``run`` flag besides)."""
    parser.add_argument(
        "--model-shape",
        metavar="LAYERS:HIDDEN",
        help="The model's num_hidden_layers:hidden_size (32:4096 for an 8B "
        "Llama, 80:8192 for a 70B) instead of reading --model's "
        "config.json: for a model not on this machine.",
    )
    parser.add_argument(
        "--from-run",
        type=Path,
        metavar="ROOT",
        help="An earlier (pilot) run's artifact root: its mean prompt, "
        "response and answer lengths, metadata bytes and rate give the "
        "expected figures (e.g. `run --limit 20` first).",
    )
    parser.add_argument(
        "--mean-prompt-tokens",
        type=float,
        metavar="N",
        help="Expected mean prompt length in tokens (overrides --from-run).",
    )
    parser.add_argument(
        "--mean-response-tokens",
        type=float,
        metavar="N",
        help="Expected mean answer length in tokens (overrides --from-run).",
    )
    parser.add_argument(
        "--mean-answer-tokens",
        type=float,
        metavar="N",
        help="Expected mean exact-answer span in tokens, for --positions "
        "exact_answer (overrides --from-run).",
    )
    parser.add_argument(
        "--rate",
        type=float,
        metavar="GEN_PER_S",
        help="Generations per second, for the time (default: --from-run's measured rate).",
    )
    parser.add_argument(
        "--json", action="store_true", help="Print one JSON line instead of the report."
    )


def run_estimate(config: RunConfig, args: Any) -> int:
    """``python -m orchestrator estimate``: print the projection; 2 on a bad value."""
    import sys

    try:
        shape = parse_model_shape(args.model_shape) if args.model_shape else None
        for flag in ("mean_prompt_tokens", "mean_response_tokens", "mean_answer_tokens", "rate"):
            value = getattr(args, flag)
            if value is not None and value <= 0:
                raise ConfigError(f"--{flag.replace('_', '-')} must be > 0")
        est = estimate(
            config,
            model_shape=shape,
            mean_prompt_tokens=args.mean_prompt_tokens,
            mean_response_tokens=args.mean_response_tokens,
            mean_answer_tokens=args.mean_answer_tokens,
            from_run=args.from_run,
            rate=args.rate,
        )
    except ConfigError as exc:
        print(f"python -m orchestrator estimate: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(est.to_json(), separators=(",", ":")) if args.json else format_estimate(est))
    return 0
