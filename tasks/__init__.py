"""Task loaders: dataset files → :class:`~hallulog.contracts.prompt_group.PromptGroup` lists.

```python
from hallulog.tasks import load_task, TASKS
data = load_task("triviaqa")                   # the bundled sample
data = load_task("triviaqa", "unfiltered-web-dev.json", limit=1000)
data.groups, data.source, data.prompt_template, data.malformed
stream = open_task("triviaqa", "train.jsonl")  # the same file read lazily, as often as needed
for group in stream.groups(): ...
stream = open_task_spec(TaskSpec("nq_open", "nq.jsonl", limit=100))   # a run's (its plan's)
```

Formats, fields and id rules: docs/tasks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hallulog.contracts.prompt_group import PromptGroup
from hallulog.tasks import hallulens, triviaqa
from hallulog.tasks.base import (
    DatasetFormatError,
    FileKindError,
    MalformedCollector,
    MalformedLine,
    TaskData,
)
from hallulog.tasks.layout_hints import layout_hint
from hallulog.tasks.presets import PRESETS
from hallulog.tasks.prompting import PromptSpec
from hallulog.tasks.shards import ShardSpec, parse_shard, select_shard
from hallulog.tasks.spec import TaskSpec
from hallulog.tasks.study import (
    QA_TASK,
    STUDY_TASKS,
    Study,
    builtin_fields,
    iter_records,
    rerender,
    study_groups,
)

__all__ = [
    "load_task",
    "open_task",
    "open_task_spec",
    "TaskSpec",
    "TaskStream",
    "TaskData",
    "MalformedLine",
    "DatasetFormatError",
    "FileKindError",
    "TASKS",
    "BUNDLED_SAMPLES",
    "bundled_path",
    "Study",
]

DATA_DIR = Path(__file__).resolve().parent / "data"

BUNDLED_SAMPLES: dict[str, str] = {
    "triviaqa": "triviaqa-sample-dev.json",
    "precisewikiqa": "precisewikiqa-sample.jsonl",
    "longwiki": "longwiki-sample.jsonl",
    "mixedentities": "mixedentities-sample.jsonl",
}

_LOADERS: dict[str, tuple[Callable[..., Iterator[PromptGroup]], str]] = {
    "triviaqa": (triviaqa.iter_groups, triviaqa.PROMPT_TEMPLATE),
    "precisewikiqa": (hallulens.iter_precisewikiqa, hallulens.QA_PROMPT_TEMPLATE),
    "longwiki": (hallulens.iter_longwiki, hallulens.QA_PROMPT_TEMPLATE),
    "mixedentities": (hallulens.iter_mixedentities, hallulens.MIXED_PROMPT_TEMPLATE),
}

BUNDLED_SAMPLES.update({name: preset.bundled_sample for name, preset in PRESETS.items()})

TASKS: tuple[str, ...] = (*_LOADERS, *STUDY_TASKS)
#: tasks whose --task-path may be a directory (a ``save_to_disk`` dataset, MMLU's data/)
DIRECTORY_TASKS: tuple[str, ...] = ("triviaqa", *STUDY_TASKS)


def bundled_path(name: str) -> Path:
    """Path of the bundled sample file of task ``name``."""
    if name == QA_TASK:
        raise ValueError(
            "--task qa has no bundled sample: pass --task-path (and the field "
            "mapping flags, docs/tasks.md)"
        )
    if name not in BUNDLED_SAMPLES:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return DATA_DIR / BUNDLED_SAMPLES[name]


@dataclass(frozen=True)
class TaskStream:
    """A task file read lazily: each :meth:`groups` call reads it again, group by group.

    A run reads it twice (its prompt ids, then the groups to do as workers free up), so it
    never holds every prompt: memory stays flat in the task's size.
    """

    name: str
    source: Path
    prompt_template: str
    split: str | None = None
    limit: int | None = None
    strict: bool = False
    shard: ShardSpec | None = None
    study: Study | None = None
    """The study's dataset and prompt choices (None: the task's own prompt)."""
    spec: PromptSpec | None = None
    """The prompt the groups are made with when the study sets one (presets and ``qa``
    always have one)."""

    @property
    def answer_kind(self) -> str:
        """How the task's answers are graded: aliases, choice, numeric or judge."""
        return (self.study or Study()).answer_kind_for(self.name)

    def groups(self, collector: MalformedCollector | None = None) -> Iterator[PromptGroup]:
        """The groups in file order (``limit``, then ``shard`` applied). Malformed lines go
        to ``collector`` (default: logged as warnings); a file that gives no group raises
        :class:`DatasetFormatError` once it is read to the end. A file of another kind than
        the task reads (:class:`FileKindError`) says, in its one line, what the task reads and
        the ``--task qa`` flags that map another layout."""
        if collector is None:
            collector = MalformedCollector(str(self.source), self.strict)
        try:
            yield from select_shard(self._groups(collector), self.shard)
        except FileKindError as exc:
            hint = layout_hint(self.name)
            if hint is None:
                raise
            raise FileKindError(exc.file, exc.line, f"{exc.what}. {hint}") from None
        collector.finish()

    def _groups(self, collector: MalformedCollector) -> Iterator[PromptGroup]:
        if self.name in _LOADERS:
            groups = _LOADERS[self.name][0](
                self.source, split=self.split, limit=self.limit, collector=collector
            )
            return rerender(groups, self.spec, self.source) if self.spec is not None else groups
        assert self.study is not None and self.spec is not None
        return study_groups(
            self.name,
            self.source,
            self.study,
            self.spec,
            split=self.split,
            limit=self.limit,
            collector=collector,
        )


def open_task(
    name: str,
    path: str | Path | None = None,
    *,
    split: str | None = None,
    limit: int | None = None,
    strict: bool = False,
    shard: ShardSpec | str | None = None,
    study: Study | None = None,
) -> TaskStream:
    """Task ``name`` at ``path`` (``None``: the bundled sample), to be read lazily; the
    arguments are those of :func:`load_task` and are checked now, the file when it is read.
    ``study`` sets the dataset mapping and the prompt (default: the task's own); its few-shot
    file is read now."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if split is not None and (not isinstance(split, str) or not split.strip()):
        raise ValueError(f"split must be a non-empty string, got {split!r}")
    source = Path(path) if path is not None else bundled_path(name)
    if not (source.is_file() or (source.is_dir() and name in DIRECTORY_TASKS)):
        raise FileNotFoundError(f"{source}: no such dataset file for task {name!r}")
    if study is None and name in STUDY_TASKS:
        study = Study()
    spec = None
    template = _LOADERS[name][1] if name in _LOADERS else ""
    if study is not None:
        study.check_for(name)
        if name in STUDY_TASKS or study.custom_prompt:
            spec = study.prompt_spec(name, _fewshot_fields(name, study, split))
            template = spec.text
    return TaskStream(
        name,
        source,
        template,
        split=split,
        limit=limit,
        strict=strict,
        shard=parse_shard(shard) if isinstance(shard, str) else shard,
        study=study,
        spec=spec,
    )


def open_task_spec(spec: TaskSpec) -> TaskStream:
    """The task a :class:`TaskSpec` names (a run's: its plan opens it once)."""
    return open_task(
        spec.name, spec.path, split=spec.split, limit=spec.limit, shard=spec.shard, study=spec.study
    )


def _fewshot_fields(name: str, study: Study, split: str | None) -> Iterator[dict[str, Any]]:
    """Template fields (with ``answer``) of the records of the study's few-shot file."""
    if not study.fewshot_k or study.fewshot_path is None:
        return iter(())
    path = Path(study.fewshot_path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such few-shot file (--fewshot-path)")
    collector = MalformedCollector(str(path), strict=False)
    if name in _LOADERS:
        groups = _LOADERS[name][0](path, split=None, limit=None, collector=collector)
        return (builtin_fields(g) for g in groups)
    return (
        rec.fields
        for rec in iter_records(name, path, study, split=None, limit=None, collector=collector)
    )


def load_task(
    name: str,
    path: str | Path | None = None,
    *,
    split: str | None = None,
    limit: int | None = None,
    strict: bool = False,
    shard: ShardSpec | str | None = None,
    study: Study | None = None,
) -> TaskData:
    """Load task ``name`` from ``path`` (``None``: the bundled sample), every group at once.

    ``split`` names the split in the prompt ids (default: the file's own ``Split`` for TriviaQA
    JSON, else ``dev`` for triviaqa and ``test`` for the HalluLens tasks). ``limit`` keeps the
    first N valid items in file order; ``shard`` (``"I/N"``) then keeps the prompts of that shard
    (``hallulog.tasks.shards``), so the shards of a limited run partition its prompts. Malformed
    lines of line-oriented files (JSONL, CSV) are skipped, logged as warnings naming file:line
    and listed in ``TaskData.malformed``; with ``strict=True`` the first one raises
    :class:`DatasetFormatError` instead. A file that cannot be parsed at all (or a JSON document
    with an invalid item) raises :class:`DatasetFormatError` whose message is
    ``"<file>:<line>: <what is wrong>"``. :func:`open_task` reads the same file lazily.
    """
    stream = open_task(
        name, path, split=split, limit=limit, strict=strict, shard=shard, study=study
    )
    collector = MalformedCollector(str(stream.source), strict)
    groups = list(stream.groups(collector))
    return TaskData(
        groups=groups,
        source=str(stream.source),
        prompt_template=stream.prompt_template,
        malformed=collector.items,
        task=name,
        split=groups[0].split if groups else (split or ""),
    )
