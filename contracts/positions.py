"""Token positions by name and layer ids by list: what ``--positions`` and ``--layers`` mean.

```python
from hallulog.contracts.positions import parse_positions, parse_layers, resolve_positions, count_rows
names = parse_positions("tbg,slt,exact_answer,last:4")   # ("tbg", "slt", "exact_answer", "last:4")
layers = parse_layers("0,8,16-20,-1", 30)                 # [0, 8, 16, 17, 18, 19, 20, 30]
r = resolve_positions(("tbg", "slt", "exact_answer", "last"), prompt_len=7, response_len=5,
                      capture_mode="generation", exact_answer=(1, 3))
r.positions   # (6, 8, 9, 10): absolute positions of the stored rows, sorted
r.rows        # {"tbg": (0,), "slt": (3,), "exact_answer": (1, 2), "last": (3,)}
```

Absolute positions index the sequence prompt + response tokens (P prompt, R response tokens); the
state at position p is the hidden state after the model has read token p (docs/alignment.md). A
capture holds positions ``0 .. num_tokens-1``: ``num_tokens = P+R-1`` when captured during
generation (the last response token is never fed back), ``P+R`` with prefill capture.

| name | positions |
|---|---|
| ``prompt`` | 0 .. P-1 |
| ``tbg`` | P-1: the last prompt token, the state that produced the first answer token |
| ``response`` | P-1 .. num_tokens-1: tbg, then the answer tokens captured |
| ``all`` | 0 .. num_tokens-1 |
| ``last`` | num_tokens-1 |
| ``slt`` | P+R-2: the second-last answer token (R >= 2; none with R == 1) |
| ``first:K`` | P .. P+K-1, clipped to the captured positions |
| ``last:K`` | the last K captured positions |
| ``exact_answer`` | P+s .. P+e-1 for the answer's token span [s, e), clipped to the captured positions |
| ``answer_first`` | P+A: the first answer token (A = 0 without reasoning) |
| ``answer_last`` | the last captured answer position: min(P+R, num_tokens) - 1, when >= P+A |
| ``reasoning_last`` | P+E: the reasoning's end marker, whose state produced the first answer token |
| ``reasoning`` | P+S .. P+E-1: the reasoning tokens (markers excluded), clipped to the captured |

For a reasoning generation (``contracts/reasoning.py``: reasoning tokens [S, E), answer from
A = E+1) the answer-relative names count from A: ``slt`` is the second-last answer token
(R-A >= 2), ``first:K`` the first K answer tokens, ``exact_answer``'s span is given in response
tokens (already offset by A). ``tbg``, ``response``, ``last``, ``last:K``, ``prompt`` and
``all`` do not move. Without reasoning, ``reasoning_last`` and ``reasoning`` are missing; when
the reasoning never closed (no answer) every answer name is missing.

A name whose positions do not exist for a generation (``slt`` with a one-token answer,
``exact_answer`` without a span, ``first:K`` when no answer token was captured) resolves to no
rows: it is listed in :attr:`ResolvedPositions.missing`, and the generation is stored without it.

Only :mod:`contracts` may be imported here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "POSITION_NAMES",
    "WINDOW_KINDS",
    "ResolvedPositions",
    "parse_positions",
    "parse_layers",
    "count_rows",
    "resolve_positions",
    "num_captured",
]

POSITION_NAMES = (
    "tbg",
    "slt",
    "exact_answer",
    "last",
    "response",
    "prompt",
    "all",
    "answer_first",
    "answer_last",
    "reasoning_last",
    "reasoning",
)
"""The plain position names; windows ``first:K`` and ``last:K`` (K >= 1) come in addition."""
WINDOW_KINDS = ("first", "last")
"""Window names: ``first:K`` (the first K answer positions), ``last:K`` (the last K captured)."""

CAPTURE_MODES = ("generation", "prefill")

_ANSWER_NAMES = ("slt", "exact_answer", "answer_first", "answer_last")
"""Names counted from the answer's first token (with ``first:K``)."""

_WINDOW_RE = re.compile(r"^(first|last):(\d+)$")
_LAYER_RE = re.compile(r"^(-?\d+)(?:-(-?\d+))?$")


@dataclass(frozen=True)
class ResolvedPositions:
    """The rows one generation stores for a set of position names."""

    positions: tuple[int, ...]
    """Absolute positions of the stored rows, sorted, unique (row j is ``positions[j]``)."""
    rows: Mapping[str, tuple[int, ...]]
    """Per name (in the order given), the row indexes into :attr:`positions` it covers (empty
    when the name does not exist for this generation)."""
    num_tokens: int
    """Positions the capture holds (``0 .. num_tokens-1``)."""

    @property
    def missing(self) -> tuple[str, ...]:
        """The names that resolved to no rows."""
        return tuple(name for name, idx in self.rows.items() if not idx)

    @property
    def num_rows(self) -> int:
        return len(self.positions)

    @property
    def contiguous(self) -> bool:
        """True when the stored positions are one run ``positions[0] .. positions[-1]``."""
        return not self.positions or self.positions[-1] - self.positions[0] + 1 == len(
            self.positions
        )


def parse_positions(text: str) -> tuple[str, ...]:
    """``"tbg,slt,exact_answer,last:4"`` → ``("tbg", "slt", "exact_answer", "last:4")``.

    Names are lower-cased and stripped, windows written ``first:K`` / ``last:K`` with K a
    positive integer (``last:04`` → ``last:4``); duplicates are dropped (first one kept, order
    kept). An unknown name, a bad K or an empty list raises ValueError naming ``--positions``.
    """
    out: list[str] = []
    for raw in str(text).split(","):
        name = raw.strip().lower().replace(" ", "")
        if not name:
            continue
        window = _WINDOW_RE.match(name)
        if window:
            k = int(window.group(2))
            if k < 1:
                raise ValueError(f"--positions: {raw.strip()!r}: K must be >= 1")
            name = f"{window.group(1)}:{k}"
        elif name not in POSITION_NAMES:
            hint = (
                "K must be a positive integer (first:K, last:K)"
                if name.split(":")[0] in WINDOW_KINDS
                else f"choose from {', '.join(POSITION_NAMES)}, first:K, last:K"
            )
            raise ValueError(f"--positions: unknown position {raw.strip()!r}; {hint}")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError(f"--positions: no position given in {text!r}")
    return tuple(out)


def parse_layers(text: str, num_hidden_layers: int) -> list[int]:
    """``"0,8,16-20,-1"`` → sorted unique layer ids in ``0..N`` (N = ``num_hidden_layers``).

    Id 0 is the embedding output, k the residual stream after decoder layer k; ``-1`` is N,
    ``-2`` N-1, ...; ranges ``a-b`` are inclusive and either end may be negative
    (``-4--1`` = the last four). Out of range, a reversed range or a malformed item raises
    ValueError naming ``--layers``.
    """
    n = int(num_hidden_layers)
    ids: set[int] = set()

    def resolve(value: str) -> int:
        v = int(value)
        layer = v if v >= 0 else n + 1 + v
        if not 0 <= layer <= n:
            raise ValueError(
                f"--layers: layer {v} is out of range for a model with {n} layers (ids 0..{n})"
            )
        return layer

    for raw in str(text).split(","):
        item = raw.strip().replace(" ", "")
        if not item:
            continue
        m = _LAYER_RE.match(item)
        if not m:
            raise ValueError(
                f"--layers: cannot read {raw.strip()!r}; give ids and inclusive "
                "ranges such as 0,8,16-20,-1"
            )
        start = resolve(m.group(1))
        end = resolve(m.group(2)) if m.group(2) is not None else start
        if end < start:
            raise ValueError(f"--layers: range {item!r} is reversed (layer {start} > {end})")
        ids.update(range(start, end + 1))
    if not ids:
        raise ValueError(f"--layers: no layer given in {text!r}")
    return sorted(ids)


def num_captured(*, prompt_len: int, response_len: int, capture_mode: str) -> int:
    """Positions a capture holds: P+R-1 during generation (P with no response token), P+R with
    prefill."""
    if capture_mode not in CAPTURE_MODES:
        raise ValueError(f"--capture-mode: unknown value {capture_mode!r}")
    p, r = int(prompt_len), int(response_len)
    if p < 1 or r < 0:
        raise ValueError(f"bad lengths: prompt {p} (>= 1), response {r} (>= 0)")
    return p + max(r - 1, 0) if capture_mode == "generation" else p + r


def _name_positions(
    name: str,
    *,
    p: int,
    r: int,
    n: int,
    exact_answer: tuple[int, int] | None,
    a: int | None,
    reasoning: tuple[int, int] | None,
) -> range:
    if name == "reasoning":
        return range(0) if reasoning is None else range(p + reasoning[0], min(p + reasoning[1], n))
    if name == "reasoning_last":
        if reasoning is None or a is None:
            return range(0)
        return range(p + reasoning[1], p + reasoning[1] + 1) if p + reasoning[1] < n else range(0)
    if a is None:  # the reasoning never closed: no answer position exists
        if name in _ANSWER_NAMES or name.startswith("first:"):
            return range(0)
        a = 0
    if name == "answer_first":
        return range(p + a, p + a + 1) if p + a < n and a < r else range(0)
    if name == "answer_last":
        last = min(p + r, n) - 1
        return range(last, last + 1) if a < r and last >= p + a else range(0)
    if name == "prompt":
        return range(0, p)
    if name == "tbg":
        return range(p - 1, p)
    if name == "response":
        return range(p - 1, n)
    if name == "all":
        return range(0, n)
    if name == "last":
        return range(n - 1, n)
    if name == "slt":
        return range(p + r - 2, p + r - 1) if r - a >= 2 else range(0)
    if name == "exact_answer":
        if exact_answer is None:
            return range(0)
        s, e = int(exact_answer[0]), int(exact_answer[1])
        return range(max(p + max(s, 0), 0), min(p + e, n))
    window = _WINDOW_RE.match(name)
    if window:
        k = int(window.group(2))
        if window.group(1) == "first":
            return range(p + a, min(p + a + k, n))
        return range(max(n - k, 0), n)
    raise ValueError(f"--positions: unknown position {name!r}")


def resolve_positions(
    names: Iterable[str],
    *,
    prompt_len: int,
    response_len: int,
    capture_mode: str,
    exact_answer: tuple[int, int] | None,
    reasoning: tuple[int, int] | None = None,
    answer_start: int | None = 0,
) -> ResolvedPositions:
    """The rows one generation stores for position ``names`` (see the module's table).

    ``exact_answer`` is the answer's token span ``[start, end)`` in response tokens, or None;
    ``reasoning`` the reasoning tokens ``[S, E)`` and ``answer_start`` the first answer token
    (None: the reasoning never closed) of a reasoning generation, else None and 0.
    """
    names = tuple(names)
    p, r = int(prompt_len), int(response_len)
    n = num_captured(prompt_len=p, response_len=r, capture_mode=capture_mode)
    per_name = {
        name: _name_positions(
            name, p=p, r=r, n=n, exact_answer=exact_answer, a=answer_start, reasoning=reasoning
        )
        for name in names
    }
    positions = tuple(sorted({pos for rng in per_name.values() for pos in rng}))
    index = {pos: j for j, pos in enumerate(positions)}
    rows = {name: tuple(index[pos] for pos in rng) for name, rng in per_name.items()}
    return ResolvedPositions(positions=positions, rows=rows, num_tokens=n)


def count_rows(
    names: Iterable[str],
    *,
    prompt_len: int,
    response_len: int,
    capture_mode: str,
    exact_answer_len: int = 1,
) -> int:
    """Rows stored for one generation: the union of ``names``' positions, each once.

    For projections: the exact answer is taken as the first ``exact_answer_len`` answer tokens
    (0: no exact answer).
    """
    span = (0, int(exact_answer_len)) if exact_answer_len > 0 else None
    return resolve_positions(
        names,
        prompt_len=prompt_len,
        response_len=response_len,
        capture_mode=capture_mode,
        exact_answer=span,
    ).num_rows
