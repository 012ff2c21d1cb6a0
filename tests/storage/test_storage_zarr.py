import json
import os

import numpy as np
import zarr
from hallulog.storage import merge_stores, open_store, open_writer

from tests.storage.conformance import StoreConformance, make_sample, persist


class TestZarrV2(StoreConformance):
    fmt = "zarr"
    dataloader_cases = [(0, None), (2, "fork")]  # zarr's event-loop thread after fork
    tensorstore_driver = "zarr"

    def assert_partial_on_disk(self, root):
        assert os.path.isdir(
            os.path.join(root, "activations", "activations.zarr", "arrays", "activations", "3")
        )

    def truncate_data(self, root):
        p = os.path.join(
            root, "activations", "activations.zarr", "arrays", "activations", "1", "2", "0", "0"
        )
        os.truncate(p, os.path.getsize(p) - 10)
        return p

    def corrupt_metadata(self, root):
        p = os.path.join(root, "activations", "activations.zarr", ".zmetadata")
        m = json.load(open(p))
        m["metadata"][".zattrs"]["dtype"] = "<f4"
        json.dump(m, open(p, "w"))
        json.dump(m["metadata"][".zattrs"], open(os.path.join(os.path.dirname(p), ".zattrs"), "w"))
        return os.path.join(root, "activations", "activations.zarr"), "dtype <f4"


class TestZarrV3Sharded(TestZarrV2):
    writer_options = {"zarr_format": 3, "sharded": True}
    dataloader_cases = [(2, "fork")]
    tensorstore_driver = ""  # fixed-length bytes (sample_key) is no zarr v3 core data type

    def assert_partial_on_disk(self, root):
        assert os.path.isdir(
            os.path.join(root, "activations", "activations.zarr", "arrays", "activations", "c", "3")
        )

    def truncate_data(self, root):
        p = os.path.join(
            root,
            "activations",
            "activations.zarr",
            "arrays",
            "activations",
            "c",
            "1",
            "0",
            "0",
            "0",
        )
        os.truncate(p, os.path.getsize(p) - 10)
        return p

    def corrupt_metadata(self, root):
        p = os.path.join(root, "activations", "activations.zarr", "zarr.json")
        m = json.load(open(p))
        m["attributes"]["dtype"] = "<f4"
        json.dump(m, open(p, "w"))
        return os.path.join(root, "activations", "activations.zarr"), "dtype <f4"


def test_plain_zarr_reads_seed_000_layout(tmp_path):
    L, H = 3, 64
    w = open_writer("zarr", tmp_path, layer_ids=[0, 5, 9], hidden_size=H, t_chunk=16)
    data = []
    for k in range(4):
        acts, meta = make_sample(k, L, H, t=10 + 9 * k)
        persist(w, tmp_path, f"k_{k}", acts, meta)
        data.append((acts, meta))
    w.close()
    g = zarr.open_consolidated(str(tmp_path / "activations" / "activations.zarr"), mode="r")
    a = g["arrays/activations"]
    assert a.shape == (4, L, 48, H) and a.chunks == (1, 1, 16, H) and a.dtype == np.float16
    assert a.metadata.compressor is None and a.metadata.filters is None and a.metadata.order == "C"
    assert (
        g.attrs["T_max"] == 48 and g.attrs["num_layers"] == L and g.attrs["layer_ids"] == [0, 5, 9]
    )
    for k, (acts, meta) in enumerate(data):
        t = int(g["arrays/seq_len"][k])
        assert t == acts.shape[1]
        np.testing.assert_array_equal(a[k, :, :t, :], acts)
        assert not np.asarray(a[k, :, t:, :]).any()
        assert g["arrays/sample_key"][k] == f"k_{k}".encode()
        assert g["arrays/hallu_label"][k] == meta.label
        assert g["arrays/prompt_len"][k] == meta.prompt_len
    lines = (
        (tmp_path / "activations" / "activations.zarr" / "text" / "samples.jsonl")
        .read_text()
        .splitlines()
    )
    assert [json.loads(l)["sample_key"] for l in lines] == [f"k_{k}" for k in range(4)]


def test_physical_merge(tmp_path):
    want = {}
    for wid in range(2):
        w = open_writer("zarr", tmp_path / f"w{wid}", layer_ids=[0, 1], hidden_size=8)
        for k in range(3):
            acts, meta = make_sample(10 * wid + k, 2, 8)
            w.write(f"k_{10 * wid + k}", acts, meta)
            want[f"k_{10 * wid + k}"] = acts
        w.close()
    merge_stores([tmp_path / "w0", tmp_path / "w1"], tmp_path / "merged", "zarr")
    g = zarr.open_consolidated(
        str(tmp_path / "merged" / "activations" / "activations.zarr"), mode="r"
    )
    assert g["arrays/activations"].shape[0] == 6
    r = open_store(tmp_path / "merged")
    for i in range(6):
        key = r.meta(i)["sample_key"]
        np.testing.assert_array_equal(r.read_sample(i), want[key])
