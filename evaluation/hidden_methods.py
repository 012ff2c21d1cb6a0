"""Methods that read the activation store beyond one row per layer: one registry, one interface.

The per-layer probes (probes.py) read one row of the primary per layer; the methods here read
more of the store (the K samples' rows, every layer of every answer row) or other per-token
captures, and are scored whole. Each is a :class:`HiddenMethod`: ``check`` says why a run
cannot score it (``None``: it can), ``score`` returns one float per labelled prompt.
``evaluate`` runs every registered method the user asked for, after the probes; a new family
(e.g. the attention-based scores) adds a module with its ``METHODS`` and lists it in
``_MODULES`` below (the attention-based scores: attention.py).

``kind`` is ``probe`` when the method is fitted on the labels (cross-fitted on the split's
folds, or on the training run under transfer) and ``unsupervised`` otherwise; ``probability``
marks a score that is the logit of P(hallucinated) (ECE and Brier use its sigmoid).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["HiddenMethod", "HiddenContext", "HiddenResult", "hidden_methods"]


@dataclass
class HiddenContext:
    """What a hidden method may read: the run, the streamed features, the labelled prompts'
    labels and split, and the training run under transfer (``None`` otherwise)."""

    run: object  # evaluation.data.Run
    feats: object  # evaluation.features.Features
    rows: dict[str, np.ndarray]
    labels: np.ndarray
    split: object  # evaluation.protocol.Split
    seed: int = 0
    folds: int = 5
    train: object | None = None  # evaluation.data.Run of --train-root


@dataclass
class HiddenResult:
    scores: np.ndarray
    layer: int | None = None  # the one layer read (EigenScore)
    layers: list[int] = field(default_factory=list)  # every layer read (the ICR probe)


@dataclass(frozen=True)
class HiddenMethod:
    name: str
    family: str
    kind: str  # probe | unsupervised
    check: Callable[[HiddenContext], str | None]
    score: Callable[[HiddenContext], HiddenResult]
    probability: bool = False


#: modules holding a ``METHODS`` list of HiddenMethod, in the order they run
_MODULES = (
    "hallulog.evaluation.hidden",
    "hallulog.evaluation.icr",
    "hallulog.evaluation.attention",
)


def hidden_methods() -> dict[str, HiddenMethod]:
    """Every registered hidden method by name."""
    out: dict[str, HiddenMethod] = {}
    for mod in _MODULES:
        for m in importlib.import_module(mod).METHODS:
            out[m.name] = m
    return out
