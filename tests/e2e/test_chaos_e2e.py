"""A small chaos soak (bench/bench_chaos.py): 2000 generations, about 15 SIGKILLs of the
orchestrator (also while it consolidates and exports), its workers and the servers, resumed
until done; exactly K+1 generations and one activation per (prompt, sample), validation clean,
nothing left behind."""

from __future__ import annotations

import time
import uuid

import pytest
from hallulog.backends.shm import orphaned, shm_names

from bench.bench_chaos import Soak, check, tagged_processes

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.alone,
]  # SIGKILL loops: shm and process checks of the whole machine


def test_small_soak_is_exactly_once_and_leaves_nothing(tmp_path):
    shm_before = shm_names()
    soak = Soak(
        tmp_path, generations=2000, k=3, servers=2, workers=2, kills=15, seed=7, interval=(0.2, 1.0)
    )
    tag = uuid.uuid4().hex
    _, root = soak.chaos(tag)
    kills = soak.kills
    assert kills["orchestrator"] >= 5 and kills["worker"] >= 3 and kills["server"] >= 3, kills
    assert kills["consolidate"] >= 1 and kills["exports"] >= 1, kills
    assert check(root, soak.prompts, 3) == []
    time.sleep(1.0)
    assert tagged_processes(tag) == []
    assert orphaned(shm_names() - shm_before) == set()
