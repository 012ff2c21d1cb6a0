"""Import saev head's own reader modules from a source checkout (no saev code lives in this repo).

saev head (github.com/OSU-NLP-Group/saev, ``src/saev``) needs Python >= 3.12 to install and is
not on PyPI (PyPI's saev 0.1.0 is the 2025 ``saev.activations`` layout). Its readers —
``saev.data.shards`` (``Metadata``, ``ShardInfo``, ``IndexMap``), ``saev.data.indexed``,
``saev.data.ordered``, ``saev.data.shuffled`` — run on 3.11 with beartype, jaxtyping, einops,
orjson, torch (on 3.11 once ``multiprocessing.queues.Queue`` is made subscriptable, as
3.12 has it). ``saev/data/__init__.py`` imports every vision model family and
``saev/data/datasets.py`` needs torchvision; the readers use neither, so both are bypassed:
``saev.data`` is registered as a bare package and ``saev.data.datasets`` as a module holding
the two class names ``shards.py`` annotates with.

Set ``HALLULOG_SAEV_SRC`` to the checkout's ``src`` directory (and put orjson on the path).
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing.queues as mpq
import os
import sys
import types

ENV = "HALLULOG_SAEV_SRC"


def load_saev_head(src: str | None = None) -> types.SimpleNamespace:
    """``shards``, ``indexed``, ``ordered``, ``shuffled`` modules of the saev checkout at ``src``."""
    src = src or os.environ[ENV]
    # Python 3.11 shim: saev annotates with ``multiprocessing.queues.Queue[...]``, subscriptable from 3.12
    if not hasattr(mpq.Queue, "__class_getitem__"):
        mpq.Queue.__class_getitem__ = classmethod(types.GenericAlias)
    if "saev" not in sys.modules:  # the package from the checkout, by its location
        init = os.path.join(src, "saev", "__init__.py")
        spec = importlib.util.spec_from_file_location(
            "saev", init, submodule_search_locations=[os.path.dirname(init)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["saev"] = module
        spec.loader.exec_module(module)
    if "saev.data" not in sys.modules:
        pkg = types.ModuleType("saev.data")
        pkg.__path__ = [os.path.join(src, "saev", "data")]
        sys.modules["saev.data"] = pkg
        ds = types.ModuleType("saev.data.datasets")

        class DatasetConfig:  # annotation targets only; never instantiated by the readers
            pass

        ds.DatasetConfig = ds.Config = DatasetConfig
        ds.is_img_seg_dataset = lambda cfg: False
        sys.modules["saev.data.datasets"] = ds
        pkg.datasets = ds
    return types.SimpleNamespace(
        **{
            m: importlib.import_module(f"saev.data.{m}")
            for m in ("shards", "indexed", "ordered", "shuffled")
        }
    )
