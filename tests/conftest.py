"""Suite-wide markers and fixtures.

Markers: ``fast`` is every test without a slow-lane marker. ``pytest -m fast`` is the fast lane
(CONTRIBUTING.md); it selects the same tests as
``-m "not e2e and not browser and not vllm and not slurm and not ray and not slow"``.

``alone`` marks a test that must not share the machine with other tests: it starts a cluster
that takes every core (Ray, Slurm, vLLM: added here to every test with those markers) or its
assertions rest on timing under SIGKILL/SIGSTOP. scripts/test.sh (README's test command) runs
every other test on all cores (pytest-xdist) and the ``alone`` tests one at a time after them.

Fixtures: ``instant_backend`` (and ``instant_backend_module``, one per test module) start the
bench's instant backend (bench/instant_backend.py: the OpenAI protocol and the capture contract
without a model) and wait for its ``/health``; every one started is stopped at teardown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.instant_run import running_instant_backend

SLOW_LANE = ("e2e", "browser", "vllm", "slurm", "ray", "slow")
WHOLE_MACHINE = ("vllm", "slurm", "ray")  # always in the alone lane


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fast: no slow-lane marker (" + ", ".join(SLOW_LANE) + "); added at collection"
    )
    config.addinivalue_line(
        "markers",
        "alone: runs after the parallel lane, one test at a time (scripts/test.sh); added to "
        + ", ".join(WHOLE_MACHINE)
        + " tests at collection",
    )


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(name) for name in SLOW_LANE):
            item.add_marker(pytest.mark.fast)
        if any(item.get_closest_marker(name) for name in WHOLE_MACHINE):
            item.add_marker(pytest.mark.alone)


def _instant_starter(stack: contextlib.ExitStack, base: Path) -> Callable[..., str]:
    started = [0]

    def start(spool_dir: Path | None = None, **options) -> str:
        """URL of a new instant backend spooling into ``spool_dir`` (default: a fresh folder);
        ``options``: those of ``bench.instant_run.instant_backend_argv``."""
        started[0] += 1
        spool = spool_dir if spool_dir is not None else base / f"instant-spool-{started[0]}"
        return stack.enter_context(running_instant_backend(spool, **options))

    return start


@pytest.fixture
def instant_backend(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """``start(spool_dir=None, num_layer_ids=2, hidden_size=64, ...)`` → the URL of a running
    instant backend, stopped when the test ends."""
    with contextlib.ExitStack() as stack:
        yield _instant_starter(stack, tmp_path)


@pytest.fixture(scope="module")
def instant_backend_module(tmp_path_factory) -> Iterator[Callable[..., str]]:
    """As ``instant_backend``, the backends living until the module's last test."""
    with contextlib.ExitStack() as stack:
        yield _instant_starter(stack, tmp_path_factory.mktemp("instant"))
