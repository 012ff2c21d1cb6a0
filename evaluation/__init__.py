"""``orchestrator evaluate``: every detector one pass allows scored from a run's artifacts
with the field's metrics, a report (json, md, png) and per-prompt scores (parquet); ``import``
(answers produced elsewhere as a run root); the alignment audit of ``validate --deep``.

Reads only ``consolidated/`` and the activation store (through ``storage``), never the server.
Definitions and deviations: docs/evaluation.md; the audit: docs/alignment.md.
"""

from hallulog.evaluation.cli import add_evaluate_parser, report_path, run_deep_audit, run_evaluate
from hallulog.evaluation.importer import add_import_parser, run_import

__all__ = [
    "add_evaluate_parser",
    "run_evaluate",
    "run_deep_audit",
    "report_path",
    "add_import_parser",
    "run_import",
]
