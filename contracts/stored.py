"""What a run stores of each generation: the layer ids, the token rows and the dtype, resolved
once from the six settings that decide them (``--logging-profile``, ``--target-layers``,
``--sequence-mode``, ``--layers``, ``--positions``, ``--capture-mode``; the run plan,
``config/plan.py``), and what a capture request asks the server for.

```python
stored = Stored(layer_ids=(0, 15, 30), sequence_mode="response", dtype="float16")
stored.names          # ("response",): the row rule (the position names with --positions)
stored.capture_rows   # "response": kv_transfer_params.hallulog_capture_rows
```
"""

from __future__ import annotations

from dataclasses import dataclass

from hallulog.contracts.capture_rows import rows_to_ask

__all__ = ["Stored", "SEQUENCE_MODES"]

SEQUENCE_MODES = ("all", "prompt", "response", "last", "positions")
"""The row rules: a sequence mode, or ``positions`` (the union of named positions,
``contracts/positions.py``)."""


@dataclass(frozen=True)
class Stored:
    """The activations a run keeps of every generation."""

    layer_ids: tuple[int, ...]
    """Layer ids, in order (0 the embedding output, k the residual stream after decoder layer
    k); the servers capture exactly these."""
    sequence_mode: str
    """Token rows: ``all``, ``prompt``, ``response`` (the last prompt token, then the
    response's), ``last``, or ``positions`` (:attr:`positions`)."""
    dtype: str
    """float16, float32 or bfloat16."""
    capture_mode: str = "generation"
    """``generation`` (captured on the generation request) or ``prefill`` (on a prefill-only
    request of prompt + response)."""
    positions: tuple[str, ...] | None = None
    """Token positions by name, exactly when :attr:`sequence_mode` is ``positions``."""
    attention_features: bool = False
    """Per-token attention summaries per layer and head (``--attention-features``,
    docs/formats/attention.md)."""

    def __post_init__(self) -> None:
        if self.sequence_mode not in SEQUENCE_MODES:
            raise ValueError(f"unknown sequence mode {self.sequence_mode!r}")
        if (self.sequence_mode == "positions") != bool(self.positions):
            raise ValueError("positions are given exactly with sequence mode positions")

    @property
    def names(self) -> tuple[str, ...]:
        """The row rule as position names (``("response",)`` for sequence mode response)."""
        return self.positions if self.positions else (self.sequence_mode,)

    @property
    def capture_rows(self) -> str:
        """What a generation request asks the server to write (``contracts/capture_rows.py``):
        the narrowest selection holding every row kept."""
        return rows_to_ask(sequence_mode=self.sequence_mode, positions=self.positions)
