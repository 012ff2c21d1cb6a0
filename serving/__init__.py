"""hallulog's embedded OpenAI-compatible inference server (``hallulog serve``).

Thin HTTP (``app``) over a batching engine (``engine``) on transformers, with vLLM-compatible
hidden-state capture (``capture``). Other packages use ``default_model_dir()`` to get the plain
safetensors directory of the default model (SmolLM2-135M-Instruct), converting it on first call.
"""

import os

# oneDNN and torch's glue to it (ideep) keep a compiled matrix product per input shape, ~0.7 MB
# each, 1,024 of each by default; a step's row count changes every few steps, so the caches grew
# by 150-220 MB over 48 questions of the default job, at no measurable speed against 32 each
# (docs/serving.md, "Memory"). Read once, when torch loads: set before it.
for _cache in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
    os.environ.setdefault(_cache, "32")
# An engine with several intra-op threads (a light load: engine_pool) on a CPU shared with other
# processes: OpenMP threads that spin while they wait for a descheduled peer made a step ~10x
# slower; sleeping ones do not. Read once, when torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from hallulog.serving.config import ServerConfig  # noqa: E402
from hallulog.serving.model_loader import DEFAULT_MODEL_NAME, default_model_dir  # noqa: E402

__all__ = ["DEFAULT_MODEL_NAME", "ServerConfig", "default_model_dir"]
