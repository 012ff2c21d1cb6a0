"""The C decode-attention kernel: the attention of matmul and softmax over each row's own
columns, and an engine using it answers as the model's own forward does."""

import hallulog.serving.attention_kernel as attention_kernel
import pytest
import torch
from hallulog.serving.attention_kernel import decode_attention, load_kernel
from hallulog.serving.capture import SpoolWriter
from hallulog.serving.engine import Engine, SamplingParams
from safetensors.torch import load_file

from tests.serving.tiny import tiny_loaded

KERNEL = load_kernel()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="no C compiler to build the kernel")


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("groups,dim", [(3, 64), (1, 16), (4, 32)])
def test_kernel_equals_matmul_softmax_over_each_rows_columns(groups, dim):
    generator = torch.Generator().manual_seed(groups)
    rows, kv_heads, capacity, lo, end = 7, 2, 40, 5, 31
    keys = torch.randn(rows + 3, kv_heads, capacity, dim, generator=generator)
    values = torch.randn(rows + 3, kv_heads, capacity, dim, generator=generator)
    keys[:, :, :lo] = float("nan")  # left of every row's start: never read
    start = torch.tensor([lo, 9, 30, 12, 5, 20, 6])
    query = torch.randn(rows, kv_heads, groups, dim, generator=generator) * dim**-0.5
    got = decode_attention(KERNEL, query, keys, values, start, end)
    for r in range(rows):
        k, v = keys[r, :, start[r] : end], values[r, :, start[r] : end]
        want = torch.softmax(query[r] @ k.transpose(-1, -2), dim=-1) @ v
        torch.testing.assert_close(got[r], want, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_rows_prefix_entry_then_its_own_columns_equal_one_run_of_them():
    """Rows reading their prompt from a prefix entry (``prefix=``) get, to the bit, what they
    get with the entry's columns copied in front of their own."""
    generator = torch.Generator().manual_seed(5)
    rows, kv_heads, groups, dim, capacity, end = 4, 2, 3, 32, 24, 20
    pkeys = torch.randn(3, kv_heads, 11, dim, generator=generator)
    pvalues = torch.randn(3, kv_heads, 11, dim, generator=generator)
    entry, length = torch.tensor([2, 0, 2, 1]), torch.tensor([11, 4, 11, 7])
    keys = torch.randn(rows, kv_heads, capacity, dim, generator=generator)
    values = torch.randn(rows, kv_heads, capacity, dim, generator=generator)
    start = torch.tensor([12, 15, 19, 12])
    query = torch.randn(rows, kv_heads, groups, dim, generator=generator) * dim**-0.5
    got = decode_attention(
        KERNEL, query, keys, values, start, end, 1, (pkeys, pvalues, entry, length)
    )
    whole_k = torch.zeros(rows, kv_heads, 11 + capacity, dim)
    whole_v = torch.zeros_like(whole_k)
    whole_start = torch.zeros(rows, dtype=torch.int64)
    for r in range(rows):
        n, own = int(length[r]), end - int(start[r])
        at = 11 + capacity - own - n  # the row's columns end where its buffer ends
        whole_k[r, :, at : at + n] = pkeys[entry[r], :, :n]
        whole_v[r, :, at : at + n] = pvalues[entry[r], :, :n]
        whole_k[r, :, at + n :] = keys[r, :, start[r] : end]
        whole_v[r, :, at + n :] = values[r, :, start[r] : end]
        whole_start[r] = at
    want = decode_attention(KERNEL, query, whole_k, whole_v, whole_start, 11 + capacity)
    assert torch.equal(got, want)


def _loaded_16():
    """The tiny Llama with 16-wide heads (the kernel's smallest)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    loaded = tiny_loaded(eos=frozenset({63}))
    config = LlamaConfig(**{**loaded.model.config.to_dict(), "head_dim": 16})
    torch.manual_seed(0)
    loaded.model = LlamaForCausalLM(config).eval()
    return loaded


@needs_kernel
def test_an_engine_with_the_kernel_answers_as_the_models_own_forward(tmp_path, one_thread):
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20], [30, 31, 32, 33]]
    params = [
        SamplingParams(max_tokens=9, temperature=0, top_logprobs=3, capture=True),
        SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=4, capture=True),
    ]
    jobs = [(p, params[i % 2]) for i, p in enumerate(prompts * 2)]
    outs = {}
    for name, fused in (("kernel", True), ("plain", False)):
        engine = Engine(
            _loaded_16(),
            spool=SpoolWriter(tmp_path / name),
            capture_layers=[0, 1, 2],
            fused_decode=fused,
            max_batch_size=3,  # rows join and leave while others decode
        )
        assert (engine._fused is not None and engine._fused.kernel is not None) == fused
        engine.start()
        try:
            outs[name] = [f.result(60) for f in [engine.submit(p, sp) for p, sp in jobs]]
        finally:
            engine.stop()
    for a, b in zip(outs["plain"], outs["kernel"]):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs or [], b.logprobs or []):
            assert abs(x.logprob - y.logprob) < 1e-4
        sa, sb = load_file(a.hidden_states_path), load_file(b.hidden_states_path)
        torch.testing.assert_close(sa["hidden_states"], sb["hidden_states"], rtol=1e-4, atol=1e-5)


def test_the_kernel_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("HALLULOG_ATTENTION_KERNEL", "0")
    monkeypatch.setattr(attention_kernel, "_loaded", [])
    assert load_kernel() is None
