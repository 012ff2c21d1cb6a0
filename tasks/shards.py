"""``--shard I/N``: a deterministic split of a run's prompts by prompt id.

Prompt ``p`` belongs to shard ``int(p, 16) % N`` (the id is the hex of a sha256, so shards are
even in expectation). The split is applied after ``--limit``: the N shards of a limited run
partition exactly its prompts, and a prompt keeps its shard when the limit grows. Each shard is
a complete run in its own artifact root; ``python -m orchestrator merge`` joins them
(``hallulog.postrun.merge``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["ShardSpec", "parse_shard", "shard_of", "select_shard"]

T = TypeVar("T")


class ShardSpec(tuple):
    """``(index, count)`` of one shard; ``str()`` gives back ``"I/N"``."""

    def __new__(cls, index: int, count: int) -> ShardSpec:
        return super().__new__(cls, (index, count))

    @property
    def index(self) -> int:
        return self[0]

    @property
    def count(self) -> int:
        return self[1]

    def __str__(self) -> str:
        return f"{self[0]}/{self[1]}"


def parse_shard(text: str) -> ShardSpec:
    """``"I/N"`` → :class:`ShardSpec`; ``ValueError`` with a one-line reason otherwise."""
    head, sep, tail = str(text).strip().partition("/")
    if not sep or not head.strip().isdigit() or not tail.strip().isdigit():
        raise ValueError(f"--shard {text!r}: expected I/N with integers 0 <= I < N, e.g. 0/4")
    index, count = int(head), int(tail)
    if count < 1:
        raise ValueError(f"--shard {text}: N must be >= 1")
    if index >= count:
        raise ValueError(
            f"--shard {text}: shard index {index} is out of range for {count} "
            f"shard(s) (I must be 0..{count - 1})"
        )
    return ShardSpec(index, count)


def shard_of(prompt_id: str, count: int) -> int:
    """The shard (0..count-1) prompt ``prompt_id`` belongs to."""
    return int(prompt_id, 16) % count


def select_shard(groups: Iterable[T], spec: ShardSpec | str | None) -> Iterator[T]:
    """The groups (anything with a ``prompt_id``) of shard ``spec``, in their original order,
    taken lazily from ``groups``."""
    if spec is None:
        yield from groups
        return
    if isinstance(spec, str):
        spec = parse_shard(spec)
    yield from (g for g in groups if shard_of(g.prompt_id, spec.count) == spec.index)  # type: ignore[attr-defined]
