"""vLLM's reasoning parser for a run: ``--reasoning-parser`` resolved against the model and the
installed vLLM (docs/reasoning.md)."""

from __future__ import annotations

from hallulog.contracts.errors import ConfigError

__all__ = ["AUTO_REASONING_PARSERS", "installed_reasoning_parsers", "vllm_reasoning_parser"]

#: ``--reasoning-parser auto``: the parser of each ``model_type`` vLLM 0.32 has one for, used
#: when the tokenizer has the think tokens (the DeepSeek-R1 distills are ``qwen2``/``llama``
#: models: give ``--reasoning-parser deepseek_r1``)
AUTO_REASONING_PARSERS: dict[str, str] = {"qwen3": "qwen3", "qwen3_moe": "qwen3"}


def installed_reasoning_parsers() -> frozenset[str] | None:
    """The reasoning parsers the installed vLLM registers, or None when vLLM is not installed
    here (the servers may run elsewhere: the name is then passed on unchecked)."""
    try:
        from vllm.reasoning import ReasoningParserManager
    except ImportError:
        return None
    return frozenset(ReasoningParserManager.list_registered())


def vllm_reasoning_parser(choice: str, *, model_type: str, has_think_tokens: bool) -> str | None:
    """The parser vLLM starts with for ``choice`` (``auto``, ``none`` or a name) on a model of
    ``model_type``; None: no parser. A name the installed vLLM lacks raises ConfigError."""
    if choice == "none":
        return None
    if choice == "auto":
        return AUTO_REASONING_PARSERS.get(model_type) if has_think_tokens else None
    known = installed_reasoning_parsers()
    if known is not None and choice not in known:
        raise ConfigError(
            f"--reasoning-parser {choice}: not a reasoning parser of the installed vLLM; "
            f"choose auto, none or one of {', '.join(sorted(known))}"
        )
    return choice
