"""Prompts as data: a Jinja2 template, an optional system prompt, few-shot examples, chat or not.

A :class:`PromptSpec` turns a record's template fields (``question``, ``context``, ``choices``,
``choices_text``, ``letters``, ``record``, ...) into what the worker sends: chat messages for
``/v1/chat/completions`` or one text for ``/v1/completions`` (``chat=False``). The assembly
rules are in docs/tasks.md ("Prompt templates"). Templates run in Jinja2's sandbox with
``StrictUndefined``; a field the template prints that the record lacks, or holds as ``None``,
is a :class:`PromptFieldError` naming the record, never a prompt saying "Context: None".
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from hallulog.contracts.errors import HallulogError
from hallulog.tasks.base import DatasetFormatError
from jinja2.sandbox import SandboxedEnvironment

__all__ = [
    "PromptSpec",
    "RenderedPrompt",
    "PromptFieldError",
    "PromptTemplateError",
    "TRIVIAQA_TEMPLATE",
    "check_template",
    "choose_fewshot",
    "load_template_source",
]

#: triviaqa's prompt as a template: byte-identical to ``triviaqa.build_prompt``
TRIVIAQA_TEMPLATE = (
    "Answer the question with a short answer.\nQuestion: {{ question | trim }}\nAnswer:"
)

#: the flag that fills a template field, for the error's hint
_FIELD_FLAGS = {
    "question": "--question-field",
    "context": "--context-field",
    "choices": "--choices-field",
    "choices_text": "--choices-field",
    "letters": "--choices-field",
    "answer": "--answers-field",
}


class PromptTemplateError(HallulogError, ValueError):
    """A template that cannot be used (syntax error, unreadable file); one line naming its
    origin (the file, or ``--prompt-template``) and the line."""


class PromptFieldError(DatasetFormatError):
    """The template needs a field this record lacks (or holds as ``None``)."""


class _FieldError(jinja2.UndefinedError):
    """Raised inside rendering; :meth:`PromptSpec.render` turns it into a PromptFieldError."""


def _field_message(name: str, state: str) -> str:
    flag = _FIELD_FLAGS.get(name)
    hint = f"set {flag}, or use a template without it" if flag else "use a template without it"
    return f'template field "{name}" is {state} for this record ({hint})'


class _Missing(jinja2.StrictUndefined):
    """A field the record lacks: any use but ``is defined`` / ``default`` is an error."""

    __slots__ = ()

    def __init__(
        self,
        hint: str | None = None,
        obj: Any = jinja2.utils.missing,
        name: str | None = None,
        exc: type[Exception] = jinja2.UndefinedError,
    ) -> None:
        # the sandbox passes SecurityError; a plain undefined becomes a _FieldError
        super().__init__(hint, obj, name, _FieldError if exc is jinja2.UndefinedError else exc)

    @property
    def _undefined_message(self) -> str:
        if self._undefined_hint is not None:  # e.g. the sandbox refusing an attribute
            return super()._undefined_message
        if self._undefined_obj is jinja2.utils.missing:
            return _field_message(str(self._undefined_name), "undefined")
        return f"prompt template: {super()._undefined_message}"  # {{ record.missing_key }}


class _NoneField(_Missing):
    """A field that is ``None``: falsy, empty when iterated, an error when printed."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __iter__(self):  # type: ignore[override]
        return iter(())

    def __len__(self) -> int:
        return 0

    @property
    def _undefined_message(self) -> str:
        return _field_message(str(self._undefined_name), "None")


def _finalize(value: Any) -> Any:
    if value is None:  # a nested value such as {{ record.extra }}
        raise _FieldError(
            "a template expression is None for this record (guard it with "
            "{% if ... %} or | default(...))"
        )
    return value


_ENV = SandboxedEnvironment(
    undefined=_Missing, keep_trailing_newline=False, autoescape=False, finalize=_finalize
)


@functools.lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


def check_template(source: str, origin: str = "--prompt-template") -> jinja2.Template:
    """The compiled template; a syntax error is a one-line :class:`PromptTemplateError`."""
    try:
        return _compile(source)
    except jinja2.TemplateSyntaxError as exc:
        raise PromptTemplateError(
            f"prompt template {origin}: line {exc.lineno}: {exc.message}"
        ) from None


def _render(template: jinja2.Template, fields: Mapping[str, Any], where: tuple[str, int]) -> str:
    context = {k: _NoneField(name=k) if v is None else v for k, v in fields.items()}
    try:
        return template.render(context)
    except _FieldError as exc:
        raise PromptFieldError(where[0], where[1], str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a filter or sandbox error on this record's data
        raise PromptFieldError(
            where[0],
            where[1],
            f"the prompt template failed on this record: {type(exc).__name__}: {exc}",
        ) from None


@dataclass(frozen=True)
class RenderedPrompt:
    """What one record sends: ``messages`` (chat) or ``prompt`` (completions); the other None."""

    messages: list[dict[str, str]] | None
    prompt: str | None


@dataclass(frozen=True)
class PromptSpec:
    """The whole prompt of a run: template, system prompt, few-shot examples, chat flag.

    ``fewshot`` holds the chosen examples' template fields plus ``answer``, the reference
    answer text that follows each. The template is checked and the examples rendered once, at
    construction (errors name ``origin`` and ``fewshot_origin``).
    """

    template: str
    """Jinja2 source."""
    system_prompt: str | None = None
    fewshot: tuple[Mapping[str, Any], ...] = ()
    chat: bool = True
    origin: str = field(default="--prompt-template", compare=False)
    """Where the template came from (a file path or ``--prompt-template``), for errors."""
    fewshot_origin: str = field(default="--fewshot-path", compare=False)
    """Where the examples came from, for errors (the line is the example's 1-based number)."""
    _shots: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        template = check_template(self.template, self.origin)
        shots = []
        for n, example in enumerate(self.fewshot, 1):
            answer = example.get("answer")
            if answer is None:
                raise PromptFieldError(
                    self.fewshot_origin, n, f"few-shot example {n} has no answer"
                )
            shots.append((_render(template, example, (self.fewshot_origin, n)), str(answer)))
        object.__setattr__(self, "_shots", tuple(shots))

    def render(
        self, fields: Mapping[str, Any], *, where: tuple[str, int] = ("<record>", 0)
    ) -> RenderedPrompt:
        """The prompt for one record; ``where`` (file, line or record number) names it in a
        :class:`PromptFieldError`."""
        text = _render(_compile(self.template), fields, where)
        if self.chat:
            messages = (
                [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            )
            for shot, answer in self._shots:
                messages += [
                    {"role": "user", "content": shot},
                    {"role": "assistant", "content": answer},
                ]
            messages.append({"role": "user", "content": text})
            return RenderedPrompt(messages=messages, prompt=None)
        head = f"{self.system_prompt}\n\n" if self.system_prompt else ""
        shots = "".join(f"{shot} {answer}\n\n" for shot, answer in self._shots)
        return RenderedPrompt(messages=None, prompt=head + shots + text)

    @functools.cached_property
    def text(self) -> str:
        """Canonical text of the spec: sorted-key compact JSON of the template, the system
        prompt, the rendered examples with their answers and the chat flag."""
        return json.dumps(
            {
                "template": self.template,
                "system_prompt": self.system_prompt or None,
                "fewshot": [{"prompt": s, "answer": a} for s, a in self._shots],
                "chat": self.chat,
            },
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @functools.cached_property
    def hash(self) -> str:
        """sha256 hex of :attr:`text` (the manifest's ``prompt_template_hash``)."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def choose_fewshot(
    records: Iterable[Mapping[str, Any]], k: int, seed: int
) -> list[Mapping[str, Any]]:
    """``k`` records drawn uniformly by reservoir sampling with ``random.Random(seed)``, in
    their file order; all of them when there are fewer. Streams: holds only ``k`` records."""
    if k <= 0:
        return []
    rng = random.Random(seed)
    chosen: list[tuple[int, Mapping[str, Any]]] = []
    for i, record in enumerate(records):
        if i < k:
            chosen.append((i, record))
        else:
            j = rng.randrange(i + 1)
            if j < k:
                chosen[j] = (i, record)
    chosen.sort(key=lambda pair: pair[0])
    return [record for _, record in chosen]


def load_template_source(inline: str | None, file: str | None, default: str) -> tuple[str, str]:
    """``(source, origin)``: the inline template, else the file's text, else ``default``."""
    if inline is not None and file is not None:
        raise PromptTemplateError("give --prompt-template or --prompt-template-file, not both")
    if inline is not None:
        return inline, "--prompt-template"
    if file is None:
        return default, "the task's default template"
    try:
        return Path(file).read_text(encoding="utf-8"), file
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PromptTemplateError(f"--prompt-template-file {file}: cannot read it: {why}") from None
