"""The inference servers a run talks to: the backend type (``backends/base.py``) and one module
per kind (``backends/embedded.py``, ``backends/vllm.py``), chosen by name in
``backends/registry.py``; their processes (spawn, health, stop), ports and the model they serve.
Nothing here imports the config: a :class:`ServerSpec` (built by the run plan) is the input."""

from hallulog.backends.base import Backend, ServerSpec
from hallulog.backends.engine import EngineOptions
from hallulog.backends.registry import BACKENDS, backend_for

__all__ = ["Backend", "ServerSpec", "EngineOptions", "BACKENDS", "backend_for"]
