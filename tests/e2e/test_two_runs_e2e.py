"""Two runs on one machine at the same instant, with an empty model cache (the real model):
both finish with clean artifacts on different ports; the cache holds one converted model.
bench/bench_two_runs.py repeats this round N times."""

from __future__ import annotations

import pytest

from bench.bench_two_runs import one_round

pytestmark = pytest.mark.e2e


def test_two_runs_started_together_on_an_empty_cache(tmp_path):
    result = one_round(tmp_path, limit=2)
    assert result["problems"] == [], result
    assert len(result["ports"]) == 2 and all(result["ports"])
