"""Attention summaries captured during generation (``serving/attention_capture.py``) equal the
post pass's definitions (``postrun/attention.py``) on the same tokens: through the C kernel and
through matmul attention, with shared prompts (prefix store), left padding and joining rows."""

import numpy as np
import pytest
import torch
from hallulog.postrun.attention import summaries
from hallulog.serving.capture import SpoolWriter
from hallulog.serving.decode import FusedDecoder
from hallulog.serving.engine import Engine, SamplingParams
from safetensors.torch import load_file

from tests.serving.tiny import tiny_loaded, tiny_model

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [5, 6, 7], [20], [30, 31, 32, 33]]


def _reference(prompt_ids, answer_ids) -> np.ndarray:
    model = tiny_model(head_dim=16)
    model.config._attn_implementation = "eager"
    ids = torch.tensor([list(prompt_ids) + list(answer_ids[:-1])])
    with torch.no_grad():
        maps = model(input_ids=ids, output_attentions=True).attentions
    return summaries(maps, [len(prompt_ids)], [ids.shape[1]])[0]


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "matmul"])
def test_in_pass_summaries_equal_the_post_pass(tmp_path, kernel):
    loaded = tiny_loaded(eos=frozenset({63}), head_dim=16)
    decoder = FusedDecoder(loaded.model, None, attention_kernel=kernel)
    assert (decoder.kernel is not None) == kernel
    engine = Engine(loaded, spool=SpoolWriter(tmp_path), decoder=decoder, max_batch_size=8)
    params = [
        SamplingParams(max_tokens=9 + i % 3, temperature=1.0, seed=i, attention=True)
        for i in range(len(PROMPTS))
    ]
    # an unstarted engine driven by hand: the last two join the running batch after its start
    futures = [engine.submit(p, sp) for p, sp in zip(PROMPTS, params)]
    head = [engine._queue.get_nowait() for _ in range(3)]
    with torch.inference_mode():
        engine._generate(head)
    engine.stop()
    for prompt, future in zip(PROMPTS, futures):
        out = future.result(5)
        stored = load_file(out.attention_path)
        assert stored["token_ids"].tolist() == prompt + out.token_ids
        got = stored["features"].numpy()
        want = _reference(prompt, out.token_ids)
        assert got.shape == want.shape == (len(out.token_ids), 2, 4, 5)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_no_summaries_unless_asked(tmp_path):
    loaded = tiny_loaded(eos=frozenset({63}), head_dim=16)
    engine = Engine(loaded, spool=SpoolWriter(tmp_path))
    engine.start()
    try:
        out = engine.submit([5, 6, 7], SamplingParams(max_tokens=4, temperature=0)).result(30)
    finally:
        engine.stop()
    assert out.attention_path is None
    assert not list(tmp_path.glob("attention-*"))
