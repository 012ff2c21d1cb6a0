"""The chat template's options of a run: ``--chat-template-kwargs`` and ``--thinking``.

Both the embedded server (``apply_chat_template(..., **kwargs)``) and vLLM (the chat request's
``chat_template_kwargs`` field) pass these keyword arguments to the model's chat template.

The rule when both flags are given: ``--thinking on``/``off`` sets ``enable_thinking`` to
true/false in the kwargs of ``--chat-template-kwargs``; when those already hold an
``enable_thinking`` that says otherwise, the configuration is refused (one line naming both
flags). ``--thinking auto`` adds nothing: the template's own default decides (Qwen3: thinking
on). docs/reasoning.md.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["THINKING_KEY", "parse_template_kwargs", "template_kwargs"]

THINKING_KEY = "enable_thinking"
"""The template variable ``--thinking`` sets (Qwen3's; DeepSeek-R1 distills and gpt-oss ignore
it: their templates think always)."""

_THINKING = {"on": True, "off": False, "auto": None}


def parse_template_kwargs(text: str | None) -> dict[str, Any]:
    """The JSON object of ``--chat-template-kwargs`` (empty for None); ValueError with one line
    naming the flag otherwise."""
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"--chat-template-kwargs: not valid JSON ({exc.msg} at character "
            f"{exc.pos}): {text!r}; give an object such as "
            "'{\"enable_thinking\": false}'"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"--chat-template-kwargs: a JSON object is needed, got {type(value).__name__} {text!r}"
        )
    return value


def template_kwargs(text: str | None, thinking: str = "auto") -> dict[str, Any]:
    """The keyword arguments passed to the chat template: ``--chat-template-kwargs`` with
    ``--thinking`` applied (the module's rule); ValueError naming the flags when they
    disagree or ``thinking`` is not on/off/auto."""
    if thinking not in _THINKING:
        raise ValueError(f"--thinking: {thinking!r} is not one of on, off, auto")
    kwargs = parse_template_kwargs(text)
    wanted = _THINKING[thinking]
    if wanted is None:
        return kwargs
    if THINKING_KEY in kwargs and kwargs[THINKING_KEY] != wanted:
        raise ValueError(
            f"--thinking {thinking} disagrees with --chat-template-kwargs "
            f"{THINKING_KEY}={json.dumps(kwargs[THINKING_KEY])}: give one of them"
        )
    return {**kwargs, THINKING_KEY: wanted}
