"""LM-Polygraph's own metric and estimator modules, loaded without its package ``__init__``.

``import lm_polygraph`` imports every estimator, model wrapper and NLI calculator (torch,
transformers, spacy: about 20 s of CPU). The metric modules (``lm_polygraph.ue_metrics.*``)
need only numpy and scikit-learn, and the text estimators numpy, scipy and rouge-score; the
estimators' base class imports ``lm_polygraph.utils.common`` (transformers). Here the packages
``lm_polygraph``, ``lm_polygraph.ue_metrics``, ``lm_polygraph.estimators`` and
``lm_polygraph.utils`` are registered as bare namespaces over the installed directories, so
that importing one module runs that module's real code (and its own imports) only.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

__all__ = ["ue_metric", "estimator", "stat_calculator"]

_SUBPACKAGES = ("ue_metrics", "estimators", "utils", "stat_calculators")


def _root() -> Path:
    spec = importlib.util.find_spec("lm_polygraph")
    if spec is None or spec.origin is None:
        pytest.skip(
            "lm-polygraph is not installed (pip install -c <(echo torch==2.13.0) "
            "lm-polygraph; the dev extra has it)"
        )
    return Path(spec.origin).parent


def _register() -> None:
    mod = sys.modules.get("lm_polygraph")
    if mod is not None and getattr(mod, "__hallulog_bare__", False):
        return
    root = _root()
    for name, path in [("lm_polygraph", root)] + [
        (f"lm_polygraph.{s}", root / s) for s in _SUBPACKAGES
    ]:
        if name in sys.modules and not getattr(sys.modules[name], "__hallulog_bare__", False):
            continue  # the real package is already imported: use it
        m = types.ModuleType(name)
        m.__path__ = [str(path)]
        m.__hallulog_bare__ = True
        sys.modules[name] = m


def ue_metric(module: str):
    """``lm_polygraph.ue_metrics.<module>``."""
    _register()
    return importlib.import_module(f"lm_polygraph.ue_metrics.{module}")


def estimator(module: str):
    """``lm_polygraph.estimators.<module>`` (imports transformers through the base class)."""
    _register()
    return importlib.import_module(f"lm_polygraph.estimators.{module}")


def stat_calculator(module: str):
    """``lm_polygraph.stat_calculators.<module>`` (imports transformers and torch)."""
    _register()
    return importlib.import_module(f"lm_polygraph.stat_calculators.{module}")
