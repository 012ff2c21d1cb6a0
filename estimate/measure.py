"""What an earlier run and the task say about lengths, bytes and rate (for ``estimate``).

- :func:`measure_run`: a (pilot) run's per-generation prompt / response / answer tokens, its
  activation and metadata bytes, its rate;
- :func:`task_prompts`: the task's prompt count as the run streams it (``--limit``,
  ``--shard``), and the prompts' token lengths (the model's tokenizer, else a byte bound);
- :func:`tree_bytes` (``du -sb``) and :func:`free_bytes` (the filesystem's free space).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.run_manifest import RunManifest

__all__ = [
    "Lengths",
    "Measured",
    "measure_run",
    "pilot_lengths",
    "task_prompts",
    "tree_bytes",
    "free_bytes",
    "PILOT_LINES",
    "TEMPLATE_TOKENS_BOUND",
]

log = logging.getLogger(__name__)

#: a prompt's tokens are bounded by its UTF-8 bytes (byte-level tokenizers) plus this much for
#: the chat template (role markers, a default system prompt) when no tokenizer is at hand
TEMPLATE_TOKENS_BOUND = 64
#: the pilot's activation_index lines read at most (the means of a sample are enough)
PILOT_LINES = 20_000
#: the tail of prompt_index.jsonl read for the last commit time
_TAIL_BYTES = 1 << 16


@dataclass(frozen=True)
class Lengths:
    """Token lengths a projection works from; None where nothing says."""

    prompt_max: int | None = None
    prompt_mean: float | None = None
    prompt_source: str | None = None
    """``tokenizer`` (the task's prompts tokenized), ``bytes`` (bounded by their UTF-8 bytes),
    ``pilot``, ``given``."""
    response_mean: float | None = None
    answer_mean: float | None = None
    samples: tuple[tuple[int, int, int], ...] = ()
    """Per generation of a pilot run: (prompt, response, answer tokens)."""
    source: str | None = None
    """Where the means come from: ``pilot`` (a run's files) or ``given`` (flags)."""
    stored_rows: tuple[int, ...] = ()
    """Per pilot generation, the rows it stored; they stand for the projection's when
    :attr:`signature` matches its selection."""
    prompt_of: tuple[int, ...] = ()
    """Per pilot generation, the index of its prompt (for the spread between prompts)."""
    signature: tuple | None = None
    """The pilot's (position names, capture mode, max tokens)."""


@dataclass(frozen=True)
class Measured:
    """What an earlier run's files say."""

    root: Path
    generations: int
    samples: tuple[tuple[int, int, int], ...]
    activation_bytes: int
    """Bytes of its activation stores (0 when measured without metadata)."""
    metadata_bytes_per_generation: float | None
    rate: float | None
    """Generations per second between its first request and its last commit."""
    stored_rows: tuple[int, ...] = ()
    prompt_of: tuple[int, ...] = ()
    signature: tuple | None = None
    """(position names, capture mode, max tokens) of its run manifest."""


def measure_run(root: str | Path, *, with_metadata: bool = True) -> Measured | None:
    """Lengths, bytes and rate of the run in ``root`` (its worker directories, else its
    consolidated one); None when it stored nothing yet. The lengths are those of its first
    ``PILOT_LINES`` generations."""
    root = Path(root)
    dirs = layout.worker_dirs(root) or [layout.consolidated_dir(root)]
    keyed: list[tuple[tuple[str, int], int, int]] = []
    rows: list[int] = []
    answers: dict[tuple[str, int], int] = {}
    generations = 0
    first = last = None
    for wdir in dirs:
        index = wdir / layout.ACTIVATION_INDEX
        if not index.exists():
            continue
        generations += _count_lines(index)
        budget = max(0, PILOT_LINES - len(keyed))
        for row in itertools.islice(_jsonl(index), budget):
            keyed.append(
                (
                    (row.get("prompt_id"), int(row.get("sample_id", 0))),
                    int(row.get("prompt_token_count") or 1),
                    int(row.get("response_token_count") or 1),
                )
            )
            rows.append(int(row.get("num_rows") or -1))
        for row in itertools.islice(_jsonl(wdir / layout.GENERATIONS), budget):
            answers[(row.get("prompt_id"), int(row.get("sample_id", 0)))] = _answer_tokens(row)
            stamp = _time((row.get("request_params") or {}).get("timestamp"))
            if stamp is not None and (first is None or stamp < first):
                first = stamp
        for row in _jsonl(wdir / layout.PROMPT_INDEX, tail=_TAIL_BYTES):
            stamp = _time(row.get("completed_at"))
            if stamp is not None and (last is None or stamp > last):
                last = stamp
    if not generations:
        return None
    samples = tuple((p, r, answers.get(key, 0)) for key, p, r in keyed)
    prompts: dict[str, int] = {}
    prompt_of = tuple(prompts.setdefault(key[0], len(prompts)) for key, _, _ in keyed)
    activations = sum(tree_bytes(d / "activations") for d in dirs) if with_metadata else 0
    metadata = (
        (tree_bytes(root, skip=_transient(root)) - activations) / generations
        if with_metadata
        else None
    )
    rate = generations / (last - first) if first and last and last > first else None
    return Measured(
        root,
        generations,
        samples,
        activations,
        metadata,
        rate,
        stored_rows=tuple(rows) if min(rows, default=-1) >= 0 else (),
        prompt_of=prompt_of,
        signature=_signature(root),
    )


def _signature(root: Path) -> tuple | None:
    """(position names, capture mode, max tokens) of the run manifest in ``root``."""
    try:
        fields = RunManifest.load(root).get("fingerprint_fields")
        names = (
            tuple(n.strip() for n in fields["positions"].split(","))
            if fields.get("positions")
            else (fields["sequence_mode"],)
        )
        return names, fields.get("capture_mode", "generation"), int(fields["max_tokens"])
    except (HallulogError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _answer_tokens(row: dict[str, Any]) -> int:
    """Tokens of a generation's answer span (characters scaled by the text's tokens/char)."""
    span, text = row.get("answer_span"), row.get("text") or ""
    tokens = (row.get("usage") or {}).get("completion_tokens") or len(row.get("token_ids") or [])
    if not span or not text or not tokens:
        return 0
    chars = max(0, int(span[1]) - int(span[0]))
    return max(1, round(chars * tokens / max(1, len(text)))) if chars else 0


def _jsonl(path: Path, *, tail: int | None = None) -> Iterator[dict[str, Any]]:
    """The lines of a JSONL file (with ``tail``: of its last ``tail`` bytes), torn ones
    skipped."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        if tail is not None and f.seek(0, os.SEEK_END) > tail:
            f.seek(-tail, os.SEEK_END)
            f.readline()  # a partial line
        else:
            f.seek(0)
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a torn last line


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _time(text: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _transient(root: Path) -> set[Path]:
    return {root / "spool", root / "servers"}


def tree_bytes(path: str | Path, *, skip: Iterable[Path] = ()) -> int:
    """Apparent size of the files under ``path`` (``du -sb``), leaving out ``skip``."""
    skipped = {os.fspath(p) for p in skip}
    total, stack = 0, [os.fspath(path)]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in skipped:
                            stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue  # removed meanwhile (a spool file, a renamed .tmp)
    return total


def task_prompts(
    stream: Any,
    *,
    chat: bool,
    tokenizer_dir: Path | None,
    lengths: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[int, Lengths]:
    """The run's prompt count (its task stream, ``hallulog.tasks.TaskStream``, as the run reads
    it: --limit and --shard apply) and, with ``lengths``, the prompts' token lengths: tokenized
    with the model's tokenizer when ``tokenizer_dir`` has one (through its chat template when
    ``chat``, with ``template_kwargs``), else bounded by their bytes."""
    if not lengths:
        return sum(1 for _ in stream.groups()), Lengths()
    measure = _token_counter(tokenizer_dir, chat=chat, template_kwargs=template_kwargs or {})
    source = "tokenizer" if measure is not None else "bytes"
    count, longest, total = 0, 0, 0
    for group in stream.groups():
        n = measure(group) if measure is not None else _byte_bound(group)
        count, longest, total = count + 1, max(longest, n), total + n
    return count, Lengths(
        prompt_max=longest or None,
        prompt_mean=total / count if count and source == "tokenizer" else None,
        prompt_source=source,
    )


def _byte_bound(group: Any) -> int:
    if group.prompt is not None:
        return len(group.prompt.encode()) + 2
    return (
        sum(len(str(m.get("content", "")).encode()) + 8 for m in group.messages)
        + TEMPLATE_TOKENS_BOUND
    )


def _token_counter(model_dir: Path | None, *, chat: bool, template_kwargs: dict[str, Any]):
    """A function group → prompt tokens as the server counts them, or None (no tokenizer)."""
    if model_dir is None or not (Path(model_dir) / "tokenizer_config.json").exists():
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - no tokenizer: fall back to the byte bound
        log.warning(
            "no tokenizer in %s (%s): prompt lengths bounded by their bytes", model_dir, exc
        )
        return None

    def count(group: Any) -> int:
        if group.prompt is not None or not chat:
            return len(tok(group.prompt_text)["input_ids"])
        text = tok.apply_chat_template(
            group.messages, add_generation_prompt=True, tokenize=False, **template_kwargs
        )
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return count


def pilot_lengths(measured: Measured) -> Lengths:
    """Mean lengths of a measured run."""
    n = len(measured.samples)
    ps, rs, as_ = zip(*measured.samples)
    answered = [a for a in as_ if a]
    return Lengths(
        prompt_max=max(ps),
        prompt_mean=sum(ps) / n,
        prompt_source="pilot",
        response_mean=sum(rs) / n,
        answer_mean=sum(answered) / len(answered) if answered else None,
        samples=measured.samples,
        source="pilot",
        stored_rows=measured.stored_rows,
        prompt_of=measured.prompt_of,
        signature=measured.signature,
    )


def free_bytes(path: Path) -> int:
    """Free bytes of the filesystem ``path`` is (or will be) on."""
    path = Path(path).absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return shutil.disk_usage(path).free
