import tempfile

import numpy as np
from hallulog.storage import SampleMeta, convert_store, open_store, open_writer
from hallulog.storage.dtypes import store_dtype
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.storage.conformance import check_store, persist

FORMATS = ["packed", "zarr", "npy"]


@settings(max_examples=6, deadline=None)
@given(
    src=st.sampled_from(FORMATS),
    dst=st.sampled_from(FORMATS),
    L=st.integers(1, 3),
    H=st.integers(1, 12),
    dtype=st.sampled_from(["float16", "float32", "bfloat16"]),
    lens=st.lists(st.integers(0, 30), max_size=4),
    seed=st.integers(0, 2**31),
)
def test_convert_roundtrip(src, dst, L, H, dtype, lens, seed):
    rng = np.random.default_rng(seed)
    with (
        tempfile.TemporaryDirectory() as a,
        tempfile.TemporaryDirectory() as b,
        tempfile.TemporaryDirectory() as c,
    ):
        w = open_writer(src, a, layer_ids=list(range(L)), hidden_size=H, dtype=dtype)
        open(f"{a}/activation_index.jsonl", "w").close()  # the worker creates it up front
        data, metas = {}, {}
        for k, t in enumerate(lens):
            acts = rng.standard_normal((L, t, H)).astype(store_dtype(dtype))
            p = int(rng.integers(0, t + 1))
            meta = SampleMeta(p, t - p, int(rng.integers(-1, 2)))
            persist(w, a, f"p{k:x}_{k}", acts, meta)
            data[f"p{k:x}_{k}"], metas[f"p{k:x}_{k}"] = acts, meta
        w.close()
        convert_store(a, b, dst)
        check_store(b, data, metas)
        convert_store(b, c, src)  # and back
        check_store(c, data, metas)
        if lens:
            assert open_store(c).dtype == store_dtype(dtype)


def test_convert_memory_is_bounded(tmp_path):
    """Peak traced memory stays near one sample while converting many."""
    import tracemalloc

    L, H = 4, 256
    w = open_writer("packed", tmp_path / "src", layer_ids=list(range(L)), hidden_size=H)
    rng = np.random.default_rng(0)
    one = L * 64 * H * 2
    for k in range(60):
        w.write(f"k_{k}", rng.standard_normal((L, 64, H)).astype("float16"), SampleMeta(32, 32))
    w.close()
    tracemalloc.start()
    convert_store(tmp_path / "src", tmp_path / "dst", "npy")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * one, (peak, one)
