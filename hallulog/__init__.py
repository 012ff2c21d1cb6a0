"""hallulog's public Python face: what user code imports.

The packages beside it (``orchestrator``, ``workers``, ``storage``, ``evaluation``, ``contracts``)
are the implementation; their names may move between releases, this package's names do not.
The command line is ``hallulog run …`` (the same as ``python -m orchestrator run …``).
"""

from __future__ import annotations

from hallulog.run import RunView, open_run

__all__ = ["__version__", "open_run", "RunView"]

__version__ = "0.1.0"
