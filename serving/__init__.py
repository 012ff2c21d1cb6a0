"""hallulog's embedded OpenAI-compatible inference server (``hallulog serve``).

Thin HTTP (``app``) over a batching engine (``engine``) on transformers, with vLLM-compatible
hidden-state capture (``capture``). Other packages use ``default_model_dir()`` to get the plain
safetensors directory of the default model (SmolLM2-135M-Instruct), converting it on first call.
"""

from hallulog.serving.config import ServerConfig
from hallulog.serving.model_loader import DEFAULT_MODEL_NAME, default_model_dir

__all__ = ["DEFAULT_MODEL_NAME", "ServerConfig", "default_model_dir"]
