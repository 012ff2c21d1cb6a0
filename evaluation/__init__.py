"""``orchestrator evaluate``: every detector of seed 003 scored from a run's artifacts, a
report (json, md, png), and the alignment audit of ``--validate-only --deep``.

Reads only ``consolidated/`` and the activation store (through ``storage``), never the server.
Definitions and deviations: docs/evaluation.md; the audit: docs/alignment.md.
"""

from .cli import add_evaluate_parser, report_path, run_deep_audit, run_evaluate

__all__ = ["add_evaluate_parser", "run_evaluate", "run_deep_audit", "report_path"]
