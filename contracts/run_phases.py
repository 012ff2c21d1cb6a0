"""The phases a run goes through, in order: what the status board reports and ``/metrics``
exports as ``hallulog_phase``.

Only :mod:`contracts` may be imported here.
"""

from __future__ import annotations

__all__ = ["RUN_PHASES"]

RUN_PHASES = (
    "starting",
    "running",
    "labeling",
    "consolidating",
    "exporting",
    "attention",
    "done",
    "failed",
)
"""``attention`` is the pass of ``--attention-features`` after the post-run pipeline."""
