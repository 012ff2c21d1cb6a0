"""Shared pieces of the property-based reader tests: byte mutations and the reader contract.

The contract every reader keeps on damaged input (truncated, corrupted or random bytes): it
returns, or raises one of the project's documented error classes with a message naming the file
(and line or offset where it has one); it never hangs, never raises anything else, and never
deletes or rewrites what is on disk.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from hallulog.contracts.errors import HallulogError
from hallulog.storage.errors import StorageError
from hallulog.tasks import DatasetFormatError
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

DOCUMENTED = (HallulogError, StorageError, DatasetFormatError)
FUZZ = settings(
    max_examples=25,
    deadline=5000,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

mutations = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(
        st.just("flip"),
        st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), min_size=1, max_size=8),
    ),
    st.tuples(st.just("random"), st.binary(max_size=600)),
    st.tuples(st.just("splice"), st.floats(0, 1), st.binary(min_size=1, max_size=24)),
)


def mutate(data: bytes, m: tuple) -> bytes:
    kind = m[0]
    if kind == "truncate":
        return data[: int(len(data) * m[1])]
    if kind == "flip":
        out = bytearray(data)
        for where, xor in m[1]:
            if out:
                i = min(int(where * len(out)), len(out) - 1)
                out[i] ^= xor
        return bytes(out)
    if kind == "random":
        return m[1]
    where = int(len(data) * m[1])
    return data[:where] + m[2] + data[where:]


@contextmanager
def no_hang(seconds: int = 20):
    """A reader that hangs fails the test instead of stalling the suite."""

    def fire(signum, frame):  # noqa: ARG001
        raise TimeoutError(f"reader still running after {seconds} s (a hang)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(Path(root).rglob("*"))
        if p.is_file()
    }


def check_reader(
    read: Callable[[], object], *, names: list[str], root: Path | None = None
) -> BaseException | None:
    """Run ``read``; it may succeed or raise a documented error naming one of ``names``."""
    before = snapshot(root) if root is not None else None
    try:
        with no_hang():
            read()
        err = None
    except DOCUMENTED as exc:
        text = str(exc)
        assert any(n in text for n in names), f"error does not name the file: {text!r}"
        err = exc
    if root is not None:
        after = snapshot(root)
        lost = {k for k in before if k not in after or after[k] != before[k]}
        lost = {k for k in lost if not k.endswith(".lock")}
        assert not lost, f"a reader deleted or rewrote {sorted(lost)}"
    return err


def write_mutated(path: Path, original: bytes, m: tuple) -> bytes:
    data = mutate(original, m)
    path.write_bytes(data)
    os.utime(path)
    return data
