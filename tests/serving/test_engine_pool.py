"""Several engines over one model: a prompt's sequences stay on one engine (one prefill), every
answer is the one a single engine gives, and the shared metrics add up."""

import threading

import torch
from hallulog.serving.capture import SpoolWriter
from hallulog.serving.engine import Engine, SamplingParams
from hallulog.serving.engine_pool import EnginePool, plan_threads
from hallulog.serving.metrics import ServingMetrics
from safetensors.torch import load_file

from tests.serving.tiny import tiny_loaded

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20], [30, 31, 32, 33]]


def _group(prompt, q):
    """A run's group: one greedy answer and three seeded samples, all captured."""
    greedy = SamplingParams(max_tokens=7, temperature=0, top_logprobs=3, capture=True)
    samples = [
        SamplingParams(max_tokens=7, temperature=0.7, top_p=0.9, seed=10 * q + s, capture=True)
        for s in range(3)
    ]
    return [(prompt, p) for p in [greedy, *samples]]


def _same(a, b):
    assert a.token_ids == b.token_ids
    for x, y in zip(a.logprobs or [], b.logprobs or []):
        assert abs(x.logprob - y.logprob) < 1e-4
    sa, sb = load_file(a.hidden_states_path), load_file(b.hidden_states_path)
    torch.testing.assert_close(sa["hidden_states"], sb["hidden_states"], rtol=1e-4, atol=1e-5)


def test_pool_answers_equal_one_engine_and_keep_a_prompt_on_one_engine(tmp_path):
    jobs = [job for q, prompt in enumerate(PROMPTS) for job in _group(prompt, q)]
    single = Engine(
        tiny_loaded(eos=frozenset({63})),
        spool=SpoolWriter(tmp_path / "one"),
        capture_layers=[0, 1, 2],
    )
    single.start()
    try:
        want = [f.result(60) for f in [single.submit(p, params) for p, params in jobs]]
    finally:
        single.stop()
    metrics = ServingMetrics("tiny")
    pool = EnginePool(
        tiny_loaded(eos=frozenset({63})),
        2,
        spool=SpoolWriter(tmp_path / "pool"),
        capture_layers=[0, 1, 2],
        metrics=metrics,
        solo_below=0,  # spread from the first sequence
    )
    assert pool.engines[1]._fused is pool.engines[0]._fused  # one set of packed weights
    placed = []
    original = [engine.submit for engine in pool.engines]
    for index, engine in enumerate(pool.engines):

        def submit(prompt, params, index=index):
            placed.append((tuple(prompt), index))
            return original[index](prompt, params)

        engine.submit = submit
    pool.start()
    try:
        futures = [pool.submit(p, params) for p, params in jobs]
        got = [f.result(60) for f in futures]
    finally:
        pool.stop()
    for a, b in zip(want, got):
        _same(a, b)
    engines_of = {}
    for prompt, index in placed:
        engines_of.setdefault(prompt, set()).add(index)
    assert all(len(e) == 1 for e in engines_of.values())  # a prompt never split
    assert {i for e in engines_of.values() for i in e} == {0, 1}  # both engines used
    value = metrics.registry.get_sample_value
    labels = {"model_name": "tiny"}
    assert value("vllm:num_requests_running", labels) == 0
    assert value("vllm:num_requests_waiting", labels) == 0
    assert value("vllm:generation_tokens_total", labels) == sum(len(o.token_ids) for o in got)
    assert not pool._placed and pool._outstanding == [0, 0]


def test_pool_takes_requests_from_many_threads(tmp_path):
    pool = EnginePool(tiny_loaded(eos=frozenset({63})), 2, metrics=ServingMetrics("tiny"))
    pool.start()
    outs: list = []
    lock = threading.Lock()

    def client(q):
        futures = [pool.submit(p, params) for p, params in _group(PROMPTS[q % 4], q)]
        with lock:
            outs.extend(f.result(60) for f in futures)

    try:
        threads = [threading.Thread(target=client, args=(q,)) for q in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        pool.stop()
    assert len(outs) == 32 and not pool._placed


def test_a_bad_prompt_is_refused_without_leaking_its_place():
    pool = EnginePool(tiny_loaded(max_model_len=8), 2)
    try:
        pool.submit([64], SamplingParams(max_tokens=1))
    except ValueError:
        pass
    else:
        raise AssertionError("accepted a token outside the vocabulary")
    assert not pool._placed and pool._outstanding == [0, 0]


def test_a_model_without_the_fused_path_gets_one_engine():
    assert len(EnginePool(tiny_loaded(), 2, fused_decode=False).engines) == 1


def test_thread_plan():
    assert plan_threads(3, 2) == (3, 2)
    engines, threads = plan_threads()
    assert engines in (1, 2) and threads >= 1
    assert plan_threads(1, 0)[1] >= plan_threads(2, 0)[1]
