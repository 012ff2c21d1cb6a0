"""Task loaders: dataset files → :class:`~contracts.prompt_group.PromptGroup` lists.

```python
from orchestrator.tasks import load_task, TASKS
data = load_task("triviaqa")                   # the bundled sample
data = load_task("triviaqa", "unfiltered-web-dev.json", limit=1000)
data.groups, data.source, data.prompt_template, data.malformed
```

Formats, fields and id rules: docs/tasks.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from orchestrator.shards import select_shard
from orchestrator.tasks import hallulens, triviaqa
from orchestrator.tasks.base import DatasetFormatError, MalformedLine, TaskData

__all__ = ["load_task", "TaskData", "MalformedLine", "DatasetFormatError", "TASKS",
           "BUNDLED_SAMPLES", "bundled_path"]

DATA_DIR = Path(__file__).resolve().parent / "data"

BUNDLED_SAMPLES: dict[str, str] = {
    "triviaqa": "triviaqa-sample-dev.json",
    "precisewikiqa": "precisewikiqa-sample.jsonl",
    "longwiki": "longwiki-sample.jsonl",
    "mixedentities": "mixedentities-sample.jsonl",
}

_LOADERS: dict[str, Callable[..., TaskData]] = {
    "triviaqa": triviaqa.load,
    "precisewikiqa": hallulens.load_precisewikiqa,
    "longwiki": hallulens.load_longwiki,
    "mixedentities": hallulens.load_mixedentities,
}

TASKS: tuple[str, ...] = tuple(_LOADERS)


def bundled_path(name: str) -> Path:
    """Path of the bundled sample file of task ``name``."""
    if name not in BUNDLED_SAMPLES:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return DATA_DIR / BUNDLED_SAMPLES[name]


def load_task(name: str, path: str | Path | None = None, *, split: str | None = None,
              limit: int | None = None, strict: bool = False, shard: str | None = None
              ) -> TaskData:
    """Load task ``name`` from ``path`` (``None``: the bundled sample).

    ``split`` names the split in the prompt ids (default: the file's own ``Split`` for TriviaQA
    JSON, else ``dev`` for triviaqa and ``test`` for the HalluLens tasks). ``limit`` keeps the
    first N valid items in file order; ``shard`` (``"I/N"``) then keeps the prompts of that shard
    (``orchestrator.shards``), so the shards of a limited run partition its prompts. Malformed
    lines of line-oriented files (JSONL, CSV) are skipped, logged as warnings naming file:line
    and listed in ``TaskData.malformed``; with ``strict=True`` the first one raises
    :class:`DatasetFormatError` instead. A file that cannot be parsed at all (or a JSON document
    with an invalid item) raises :class:`DatasetFormatError` whose message is
    ``"<file>:<line>: <what is wrong>"``.
    """
    if name not in _LOADERS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if split is not None and (not isinstance(split, str) or not split.strip()):
        raise ValueError(f"split must be a non-empty string, got {split!r}")
    source = Path(path) if path is not None else bundled_path(name)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such dataset file for task {name!r}")
    data = _LOADERS[name](source, split=split, limit=limit, strict=strict)
    if shard is not None:
        data = dataclasses.replace(data, groups=select_shard(data.groups, shard))
    return data
