"""Packages the embedded server's process keeps out of its memory.

transformers imports scikit-learn whenever it is installed, for the candidate heuristics of
assisted generation (``transformers.generation.candidate_generator``, reached from
``AutoModelForCausalLM``), and scikit-learn brings pandas, pyarrow and more of scipy: ~110 MB
resident (``bench/bench_memory.py``; docs/serving.md) in a process that never generates with an
assistant model. hallulog installs scikit-learn for its detectors, so every embedded server
would pay for it.

A ``None`` entry in ``sys.modules`` is Python's own way to say a package is absent: an import
of it raises ``ImportError`` and ``importlib.util.find_spec`` (transformers' availability check)
returns ``None``. The entry is checked at once against the import that needs it today; should a
transformers release import a kept-out package unconditionally, the entry is withdrawn and the
package loads as usual (one log line says so).
"""

from __future__ import annotations

import importlib
import logging
import sys

__all__ = ["UNUSED_PACKAGES", "keep_out_unused_packages"]

logger = logging.getLogger(__name__)

UNUSED_PACKAGES = ("sklearn",)
# the transformers modules that reach for UNUSED_PACKAGES when they are installed
_IMPORTERS = ("transformers.generation.candidate_generator",)


def keep_out_unused_packages() -> tuple[str, ...]:
    """Mark each of ``UNUSED_PACKAGES`` absent unless it is already imported, and import the
    transformers modules that would load them. Returns the packages kept out (none when
    transformers needs them after all). Call before anything imports transformers."""
    kept_out = tuple(name for name in UNUSED_PACKAGES if name not in sys.modules)
    for name in kept_out:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        for module in _IMPORTERS:
            importlib.import_module(module)
    except ImportError as error:
        if error.name not in kept_out:
            raise
        _withdraw(kept_out)
        logger.info("transformers imports %s unconditionally: loaded as usual", error.name)
        return ()
    return kept_out


def _withdraw(names: tuple[str, ...]) -> None:
    for name in names:
        if sys.modules.get(name, ...) is None:
            del sys.modules[name]
