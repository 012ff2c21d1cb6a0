"""What a run stores, projected from its selection and lengths (no file is read here).

A generation stores ``layers × rows × hidden_size × itemsize`` bytes of activations plus the
store's per-sample overhead (the storage registry's ``sample_bytes``: a commit-log line and index
entries, a file header, whole chunks).
The rows follow from the positions (``--positions``, else the profile's sequence mode) and the
generation's lengths:

- a *fixed* selection (``tbg``, ``slt``, ``last``, ``first:K``, ``last:K``; sequence mode
  ``last``) stores the same rows whatever the lengths: its figure is exact (``slt`` of a
  one-token answer and ``first:K`` of an answer shorter than K store fewer);
- a length-dependent one (``response``, ``prompt``, ``all``, ``exact_answer``) gets an upper
  bound (every answer ``--max-tokens`` long, the longest prompt) and, given a pilot run or mean
  lengths, an expected figure.

Everything else a run writes (JSONL, Parquet, exports) is counted as metadata bytes per
generation: measured on a pilot run, else the model below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


from hallulog.contracts.positions import count_rows
from hallulog.contracts.stored import Stored
from hallulog.contracts.errors import ConfigError
from hallulog.estimate.measure import Lengths
from hallulog.storage.registry import sample_bytes

__all__ = ["Selection", "Estimate", "project", "human_bytes",
           "ITEMSIZE", "METADATA_BYTES_FIXED", "METADATA_BYTES_PER_TOKEN"]


ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
#: position names whose row count depends on neither length (up to the edge cases above)
FIXED_NAMES = ("tbg", "slt", "last")
#: metadata (JSONL, Parquet, exports, consolidated copies) per generation when no pilot run
#: measured it: a fixed part plus a part per response token (the top-5 logprobs of each token
#: are most of it), fitted on the default model's TriviaQA run
METADATA_BYTES_FIXED = 2_000
METADATA_BYTES_PER_TOKEN = 1_000


@dataclass(frozen=True)
class Selection:
    """What one generation stores: layer ids × the rows of ``names``, in ``dtype``."""

    layer_ids: tuple[int, ...]
    names: tuple[str, ...]
    dtype: str
    capture_mode: str

    @classmethod
    def of(cls, stored: Stored) -> Selection:
        """The selection of what a run stores (its plan's ``stored``)."""
        return cls(stored.layer_ids, stored.names, stored.dtype, stored.capture_mode)

    @property
    def fixed(self) -> bool:
        """True when the row count depends on neither the prompt's nor the answer's length."""
        return all(n in FIXED_NAMES or n.partition(":")[0] in ("first", "last")
                   for n in self.names)

    @property
    def needs_prompt_length(self) -> bool:
        return any(n in ("prompt", "all") for n in self.names)

    def rows(self, prompt_len: int, response_len: int, answer_len: int) -> int:
        return count_rows(self.names, prompt_len=max(1, prompt_len),
                          response_len=max(1, response_len), capture_mode=self.capture_mode,
                          exact_answer_len=max(0, min(answer_len, response_len)))

    def rows_at_mean(self, prompt_len: float, response_len: float, answer_len: float) -> float:
        """Rows at fractional mean lengths: linear between the neighbouring integers."""
        p0, r0, a0 = (int(math.floor(x)) for x in (prompt_len, response_len, answer_len))
        base = self.rows(p0, r0, a0)
        return (base + (prompt_len - p0) * (self.rows(p0 + 1, r0, a0) - base)
                + (response_len - r0) * (self.rows(p0, r0 + 1, a0) - base)
                + (answer_len - a0) * (self.rows(p0, r0, a0 + 1) - base))

    def window(self) -> int:
        """The longest ``first:K`` / ``last:K`` window (0: none)."""
        return max((int(n.partition(":")[2]) for n in self.names if ":" in n), default=0)


@dataclass
class Estimate:
    """A projection of what a run stores (``to_json`` is the ``--json`` line)."""

    model: str
    num_hidden_layers: int
    hidden_size: int
    selection: Selection
    storage_format: str
    max_tokens: int
    k_samples: int
    prompts: int
    rows_upper: int
    rows_expected: float | None
    bytes_upper: float
    bytes_expected: float | None
    overhead_bytes: float
    metadata_bytes: float
    metadata_basis: str
    lengths: Lengths
    rate: float | None = None
    rate_source: str | None = None
    free_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    expected_range: tuple[float, float] | None = None
    """Bytes per generation, two standard errors either side of the expected figure (the
    spread of the pilot's prompts)."""
    pilot_prompts: int | None = None
    pilot_prompts_for_10_percent: int | None = None
    """Pilot prompts for two standard errors of 10 % (from the pilot's spread)."""
    cap_bytes: float | None = None
    """``--max-storage-gb`` in bytes: the run stores no more."""
    attention_bytes: float = 0.0
    """``--attention-features``' bytes per generation (0 without it)."""

    @property
    def generations(self) -> int:
        return self.prompts * (self.k_samples + 1)

    @property
    def basis(self) -> str:
        """``exact`` (fixed selection), ``pilot`` (expected from measured or given lengths),
        ``upper_bound``."""
        if self.selection.fixed:
            return "exact"
        return "pilot" if self.bytes_expected is not None else "upper_bound"

    @property
    def bytes_per_generation(self) -> float:
        """The headline figure: the expected one where there is one (not for fixed selections,
        whose figure is exact), else the upper bound."""
        if self.basis == "pilot":
            return self.bytes_expected  # type: ignore[return-value]
        return self.bytes_upper

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_generation * self.generations

    @property
    def projected_bytes(self) -> float:
        """Activations and metadata of every generation: what ``run`` checks the free space
        against."""
        per = self.bytes_per_generation + self.metadata_bytes + self.attention_bytes
        return per * self.generations

    @property
    def fits(self) -> bool | None:
        """The projection (at most the cap) within the free space; None: not known."""
        if self.free_bytes is None:
            return None
        return min(self.projected_bytes, self.cap_bytes or math.inf) <= self.free_bytes

    @property
    def seconds(self) -> float | None:
        return self.generations / self.rate if self.rate else None

    def to_json(self) -> dict[str, Any]:
        ex = self.bytes_expected
        return {
            "bytes_per_generation": round(self.bytes_per_generation),
            "total_bytes": round(self.total_bytes),
            "generations": self.generations, "prompts": self.prompts,
            "k_samples": self.k_samples, "layers": len(self.selection.layer_ids),
            "rows_per_generation": {"upper_bound": self.rows_upper,
                                    "expected": None if self.rows_expected is None
                                    else round(self.rows_expected, 3)},
            "basis": self.basis,
            "upper_bound_bytes_per_generation": round(self.bytes_upper),
            "expected_bytes_per_generation": None if ex is None else round(ex),
            "upper_bound_total_bytes": round(self.bytes_upper * self.generations),
            "expected_total_bytes": None if ex is None else round(ex * self.generations),
            "expected_range_total_bytes": None if self.expected_range is None
            else [round(b * self.generations) for b in self.expected_range],
            "pilot_prompts": self.pilot_prompts,
            "pilot_prompts_for_10_percent": self.pilot_prompts_for_10_percent,
            "overhead_bytes_per_generation": round(self.overhead_bytes),
            "metadata_bytes_per_generation": round(self.metadata_bytes),
            "metadata_basis": self.metadata_basis,
            "attention_bytes_per_generation": round(self.attention_bytes),
            "projected_bytes": round(self.projected_bytes),
            "model": self.model, "num_hidden_layers": self.num_hidden_layers,
            "hidden_size": self.hidden_size, "layer_ids": list(self.selection.layer_ids),
            "positions": list(self.selection.names), "dtype": self.selection.dtype,
            "capture_mode": self.selection.capture_mode, "storage_format": self.storage_format,
            "max_tokens": self.max_tokens,
            "lengths": {k: v for k, v in asdict(self.lengths).items()
                        if k not in ("samples", "stored_rows", "prompt_of")},
            "rate_generations_per_s": self.rate, "rate_source": self.rate_source,
            "seconds": None if self.seconds is None else round(self.seconds, 1),
            "free_bytes": self.free_bytes,
            "max_storage_bytes": self.cap_bytes, "fits": self.fits,
            "notes": self.notes,
        }


def project(selection: Selection, *, hidden_size: int, storage_format: str, max_tokens: int,
            k_samples: int, prompts: int, lengths: Lengths, model: str = "",
            num_hidden_layers: int = 0, metadata_bytes: float | None = None) -> Estimate:
    """The projection for ``prompts`` prompts from the given lengths (no file is read)."""
    itemsize = ITEMSIZE[selection.dtype]
    layers = len(selection.layer_ids)
    notes: list[str] = []
    p_upper = lengths.prompt_max if selection.needs_prompt_length else None
    if selection.needs_prompt_length and p_upper is None:
        raise ConfigError("the selection stores prompt rows: the prompts' lengths are needed "
                          "(a local --model with its tokenizer, or --mean-prompt-tokens)")
    p_fixed = selection.window() + 1
    rows_upper = selection.rows(p_upper or p_fixed, max_tokens, max_tokens)
    rows_expected: float | None = None
    per_sample: list[int] = []
    if lengths.source == "pilot" and lengths.stored_rows \
            and lengths.signature == (selection.names, selection.capture_mode, max_tokens):
        per_sample = list(lengths.stored_rows)  # the pilot stored this very selection
    elif lengths.samples and lengths.source == "pilot":
        per_sample = [selection.rows(p if selection.needs_prompt_length else p_fixed,
                                     min(r, max_tokens), a) for p, r, a in lengths.samples]
    spread = _spread(per_sample, lengths.prompt_of, prompts)
    if per_sample:
        rows_expected = sum(per_sample) / len(per_sample)
    elif not selection.fixed and lengths.response_mean is not None:
        p_mean = lengths.prompt_mean if selection.needs_prompt_length else p_fixed
        if p_mean is None:
            notes.append("no expected figure: the prompts' mean length is unknown "
                         "(--mean-prompt-tokens)")
        elif "exact_answer" in selection.names and lengths.answer_mean is None:
            notes.append("no expected figure: the answer spans' mean length is unknown "
                         "(--mean-answer-tokens)")
        else:
            rows_expected = selection.rows_at_mean(
                p_mean, min(lengths.response_mean, max_tokens), lengths.answer_mean or 0)
    if selection.fixed and rows_expected is not None and rows_expected < rows_upper:
        notes.append(f"the pilot stored {rows_expected:.2f} rows a generation on average "
                     f"against {rows_upper}: short answers lack slt / first:K rows")
    key_len = 17 + len(str(k_samples))
    upper = sample_bytes(storage_format, layers=layers, rows=rows_upper,
                         hidden_size=hidden_size, itemsize=itemsize, key_len=key_len)
    expected = None if rows_expected is None else sample_bytes(
        storage_format, layers=layers, rows=rows_expected, hidden_size=hidden_size,
        itemsize=itemsize, key_len=key_len)
    expected_range = None if rows_expected is None or spread is None else tuple(
        sample_bytes(storage_format, layers=layers, rows=max(0.0, rows_expected + d),
                     hidden_size=hidden_size, itemsize=itemsize, key_len=key_len)
        for d in (-spread[0], spread[0]))
    data = layers * rows_upper * hidden_size * itemsize
    if metadata_bytes is None:
        mean_r = lengths.response_mean if rows_expected is not None and \
            lengths.response_mean is not None else max_tokens
        metadata_bytes, basis = METADATA_BYTES_FIXED + METADATA_BYTES_PER_TOKEN * mean_r, "model"
    else:
        basis = "pilot"
    est = Estimate(model=model, num_hidden_layers=num_hidden_layers, hidden_size=hidden_size,
                   selection=selection, storage_format=storage_format, max_tokens=max_tokens,
                   k_samples=k_samples, prompts=prompts, rows_upper=rows_upper,
                   rows_expected=rows_expected, bytes_upper=upper, bytes_expected=expected,
                   overhead_bytes=upper - data, metadata_bytes=metadata_bytes,
                   metadata_basis=basis, lengths=lengths, notes=notes,
                   expected_range=expected_range,  # type: ignore[arg-type]
                   pilot_prompts=spread[1] if spread else None,
                   pilot_prompts_for_10_percent=spread[2] if spread else None)
    return est


def _spread(per_sample: list[int], prompt_of: Sequence[int], prompts: int
            ) -> tuple[float, int, int] | None:
    """How far the pilot's mean rows may be from the run's: (two standard errors in rows, the
    pilot's prompts, the pilot prompts that would make two standard errors 10 % of the mean).

    Rows vary mostly between prompts (one question's answers are all short, another's all hit
    --max-tokens), so the unit is the prompt: the run's mean over ``prompts`` prompts is
    predicted from the pilot's k with a standard error of ``sd * sqrt(1/k + 1/prompts)``, sd
    the spread of the per-prompt means. None under two pilot prompts.
    """
    if not per_sample or len(prompt_of) != len(per_sample):
        return None
    groups: dict[int, list[int]] = {}
    for rows, prompt in zip(per_sample, prompt_of):
        groups.setdefault(prompt, []).append(rows)
    means = [sum(g) / len(g) for g in groups.values()]
    k = len(means)
    if k < 2:
        return None
    mean = sum(means) / k
    sd = math.sqrt(sum((m - mean) ** 2 for m in means) / (k - 1))
    two_se = 2 * sd * math.sqrt(1 / k + 1 / max(1, prompts))
    needed = math.ceil((2 * sd / (0.1 * mean)) ** 2 - 1e-9) if mean > 0 else k
    return two_se, k, max(needed, 2)


def human_bytes(n: float) -> str:
    """Decimal units (1 GB = 10^9 bytes), as ``du -sb`` figures divide."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if n / size < 100 else f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"
