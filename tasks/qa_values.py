"""Parsing the values of QA records: answers, choices, numbers, context passages.

```python
from hallulog.tasks.qa_values import parse_aliases, parse_number, resolve_choice
parse_aliases('["a", "b"]')          # ["a", "b"]  (a JSON-encoded list in a CSV cell)
parse_number("...\\n#### 1,234")      # 1234.0      (GSM8K)
resolve_choice("B", ["x", "y"])       # 1
```

Used by ``hallulog.tasks.qa`` (the field mapping) and the presets; rules in qa.py's docstring.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "LETTERS",
    "dedup",
    "format_number",
    "parse_aliases",
    "parse_choices",
    "resolve_choice",
    "parse_number",
    "join_context",
    "maybe_json_list",
]

log = logging.getLogger(__name__)

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def dedup(values: Iterable[str]) -> list[str]:
    """Non-blank strings, stripped, first occurrence kept."""
    seen: set[str] = set()
    out = []
    for v in values:
        v = v.strip()
        if v and v not in seen:
            seen.add(v)
            out.append(v)
    return out


def format_number(x: float) -> str:
    """``72.0`` → ``"72"``, ``0.75`` → ``"0.75"``."""
    return str(int(x)) if x.is_integer() and abs(x) < 1e16 else repr(x)


def _scalar_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return format_number(float(v)) if isinstance(v, float) else str(v)


def maybe_json_list(value: str) -> Any:
    s = value.strip()
    if s.startswith("["):
        try:
            decoded = json.loads(s)
        except ValueError:
            return value
        if isinstance(decoded, list):
            return decoded
    return value


def parse_aliases(value: Any) -> list[str] | None:
    """Answer strings of ``value`` (see the module docstring), deduplicated; None when the value
    has another type. An empty list gives ``[]``."""
    if isinstance(value, str):
        value = maybe_json_list(value)
        if isinstance(value, str):
            return dedup([value])
    if isinstance(value, dict):
        return parse_aliases(value["text"]) if "text" in value else None
    if isinstance(value, (list, tuple)):
        out: list[str] = []
        for item in value:
            if isinstance(item, (list, tuple, dict)):
                sub = parse_aliases(item)
                if sub is None:
                    return None
                out.extend(sub)
            else:
                text = _scalar_text(item)
                if text is None:
                    return None
                out.append(text)
        return dedup(out)
    text = _scalar_text(value)
    return None if text is None else dedup([text])


def parse_choices(value: Any) -> tuple[list[str], list[str] | None] | None:
    """``(choices, labels or None)`` of ``value``, or None when it is not a list of choices."""
    labels = None
    if isinstance(value, str):
        value = maybe_json_list(value)
    if isinstance(value, dict) and isinstance(value.get("text"), list):
        raw_labels = value.get("label")
        if isinstance(raw_labels, list) and len(raw_labels) == len(value["text"]):
            labels = [str(x).strip() for x in raw_labels]
        value = value["text"]
    if not isinstance(value, list) or not value or len(value) > len(LETTERS):
        return None
    texts = [_scalar_text(v) for v in value]
    if any(t is None for t in texts):
        return None
    return [t.strip() for t in texts if t is not None], labels


_LETTER = re.compile(r"\(?([A-Za-z])[).:]?")


def resolve_choice(answer: Any, choices: list[str], labels: list[str] | None = None) -> int | None:
    """0-based index of the right choice: ``answer`` is one of the record's ``labels``, a letter
    (``"B"``, ``"(b)"``), a 0-based index (int or digit string) or the choice's text."""
    n = len(choices)
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer if 0 <= answer < n else None
    if isinstance(answer, float) and answer.is_integer():
        return int(answer) if 0 <= answer < n else None
    if not isinstance(answer, str):
        return None
    s = answer.strip()
    if labels and s in labels:
        return labels.index(s)
    m = _LETTER.fullmatch(s)
    if m and LETTERS.index(m.group(1).upper()) < n:
        return LETTERS.index(m.group(1).upper())
    if s.isdigit():
        return int(s) if int(s) < n else None
    if s in choices:
        return choices.index(s)
    folded = [c.casefold() for c in choices]
    return folded.index(s.casefold()) if s and s.casefold() in folded else None


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_FRACTION = re.compile(r"(-?\d+)\s*/\s*(\d+)")


def parse_number(value: Any) -> float | None:
    """The number of ``value``: a number, or a text (GSM8K ``"... #### 1,234"`` → 1234.0,
    ``"$5.00"``, ``"3/4"``); None when there is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        x = float(value)
        return x if math.isfinite(x) else None
    if not isinstance(value, str):
        return None
    s = value.rsplit("####", 1)[-1].strip()
    s = _THOUSANDS.sub("", s).removeprefix("$").removesuffix(".").strip()
    m = _FRACTION.fullmatch(s)
    if m:
        den = int(m.group(2))
        return int(m.group(1)) / den if den else None
    try:
        x = float(s)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def join_context(value: Any) -> str | None | bool:
    """A context passage: a string (stripped; blank → None) or a list of strings joined with
    blank lines; ``False`` when the value has another type."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "\n\n".join(v.strip() for v in value if v.strip()) or None
    return False
