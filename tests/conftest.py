"""Suite-wide markers: ``fast`` is every test without a slow-lane marker.

``pytest -m fast`` is the fast lane (CONTRIBUTING.md); it selects the same tests as
``-m "not e2e and not browser and not vllm and not slurm and not ray and not slow"``.
"""

from __future__ import annotations

import pytest

SLOW_LANE = ("e2e", "browser", "vllm", "slurm", "ray", "slow")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fast: no slow-lane marker (" + ", ".join(SLOW_LANE) + "); added at collection"
    )


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(name) for name in SLOW_LANE):
            item.add_marker(pytest.mark.fast)
