"""The capture check of ``validate --deep`` over stored activations: every row of every layer,
one activation at a time, against the rule of ``contracts/capture_check.py`` (all zeros,
non-finite, repeated across different tokens); counts per reason and the first keys.

```python
audit = RowAudit(layer_ids=reader.layer_ids)
for key, acts, token_ids in ...:        # acts (layers, rows, hidden) as stored
    audit.add(key, acts, token_ids)     # token_ids of the rows, or None (constant test skipped)
audit.report()   # {"ok", "activations", "rows", "reasons": {reason: {"activations", "rows",
                 #   "first_keys"}}}
format_row_audit(audit.report())
```
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hallulog.contracts.capture_check import REASONS, check_rows

__all__ = ["RowAudit", "format_row_audit", "FIRST_KEYS"]

#: keys listed per reason
FIRST_KEYS = 5


class RowAudit:
    """Accumulates the capture check of the activations handed to :meth:`add`."""

    def __init__(self, layer_ids: Sequence[int]) -> None:
        self.layer_ids = [int(x) for x in layer_ids]
        self.activations = 0
        self.rows = 0
        self.reasons: dict[str, dict] = {
            r: {"activations": 0, "rows": 0, "first_keys": []} for r in REASONS
        }

    def add(self, key: str, acts: np.ndarray, token_ids: np.ndarray | None) -> None:
        """Check one stored activation ``(layers, rows, hidden)``."""
        self.activations += 1
        self.rows += acts.shape[0] * acts.shape[1]
        for fault in check_rows(acts, layer_ids=self.layer_ids, token_ids=token_ids):
            entry = self.reasons[fault.reason]
            entry["activations"] += 1
            entry["rows"] += fault.rows
            if len(entry["first_keys"]) < FIRST_KEYS:
                entry["first_keys"].append(
                    {"activation_key": key, "layer_id": fault.layer_id, "row": fault.row}
                )

    def report(self) -> dict:
        return {
            "ok": not any(e["activations"] for e in self.reasons.values()),
            "activations": self.activations,
            "rows": self.rows,
            "reasons": self.reasons,
        }


def format_row_audit(report: dict) -> str:
    """One line, plus one per reason found."""
    head = (
        f"capture check: {report['activations']} activations, {report['rows']} rows (every layer): "
    )
    found = {r: e for r, e in report["reasons"].items() if e["activations"]}
    if not found:
        return head + "OK (" + ", ".join(f"0 {r}" for r in report["reasons"]) + ")"
    lines = [head + ", ".join(f"{e['activations']} {r}" for r, e in found.items())]
    for reason, entry in found.items():
        keys = ", ".join(
            f"{k['activation_key']} (layer {k['layer_id']}, row {k['row']})"
            for k in entry["first_keys"]
        )
        lines.append(
            f"  {reason}: {entry['activations']} activation(s), {entry['rows']} row(s); "
            f"first: {keys}"
        )
    return "\n".join(lines)
