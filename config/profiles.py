"""The logging profiles of seed 003 §7 (plus ``probes``): which layers, token rows and dtype a
run stores, and the layer ids a profile gives on a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hallulog.contracts.errors import ConfigError

__all__ = ["LoggingProfile", "PROFILES", "select_layer_ids", "TargetLayers", "SequenceMode"]

TargetLayers = Literal["all", "first_half", "second_half", "spread"]
SequenceMode = Literal["all", "prompt", "response", "last", "positions"]


@dataclass(frozen=True)
class LoggingProfile:
    """What activations a run keeps (seed 003 §7)."""

    name: str
    target_layers: TargetLayers
    """Layer ids kept: ``all`` = 0..N (0 is the embedding output, k the residual stream after
    decoder layer k); ``first_half`` = 0..N//2; ``second_half`` = N//2+1..N; ``spread`` = the
    two ids N/2 and 2N/3 (:func:`select_layer_ids`)."""
    sequence_mode: SequenceMode
    """Token rows kept: ``all`` prompt+response, ``prompt``, ``response`` (last prompt token then
    the response tokens), ``last`` (the final captured row only), ``positions`` (the union of
    :attr:`positions`, contracts/positions.py)."""
    dtype: Literal["float16", "float32", "bfloat16"]
    """dtype of the stored activations (bfloat16: kept as is from a bfloat16 model, no cast)."""
    positions: tuple[str, ...] | None = None
    """Token positions by name (``hallulog.contracts.positions``), exactly when ``sequence_mode`` is
    ``positions``."""
    attention_features: bool = False
    """Store the per-token attention summaries (``--attention-features``,
    docs/formats/attention.md) unless the flag says otherwise."""

    def __post_init__(self) -> None:
        if self.target_layers not in ("all", "first_half", "second_half", "spread"):
            raise ConfigError(f"--target-layers: unknown value {self.target_layers!r}")
        if self.sequence_mode not in ("all", "prompt", "response", "last", "positions"):
            raise ConfigError(f"--sequence-mode: unknown value {self.sequence_mode!r}")
        if (self.sequence_mode == "positions") != bool(self.positions):
            raise ConfigError(
                "a logging profile gives positions exactly with sequence_mode positions"
            )
        if self.dtype not in ("float16", "float32", "bfloat16"):
            raise ConfigError(f"--dtype: unknown value {self.dtype!r} (float16|float32|bfloat16)")


# float16 by default (docs/architecture.md, "Design rules"); seed 003 §7 said float32 for
# `integrated`: the design rules win over a seed.
PROFILES: dict[str, LoggingProfile] = {
    "integrated": LoggingProfile("integrated", "all", "response", "float16"),
    "light": LoggingProfile("light", "second_half", "last", "float16"),
    # everything a detector reads, the attention summaries of Lookback Lens / RAUQ / LapEigvals too
    "full": LoggingProfile("full", "all", "all", "float32", attention_features=True),
    # the rows the probes of docs/evaluation.md read (SEP TBG/SLT, LLMs-Know-More exact answer,
    # Geometry of Truth last token) on two layers: under 5 % of `integrated` (docs/alignment.md)
    "probes": LoggingProfile(
        "probes", "spread", "positions", "float16", positions=("tbg", "slt", "exact_answer", "last")
    ),
}


def select_layer_ids(target_layers: str, num_hidden_layers: int) -> list[int]:
    """Layer ids for a profile's ``target_layers`` on a model with ``num_hidden_layers`` layers."""
    n = num_hidden_layers
    if target_layers == "all":
        return list(range(0, n + 1))
    if target_layers == "first_half":
        return list(range(0, n // 2 + 1))
    if target_layers == "second_half":
        return list(range(n // 2 + 1, n + 1))
    if target_layers == "spread":  # N/2, 2N/3: 15, 20 of 30 (docs/alignment.md)
        return sorted({int(n * f + 0.5) for f in (1 / 2, 2 / 3)})
    raise ConfigError(f"unknown target_layers {target_layers!r}")
