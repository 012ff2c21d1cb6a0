"""The key/value budget (``serving/memory.py``), ``--max-memory-gb`` and the prompts' keys/values
held once (``serving/kvprefix.py``): what is admitted, what waits, what is refused, and that the
answers do not change. Tiny random Llama (fast lane)."""

import pytest
import torch
from hallulog.serving.attention_kernel import load_kernel
from hallulog.serving.config import parse_args
from hallulog.serving.engine import Engine, SamplingParams
from hallulog.serving.kvprefix import PrefixStore
from hallulog.serving.kvslots import SlotKVCache, kv_bytes
from hallulog.serving.memory import DEFAULT_KV_BYTES, GB, STEP_RESERVE, KVBudget, plan_budget
from hallulog.serving.metrics import ServingMetrics

from tests.serving.tiny import tiny_loaded

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33]]
GREEDY = SamplingParams(max_tokens=5, temperature=0, top_logprobs=3)


def _engine(head_dim=None, **kw) -> Engine:
    loaded = tiny_loaded(eos=frozenset({63}), head_dim=head_dim)
    return Engine(loaded, metrics=ServingMetrics("tiny"), **kw)


def test_a_budget_grants_what_fits_and_always_one_sequence():
    budget = KVBudget(100)
    assert budget.claim(0, 60) and budget.claim(1, 40)  # 100: fits exactly
    assert not budget.claim(0, 61)  # owner 0 holds 60 already: refused, keeps its 60
    assert budget.held == 100
    budget.set(1, 0)  # owner 1's sequences finished
    assert budget.claim(0, 100) and budget.held == 100
    assert budget.claim(2, 500)  # an engine holding nothing always runs one
    budget.set(0, 10)  # fewer running: always granted
    assert budget.held == 510


def test_plan_budget_takes_the_weights_and_a_steps_buffers_from_the_flag():
    assert plan_budget(None, 10**9) == DEFAULT_KV_BYTES
    static = int(0.6 * GB)
    assert plan_budget(2.0, static) == int(2 * GB) - static - STEP_RESERVE
    with pytest.raises(ValueError) as info:
        plan_budget(0.8, static)
    message = str(info.value)
    assert "\n" not in message and message.startswith("--max-memory-gb 0.8 is too little")
    assert "0.60 GB" in message  # what the loaded model takes


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_the_server_refuses_a_nonsense_max_memory_gb(value, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--max-memory-gb", value])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == f"hallulog serve: error: --max-memory-gb must be > 0, got {float(value)}"


def _bytes(engine: Engine, seqs) -> int:
    prompts = {tuple(p) for p, _ in seqs}
    longest = max(len(p) + params.max_tokens for p, params in seqs)
    return kv_bytes(
        engine._kv_cell,
        len(seqs),
        max(params.max_tokens for _, params in seqs),
        longest,
        len(prompts),
        max(len(p) for p in prompts),
        shared=engine._fused is not None,
    )


def test_the_budget_admits_what_fits_and_queues_the_rest():
    """Four waiting sequences, a budget for the first two at their longest: a batch of two, the
    others wait first in line; once the two finish, the next two run; every answer is the one
    an unbounded engine gives."""
    jobs = [(p, GREEDY) for p in PROMPTS]
    unbounded = _engine()
    unbounded.start()
    try:
        free = [unbounded.submit(p, params).result(60) for p, params in jobs]
    finally:
        unbounded.stop()

    probe = _engine()
    limit = _bytes(probe, jobs[:2])
    assert limit < _bytes(probe, jobs[:3])
    budget = KVBudget(limit)
    engine = _engine(kv_budget=budget, budget_owner=0)
    futures = [engine.submit(p, params) for p, params in jobs]
    batch = engine._next_batch()
    assert [s.prompt_ids for s in batch] == PROMPTS[:2]
    assert [s.prompt_ids for s in engine._pending] == [PROMPTS[2]]  # refused, first in line
    assert budget.held <= limit
    with torch.inference_mode():
        engine._generate(batch)  # the waiting ones join as the first two finish
    engine.stop()
    assert engine._queue.empty() and not engine._pending
    assert budget.held == 0
    for a, b in zip(free, [f.result(5) for f in futures]):
        assert a.token_ids == b.token_ids


def test_a_sequence_larger_than_the_budget_runs_alone():
    engine = _engine(kv_budget=KVBudget(1), budget_owner=0)
    futures = [engine.submit(p, GREEDY) for p in PROMPTS[:2]]
    batch = engine._next_batch()
    assert len(batch) == 1 and len(engine._pending) == 1
    with torch.inference_mode():
        engine._generate(batch)
    engine.stop()
    assert all(len(f.result(5).token_ids) == 5 for f in futures)


@pytest.mark.parametrize("head_dim", [8, 16])
def test_the_prefix_store_gives_the_same_answers_as_prompts_copied_into_each_row(
    monkeypatch, head_dim
):
    """A greedy answer and seeded samples of each of two prompts, admitted together: with the
    prompts' keys/values once per prompt (the fused decoder's cache) and with them copied into
    every row, the same tokens and logprobs (through matmul attention with 8-wide heads, through
    the C kernel, where it builds, with 16-wide ones: there to the bit)."""
    jobs = []
    for prompt in PROMPTS[:2]:
        jobs.append((prompt, SamplingParams(max_tokens=8, temperature=0, top_logprobs=5)))
        jobs += [
            (prompt, SamplingParams(max_tokens=8, temperature=0.7, seed=s, top_logprobs=5))
            for s in range(3)
        ]

    def run() -> tuple[list, list]:
        engine = _engine(head_dim, max_batch_size=16)
        futures = [engine.submit(p, params) for p, params in jobs]
        caches = []
        new_cache = engine._new_cache
        engine._new_cache = lambda: caches.append(new_cache()) or caches[-1]
        with torch.inference_mode():
            engine._generate(engine._next_batch())
        engine.stop()
        return [f.result(5) for f in futures], caches

    shared, caches = run()
    kernel = head_dim == 16 and load_kernel() is not None
    assert engine_used_prefix(caches) == 2  # one entry per distinct prompt
    original = SlotKVCache.__init__
    monkeypatch.setattr(
        SlotKVCache,
        "__init__",
        lambda self, layers, rows, shared=False: original(self, layers, rows),
    )
    copied, caches = run()
    assert engine_used_prefix(caches) == 0
    for a, b in zip(copied, shared):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.logprob == y.logprob if kernel else abs(x.logprob - y.logprob) < 1e-5
    assert len({tuple(o.token_ids) for o in shared[1:4]}) > 1  # the samples still differ


def engine_used_prefix(caches) -> int:
    """Entries the prefix stores of ``caches`` allocated (0: no store)."""
    return sum(len(c.prefix.refs) for c in caches if c.prefix is not None)


def test_prefix_entries_are_counted_freed_and_reused():
    store = PrefixStore(num_layers=2)
    kv = [(torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)) for _ in range(2)]
    first = store.add(kv, [3, 5], [2, 1])
    assert first == [0, 1] and store.length.tolist()[:2] == [3, 5]
    torch.testing.assert_close(store.keys[1][0, :, :3], kv[1][0][0, :, 2:], rtol=0, atol=0)
    store.release(0)
    store.release(1)  # entry 1's only row: freed
    assert store.free == [1] and store.length[1] == 0
    longer = [(torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)) for _ in range(2)]
    again = store.add(longer, [9], [1])
    assert again == [1]  # reused, the buffers grown to 9 columns with entry 0 kept
    assert store.capacity[1] >= 9
    torch.testing.assert_close(store.values[0][0, :, :3], kv[0][1][0, :, 2:], rtol=0, atol=0)
    torch.testing.assert_close(store.keys[0][1], longer[0][0][0], rtol=0, atol=0)
