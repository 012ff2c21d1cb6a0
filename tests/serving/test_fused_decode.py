"""The fused decode step and the shared prefill must not change what the engine answers.

Tiny random Llama (fast lane); the same checks on the real SmolLM2 against transformers'
``generate`` are in ``test_engine_real.py`` (e2e).
"""

import pytest
import torch
from hallulog.serving.capture import SpoolWriter
from hallulog.serving.decode import FusedDecoder, packed_linear_available, supports_fused_decode
from hallulog.serving.engine import Engine, SamplingParams
from hallulog.serving.kvslots import SlotKVCache
from hallulog.serving.metrics import ServingMetrics
from safetensors.torch import load_file

from tests.serving.tiny import tiny_loaded

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20], [30, 31, 32, 33]]


def _engine(tmp_path, name, **kw) -> Engine:
    return Engine(
        tiny_loaded(eos=frozenset({63})),
        spool=SpoolWriter(tmp_path / name),
        capture_layers=[0, 1, 2],
        metrics=ServingMetrics("tiny"),
        **kw,
    )


def _run_unstarted(engine: Engine, jobs):
    """Submit every job before the engine runs, so they are admitted as one batch."""
    futures = [engine.submit(p, params) for p, params in jobs]
    head = engine._queue.get_nowait()
    with torch.inference_mode():
        engine._generate([head])
    engine.stop()
    return [f.result(5) for f in futures]


def _assert_same(a, b):
    assert a.token_ids == b.token_ids
    if a.logprobs:
        assert [x.token_id for x in a.logprobs] == [y.token_id for y in b.logprobs]
        assert max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        assert [[t for t, _ in x.top] for x in a.logprobs] == [
            [t for t, _ in y.top] for y in b.logprobs
        ]
    if a.hidden_states_path or b.hidden_states_path:
        sa, sb = load_file(a.hidden_states_path), load_file(b.hidden_states_path)
        assert torch.equal(sa["token_ids"], sb["token_ids"])
        torch.testing.assert_close(sa["hidden_states"], sb["hidden_states"], rtol=1e-4, atol=1e-5)


JOBS = [
    (PROMPTS[0], SamplingParams(max_tokens=9, temperature=0, top_logprobs=5, capture=True)),
    (PROMPTS[1], SamplingParams(max_tokens=4, temperature=0, top_logprobs=2, capture=True)),
    (PROMPTS[2], SamplingParams(max_tokens=11, temperature=0.7, seed=3, capture=True)),
    (PROMPTS[3], SamplingParams(max_tokens=6, temperature=1.0, top_p=0.9, seed=8, top_logprobs=1)),
]


def test_the_tiny_llama_takes_the_fused_path():
    loaded = tiny_loaded()
    assert supports_fused_decode(loaded.model)
    assert Engine(loaded)._fused is not None
    assert Engine(tiny_loaded(), fused_decode=False)._fused is None


def test_fused_decode_equals_the_models_own_forward(tmp_path):
    """Same tokens, logprobs and captured rows as the transformers decode step, in one batch."""
    fused = _run_unstarted(_engine(tmp_path, "fused"), JOBS)
    plain = _run_unstarted(_engine(tmp_path, "plain", fused_decode=False), JOBS)
    for a, b in zip(plain, fused):
        _assert_same(a, b)


def test_fused_weights_are_views_of_the_model():
    """The fused matrices replace the module weights (no second plain copy of the model)."""
    model = tiny_loaded().model
    before = sum(p.numel() for p in model.parameters())
    decoder = FusedDecoder(model)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == decoder.layers[0].qkv.weight.data_ptr()
    assert (
        attn.k_proj.weight.untyped_storage().data_ptr() == decoder.layers[0].qkv.weight.data_ptr()
    )
    assert sum(p.numel() for p in model.parameters()) == before


def test_packed_matrix_products_equal_f_linear():
    """oneDNN's packed float32 products (where torch has them) give the logits, keys and captured
    states of ``F.linear`` up to rounding, for a prefill and the decode steps after it."""
    if not packed_linear_available():
        pytest.skip("this torch has no oneDNN packed linear")
    model = tiny_loaded().model
    packed = FusedDecoder(model, [0, 1, 2], packed=True)
    plain = FusedDecoder(model, [0, 1, 2], packed=False)
    assert packed.layers[0].qkv.packed is not None and plain.layers[0].qkv.packed is None
    ids = torch.tensor([[0, 0, 5, 6, 7], [9, 10, 11, 12, 13]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    outs = [decoder.prefill(ids, mask, positions, True) for decoder in (packed, plain)]
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0][1][-1][0], outs[1][1][-1][0], rtol=1e-5, atol=1e-5)
    real = mask.bool()
    torch.testing.assert_close(outs[0][2][real], outs[1][2][real], rtol=1e-5, atol=1e-5)
    for decoder, (_, kv, _) in zip((packed, plain), outs):
        cache = SlotKVCache(len(kv), 2)
        cache.admit(kv, mask)
        logits, states = decoder.step(
            torch.tensor([[3], [4]]), positions[:, -1:] + 1, cache, cache.step_mask(1), True
        )
        decoder.result = logits, states
    torch.testing.assert_close(packed.result[0], plain.result[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed.result[1], plain.result[1], rtol=1e-5, atol=1e-5)


def test_cache_garbage_never_reaches_attention(tmp_path, monkeypatch):
    """New cache buffers are uninitialised: filled with NaN here, with buffers regrowing and
    rows joining, every answer is still the one each sequence gets alone."""
    import hallulog.serving.kvslots as kvslots

    monkeypatch.setattr(kvslots, "HEADROOM", 1)
    monkeypatch.setattr(kvslots, "GROWTH", 2)
    monkeypatch.setattr(
        kvslots,
        "_uninitialised",
        lambda shape, like: torch.full(shape, float("nan"), dtype=like.dtype),
    )
    jobs = [
        (PROMPTS[2], SamplingParams(max_tokens=2, temperature=0, top_logprobs=1, capture=True)),
        (PROMPTS[1], SamplingParams(max_tokens=9, temperature=0, top_logprobs=2, capture=True)),
        (PROMPTS[0], SamplingParams(max_tokens=6, temperature=0.7, seed=3, capture=True)),
        (PROMPTS[1] + PROMPTS[3], SamplingParams(max_tokens=7, temperature=0, top_logprobs=1)),
        (PROMPTS[3], SamplingParams(max_tokens=5, temperature=1.0, top_p=0.9, seed=1)),
    ]
    engine = _engine(tmp_path, "alone")
    engine.start()
    try:
        alone = [engine.submit(p, params).result(60) for p, params in jobs]
    finally:
        engine.stop()
    together = _run_unstarted(_engine(tmp_path, "together", max_batch_size=3), jobs)
    for a, b in zip(alone, together):
        _assert_same(a, b)
        assert all(x.logprob == x.logprob for x in b.logprobs or [])  # no NaN


def test_shared_prompt_is_prefilled_once_with_the_same_results(tmp_path):
    """Six answers of one prompt (a greedy one and five seeded samples, as a run asks) plus another
    prompt: one prefill row per distinct prompt, and every answer, logprob and captured row as
    when each sequence runs alone."""
    greedy = SamplingParams(max_tokens=8, temperature=0, top_logprobs=5, capture=True)
    jobs = (
        [(PROMPTS[1], greedy)]
        + [
            (
                PROMPTS[1],
                SamplingParams(max_tokens=8, temperature=0.7, seed=s, top_logprobs=5, capture=True),
            )
            for s in range(5)
        ]
        + [(PROMPTS[0], greedy)]
    )
    engine = _engine(tmp_path, "alone")
    engine.start()
    try:
        alone = [engine.submit(p, params).result(60) for p, params in jobs]
    finally:
        engine.stop()
    engine = _engine(tmp_path, "shared", max_batch_size=8)
    together = _run_unstarted(engine, jobs)
    observed = engine.metrics.registry.get_sample_value
    assert observed("hallulog_serving_batch_size_bucket", {"le": "2.0", "model_name": "tiny"}) >= 1
    assert observed("vllm:prompt_tokens_total", {"model_name": "tiny"}) == sum(
        len(p) for p, _ in jobs
    )  # counted per sequence, as vLLM does
    for a, b in zip(alone, together):
        _assert_same(a, b)
    assert len({tuple(o.token_ids) for o in together[1:6]}) > 1  # the samples still differ


def test_shared_prefill_off_gives_the_same_results(tmp_path):
    jobs = [(PROMPTS[2], JOBS[0][1]), (PROMPTS[2], JOBS[2][1]), (PROMPTS[2], JOBS[0][1])]
    shared = _run_unstarted(_engine(tmp_path, "a"), jobs)
    separate = _run_unstarted(_engine(tmp_path, "b", share_prefill=False), jobs)
    for a, b in zip(separate, shared):
        _assert_same(a, b)
    assert shared[0].token_ids == shared[2].token_ids


def test_a_step_and_a_prefill_in_one_pass_equal_them_apart():
    """``FusedDecoder.forward`` with both parts (prompts joining a running batch) gives the
    logits, keys/values and captured states of the decode step and the prefill run apart."""
    model = tiny_loaded().model
    decoder = FusedDecoder(model, [0, 2])
    running = torch.tensor([[0, 5, 6, 7], [9, 10, 11, 12]])
    running_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    joining = torch.tensor([[0, 0, 20, 21], [30, 31, 32, 33], [0, 0, 0, 40]])
    joining_mask = (joining != 0).long()

    def positions(mask):
        return (mask.cumsum(-1) - 1).clamp(min=0)

    def running_cache():
        _, kv, _ = decoder.prefill(running, running_mask, positions(running_mask), False)
        cache = SlotKVCache(len(kv), 4)
        cache.admit(kv, running_mask)
        return cache

    step_ids, step_positions = torch.tensor([[3], [4]]), positions(running_mask)[:, -1:] + 1
    apart_cache = running_cache()
    step = decoder.step(step_ids, step_positions, apart_cache, apart_cache.step_mask(1), True)
    prefill = decoder.prefill(joining, joining_mask, positions(joining_mask), True)
    together_cache = running_cache()
    both = decoder.forward(
        True,
        step=(step_ids, step_positions, together_cache, together_cache.step_mask(1)),
        prefill=(joining, joining_mask, positions(joining_mask)),
    )
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both[0], step[0], **close)
    torch.testing.assert_close(both[1], step[1], **close)
    torch.testing.assert_close(both[2], prefill[0], **close)
    for (k1, v1), (k2, v2) in zip(both[3], prefill[1]):
        torch.testing.assert_close(k1, k2, **close)
        torch.testing.assert_close(v1, v2, **close)
    real = joining_mask.bool()
    torch.testing.assert_close(both[4][real], prefill[2][real], **close)
    for mine, theirs in zip(together_cache.layers, apart_cache.layers):  # the step's column
        hi = apart_cache.hi
        torch.testing.assert_close(mine.keys[:2, :, hi], theirs.keys[:2, :, hi], **close)
