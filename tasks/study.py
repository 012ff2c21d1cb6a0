"""A study's dataset and prompt choices, and the prompt groups they make.

The four original tasks (triviaqa and the HalluLens ones) have loaders of their own; the presets
(``nq_open``, ``squad``, ...) and the generic ``qa`` task read records through
``hallulog.tasks.presets`` / ``hallulog.tasks.qa``. Every task's prompt can be replaced
by a Jinja2 template, a system prompt, few-shot examples and the chat template on or off
(``hallulog.tasks.prompting``)::

    study = Study(fewshot_k=2, fewshot_path="train.jsonl")   # a run's: RunConfig.task_spec()
    spec = study.prompt_spec("nq_open", fewshot_records)
    groups = study_groups("nq_open", path, study, spec, split="dev", limit=None, collector=c)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hallulog.contracts.prompt_group import PromptGroup
from hallulog.tasks.base import MalformedCollector
from hallulog.tasks.presets import PRESETS, iter_preset_records
from hallulog.tasks.prompting import (
    TRIVIAQA_TEMPLATE,
    PromptSpec,
    RenderedPrompt,
    choose_fewshot,
    load_template_source,
)
from hallulog.tasks.qa import FieldMapping, QAOptions, QARecord, iter_qa_records

__all__ = [
    "Study",
    "check_study",
    "study_groups",
    "rerender",
    "QA_TASK",
    "STUDY_TASKS",
    "builtin_fields",
    "default_answer_kind",
]

QA_TASK = "qa"
#: Tasks whose records come from the preset/mapping layer (not a loader of their own).
STUDY_TASKS: tuple[str, ...] = (*PRESETS, QA_TASK)

#: The generic task's template when none is given (the TriviaQA prompt).
QA_TEMPLATE = TRIVIAQA_TEMPLATE
QA_CONTEXT_TEMPLATE = (
    "Answer the question with a short answer, using the passage.\n"
    "Passage: {{ context }}\nQuestion: {{ question }}\nAnswer:"
)
QA_DEFAULT_SPLIT = "test"

_MAPPING_FLAGS = {
    "question_field": "question",
    "answers_field": "answers",
    "id_field": "id",
    "context_field": "context",
    "choices_field": "choices",
}
_BUILTIN_KINDS = {
    "triviaqa": "aliases",
    "precisewikiqa": "judge",
    "longwiki": "judge",
    "mixedentities": "judge",
}


def default_answer_kind(task: str) -> str:
    """The answer kind a task grades by when ``--answer-kind`` is not given."""
    if task in _BUILTIN_KINDS:
        return _BUILTIN_KINDS[task]
    if task in PRESETS:
        return PRESETS[task].answer_kind
    return "aliases"


@dataclass(frozen=True)
class Study:
    """How a task's records become prompts: the field mapping, the answer kind, the template,
    few-shot examples, chat or completion. Each field is the value of the flag of the same name
    (a run's study is made from its config, ``RunConfig.task_spec``); the defaults are the
    task's own prompt."""

    task_format: str = "auto"
    records_key: str | None = None
    question_field: str | None = None
    answers_field: str | None = None
    id_field: str | None = None
    context_field: str | None = None
    choices_field: str | None = None
    answer_kind: str | None = None
    numeric_tolerance: float = 1e-6
    with_context: bool = False
    prompt_template: str | None = None
    prompt_template_file: str | None = None
    system_prompt: str | None = None
    fewshot_path: str | None = None
    fewshot_k: int = 0
    chat: bool = True
    seed: int = 0

    @property
    def custom_prompt(self) -> bool:
        """Whether anything replaces a task's own prompt."""
        return (
            self.prompt_template is not None
            or self.prompt_template_file is not None
            or self.system_prompt is not None
            or self.fewshot_k > 0
            or not self.chat
            or self.with_context
        )

    def check_for(self, task: str) -> None:
        """Refuse flags the task cannot use (one line naming the flag)."""
        if task != QA_TASK:
            given = [f"--{k.replace('_', '-')}" for k in _MAPPING_FLAGS if getattr(self, k)]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: the field mapping applies to --task qa "
                    f"(task {task!r} reads its own layout)"
                )
        if task in _BUILTIN_KINDS and self.answer_kind not in (None, _BUILTIN_KINDS[task]):
            raise ValueError(
                f"--answer-kind {self.answer_kind}: task {task!r} is graded by "
                f"{_BUILTIN_KINDS[task]}"
            )

    def answer_kind_for(self, task: str) -> str:
        return self.answer_kind or default_answer_kind(task)

    def qa_options(self, split: str | None) -> QAOptions:
        mapping = FieldMapping(
            **{dst: getattr(self, src) for src, dst in _MAPPING_FLAGS.items() if getattr(self, src)}
        )
        return QAOptions(
            mapping=mapping,
            answer_kind=self.answer_kind or "aliases",
            numeric_tolerance=self.numeric_tolerance,
            fmt=self.task_format,
            records_key=self.records_key,
            split=split,
        )

    def default_template(self, task: str) -> str:
        """The task's own template (its context template with ``with_context``)."""
        if task in PRESETS:
            preset = PRESETS[task]
            try:
                preset.check_kind(self.answer_kind or preset.answer_kind)
            except ValueError as exc:
                raise ValueError(f"--answer-kind: {exc}") from None
            try:
                return preset.template_for(self.answer_kind, self.with_context)
            except ValueError as exc:
                raise ValueError(f"--with-context: {exc}") from None
        if task == QA_TASK:
            if self.with_context and not self.context_field:
                raise ValueError("--with-context with --task qa needs --context-field")
            return QA_CONTEXT_TEMPLATE if self.with_context else QA_TEMPLATE
        if self.with_context:
            raise ValueError(
                f"--with-context: task {task!r} has no context template; write "
                "one with --prompt-template"
            )
        # the HalluLens tasks send their question as is
        return TRIVIAQA_TEMPLATE if task == "triviaqa" else "{{ question }}"

    def prompt_spec(self, task: str, fewshot: Iterable[Mapping[str, Any]] = ()) -> PromptSpec:
        """The prompt of ``task`` under this study (few-shot drawn from ``fewshot``)."""
        source, origin = load_template_source(
            self.prompt_template, self.prompt_template_file, self.default_template(task)
        )
        examples = choose_fewshot(fewshot, self.fewshot_k, self.seed) if self.fewshot_k else []
        return PromptSpec(
            template=source,
            system_prompt=self.system_prompt,
            fewshot=tuple(examples),
            chat=self.chat,
            origin=origin,
            fewshot_origin=self.fewshot_path or "--fewshot-path",
        )


def default_split(task: str) -> str:
    return PRESETS[task].default_split if task in PRESETS else QA_DEFAULT_SPLIT


def iter_records(
    task: str,
    path: str | Path,
    study: Study,
    *,
    split: str | None,
    limit: int | None,
    collector: MalformedCollector,
) -> Iterator[QARecord]:
    """The records of a preset or ``qa`` file, in file order."""
    if task == QA_TASK:
        return iter_qa_records(path, study.qa_options(split), limit=limit, collector=collector)
    return iter_preset_records(
        task,
        path,
        split=split,
        limit=limit,
        collector=collector,
        with_context=study.with_context,
        numeric_tolerance=study.numeric_tolerance,
        answer_kind=study.answer_kind,
        fmt=study.task_format,
        records_key=study.records_key,
    )


def study_groups(
    task: str,
    path: str | Path,
    study: Study,
    spec: PromptSpec,
    *,
    split: str | None,
    limit: int | None,
    collector: MalformedCollector,
) -> Iterator[PromptGroup]:
    """The prompt groups of a preset or ``qa`` file: each record rendered by ``spec``. A record
    the template cannot render stops the read with an error naming file, line and field."""
    the_split = split or default_split(task)
    for rec in iter_records(task, path, study, split=split, limit=limit, collector=collector):
        rendered = _render(
            spec,
            rec.fields,
            path,
            rec.line if rec.line is not None else rec.index + 1,
            rec.line is None,
        )
        yield PromptGroup.create(
            task,
            the_split,
            rec.dataset_id,
            rendered.messages or [],
            reference=rec.reference,
            meta=rec.meta,
            prompt=rendered.prompt,
        )


def builtin_fields(group: PromptGroup) -> dict[str, Any]:
    """Template fields of a group of the original tasks (their records' question and
    reference), so a study can give them another prompt."""
    ref = group.reference if isinstance(group.reference, dict) else {}
    return {
        "question": group.meta.get("question", ""),
        "context": ref.get("document"),
        "choices": None,
        "choices_text": None,
        "letters": None,
        "answer": ref.get("value"),
        "record": dict(group.meta),
    }


def rerender(
    groups: Iterable[PromptGroup], spec: PromptSpec, path: str | Path
) -> Iterator[PromptGroup]:
    """The groups of an original task with their prompt made by ``spec`` instead."""
    for number, group in enumerate(groups, start=1):
        rendered = _render(spec, builtin_fields(group), path, number, True)
        yield PromptGroup.create(
            group.dataset,
            group.split,
            group.dataset_id,
            rendered.messages or [],
            reference=group.reference,
            meta=group.meta,
            prompt=rendered.prompt,
        )


def _render(
    spec: PromptSpec,
    fields: Mapping[str, Any],
    path: str | Path,
    where: int,
    is_record_number: bool,
) -> RenderedPrompt:
    # line-less formats (Parquet, a datasets directory, a JSON document's items) name the
    # record by its 1-based number
    label = f"{path} (record {where})" if is_record_number else str(path)
    return spec.render(fields, where=(label, where))


def check_study(task: str, task_path: str | None, study: Study) -> None:
    """A task's dataset and prompt choices fit it (checked before any file is read);
    :class:`~hallulog.contracts.errors.ConfigError` naming the flag otherwise."""
    from hallulog.contracts.errors import ConfigError

    if task == QA_TASK and task_path is None:
        raise ConfigError(
            "--task qa has no bundled sample: pass --task-path (and the field "
            "mapping flags, docs/tasks.md)"
        )
    try:
        study.check_for(task)
        study.default_template(task)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
