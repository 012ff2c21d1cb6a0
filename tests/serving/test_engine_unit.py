"""The batching engine on a tiny random model: batching must not change results."""

import torch
from hallulog.serving.capture import SpoolWriter
from hallulog.serving.engine import Engine, SamplingParams
from hallulog.serving.metrics import ServingMetrics
from safetensors.torch import load_file

from tests.serving.tiny import tiny_loaded

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20], [30, 31, 32, 33]]


def make_engine(tmp_path=None, **kw):
    spool = SpoolWriter(tmp_path / "spool") if tmp_path is not None else None
    engine = Engine(
        tiny_loaded(eos=frozenset({63})),
        spool=spool,
        capture_layers=[0, 1, 2] if spool else None,
        metrics=ServingMetrics("tiny"),
        **kw,
    )
    engine.start()
    return engine


def run_alone(engine, prompts, params):
    return [engine.submit(p, params).result(timeout=60) for p in prompts]


def run_together(engine, prompts, params):
    futures = [engine.submit(p, params) for p in prompts]
    return [f.result(timeout=60) for f in futures]


def test_batched_greedy_equals_one_at_a_time():
    engine = make_engine(max_batch_size=8, batch_wait_ms=50)
    try:
        params = SamplingParams(max_tokens=6, temperature=0.0, top_logprobs=3)
        alone = run_alone(engine, PROMPTS, params)
        together = run_together(engine, PROMPTS, params)
        for a, b in zip(alone, together):
            assert a.token_ids == b.token_ids
            assert len(a.logprobs) == len(a.token_ids) == 6 and a.finish_reason == "length"
            for x, y in zip(a.logprobs, b.logprobs):
                assert abs(x.logprob - y.logprob) < 1e-4 and abs(x.logit - y.logit) < 1e-4
                assert len(x.top) == 3 and x.top[0][1] >= x.top[1][1] >= x.top[2][1]
                assert x.token_id == x.top[0][0]  # greedy picks the top token
        assert max(_observed_batches(engine.metrics)) > 1
    finally:
        engine.stop()


def _observed_batches(metrics):
    samples = metrics.registry.get_sample_value
    counts = {}
    previous = 0.0
    for le in (1, 2, 3, 4, 6, 8):
        value = samples(
            "hallulog_serving_batch_size_bucket", {"le": f"{le}.0", "model_name": "tiny"}
        )
        counts[le] = value - previous
        previous = value
    return [le for le, c in counts.items() if c > 0]


def test_seeded_sampling_is_independent_of_the_batch():
    engine = make_engine(max_batch_size=8, batch_wait_ms=50)
    try:
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=1234)
        alone = run_alone(engine, PROMPTS[:2], params)
        together = run_together(engine, PROMPTS[:2] + PROMPTS[:2], params)
        assert [o.token_ids for o in together] == [o.token_ids for o in alone] * 2
        others = {
            tuple(run_alone(engine, PROMPTS[:1], SamplingParams(max_tokens=8, seed=s))[0].token_ids)
            for s in range(5)
        }
        assert len(others) > 1
    finally:
        engine.stop()


def test_stop_conditions():
    engine = make_engine()
    try:
        greedy = run_alone(engine, PROMPTS[:1], SamplingParams(max_tokens=6, temperature=0))[0]
        third = f"<{greedy.token_ids[2]}>"
        stopped = run_alone(
            engine, PROMPTS[:1], SamplingParams(max_tokens=6, temperature=0, stop=(third,))
        )[0]
        cut = greedy.text.index(third)
        assert stopped.text == greedy.text[:cut] and stopped.finish_reason == "stop"
        assert stopped.stop_reason == third
        assert stopped.token_ids == greedy.token_ids[: len(stopped.token_ids)]
        # EOS: make the greedy third token an end-of-sequence token
        eos_engine = Engine(tiny_loaded(eos=frozenset({greedy.token_ids[2]})))
        eos_engine.start()
        out = run_alone(eos_engine, PROMPTS[:1], SamplingParams(max_tokens=6, temperature=0))[0]
        eos_engine.stop()
        assert out.token_ids == greedy.token_ids[:3] and out.finish_reason == "stop"
        assert out.stop_reason is None
    finally:
        engine.stop()


def test_capture_is_all_fed_tokens_and_matches_transformers(tmp_path):
    engine = make_engine(tmp_path, max_batch_size=8, batch_wait_ms=50)
    try:
        params = SamplingParams(max_tokens=5, temperature=0, capture=True)
        outs = run_together(engine, PROMPTS, params)
        model = engine.model
        for out in outs:
            data = load_file(out.hidden_states_path)
            fed = out.prompt_token_ids + out.token_ids[:-1]
            assert data["token_ids"].tolist() == fed
            assert data["hidden_states"].shape == (len(fed), 3, 32)
            with torch.no_grad():
                ref = model(torch.tensor([fed]), output_hidden_states=True).hidden_states
            for k in range(2):
                torch.testing.assert_close(
                    data["hidden_states"][:, k], ref[k][0], rtol=1e-4, atol=1e-5
                )
            torch.testing.assert_close(
                model.model.norm(data["hidden_states"][:, 2]), ref[2][0], rtol=1e-4, atol=1e-5
            )
        # prefill-only: max_tokens=1 captures exactly the prompt
        one = run_alone(engine, PROMPTS[1:2], SamplingParams(max_tokens=1, capture=True))[0]
        assert load_file(one.hidden_states_path)["token_ids"].tolist() == PROMPTS[1]
    finally:
        engine.stop()


def test_bad_prompt_is_rejected():
    engine = Engine(tiny_loaded(max_model_len=8))
    for prompt in ([], [64], [-1], list(range(2, 10))):
        try:
            engine.submit(prompt, SamplingParams(max_tokens=1))
        except ValueError:
            continue
        raise AssertionError(f"accepted {prompt}")


def test_sequences_joining_a_running_batch_get_the_same_results(tmp_path):
    short = SamplingParams(max_tokens=3, temperature=0, capture=True)
    long = SamplingParams(max_tokens=12, temperature=0, top_logprobs=2, capture=True)
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=5, capture=True)
    first = PROMPTS[1]  # the longest prompt finishes first: its columns get trimmed
    joiners = [(PROMPTS[0], long), (PROMPTS[2], seeded), (PROMPTS[3], long)]
    engine = make_engine(tmp_path, max_batch_size=8)
    try:
        assert engine._joinable
        alone = [engine.submit(first, short).result(60)] + [
            engine.submit(p, params).result(60) for p, params in joiners
        ]
    finally:
        engine.stop()
    # drive an unstarted engine by hand: the joiners wait in the queue and join after step one
    engine = Engine(
        tiny_loaded(eos=frozenset({63})),
        spool=SpoolWriter(tmp_path / "spool"),
        capture_layers=[0, 1, 2],
        metrics=ServingMetrics("tiny"),
        max_batch_size=8,
    )
    head = engine.submit(first, short)
    head_seq = engine._queue.get_nowait()
    futures = [engine.submit(p, params) for p, params in joiners]
    with torch.inference_mode():
        engine._generate([head_seq])
    engine.stop()
    together = [f.result(5) for f in [head, *futures]]
    assert 4 in _observed_batches(engine.metrics)  # the head and three joiners decoded together
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        if a.logprobs:
            assert max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        sa, sb = load_file(a.hidden_states_path), load_file(b.hidden_states_path)
        assert torch.equal(sa["token_ids"], sb["token_ids"])
        torch.testing.assert_close(sa["hidden_states"], sb["hidden_states"], rtol=1e-4, atol=1e-5)


def test_a_failing_forward_pass_fails_every_waiting_request():
    engine = make_engine(max_batch_size=4, batch_wait_ms=50)
    try:

        def broken(*_args, **_kwargs):
            raise RuntimeError("out of memory (simulated)")

        engine._prefill = broken  # every path (fused or not) prefills first
        futures = [engine.submit(p, SamplingParams(max_tokens=3)) for p in PROMPTS]
        for future in futures:
            assert "simulated" in str(future.exception(timeout=30))
    finally:
        engine.stop()


def test_slots_are_reused_and_buffers_regrow(tmp_path, monkeypatch):
    """Two slots, six sequences of different lengths: finished rows are refilled by waiting ones;
    tiny headroom/growth force the cache to reallocate (long joiners, columns running out)."""
    import hallulog.serving.kvslots as kvslots

    monkeypatch.setattr(kvslots, "HEADROOM", 1)
    monkeypatch.setattr(kvslots, "GROWTH", 2)
    jobs = [
        (PROMPTS[2], SamplingParams(max_tokens=2, temperature=0, capture=True)),
        (PROMPTS[1], SamplingParams(max_tokens=9, temperature=0, top_logprobs=2, capture=True)),
        (PROMPTS[0], SamplingParams(max_tokens=4, temperature=1.0, seed=3, capture=True)),
        (PROMPTS[1] + PROMPTS[3], SamplingParams(max_tokens=7, temperature=0, top_logprobs=1)),
        (PROMPTS[3], SamplingParams(max_tokens=1, temperature=0, capture=True)),
        (PROMPTS[0], SamplingParams(max_tokens=11, temperature=0, capture=True)),
    ]
    engine = make_engine(tmp_path)
    try:
        alone = [engine.submit(p, params).result(60) for p, params in jobs]
    finally:
        engine.stop()
    engine = Engine(
        tiny_loaded(eos=frozenset({63})),
        spool=SpoolWriter(tmp_path / "spool"),
        capture_layers=[0, 1, 2],
        metrics=ServingMetrics("tiny"),
        max_batch_size=2,
    )
    futures = [engine.submit(p, params) for p, params in jobs]
    head = engine._queue.get_nowait()
    with torch.inference_mode():
        engine._generate([head])
    engine.stop()
    together = [f.result(5) for f in futures]
    assert max(_observed_batches(engine.metrics)) == 2
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        if a.logprobs:
            assert max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
            assert [t for t, _ in a.logprobs[0].top] == [t for t, _ in b.logprobs[0].top]
        if a.hidden_states_path:
            sa, sb = load_file(a.hidden_states_path), load_file(b.hidden_states_path)
            assert torch.equal(sa["token_ids"], sb["token_ids"])
            torch.testing.assert_close(
                sa["hidden_states"], sb["hidden_states"], rtol=1e-4, atol=1e-5
            )
