import json
import os

import numpy as np
from hallulog.storage import open_store, open_writer

from tests.storage.conformance import StoreConformance, check_store, make_sample, persist


class TestNpy(StoreConformance):
    fmt = "npy"
    rollback_any_subset = True
    replaces_existing = True

    def assert_partial_on_disk(self, root):
        assert os.path.exists(os.path.join(root, "activations", "k_3.npy.tmp"))

    def truncate_data(self, root):
        p = os.path.join(root, "activations", "k_2.npy")
        os.truncate(p, os.path.getsize(p) - 10)
        return p

    def corrupt_metadata(self, root):
        p = os.path.join(root, "activation_index.jsonl")
        lines = open(p).read().splitlines()
        lines[1] = lines[1][:-5]
        open(p, "w").write("\n".join(lines) + "\n")
        return f"{p}:2", "unparsable"


def test_reads_seed_003_lines_with_response_mode(tmp_path):
    """Mode `response`: row 0 is the last prompt token (row0_position = prompt_token_count - 1)."""
    w = open_writer("npy", tmp_path, layer_ids=[0, 1, 2], hidden_size=4, dtype="float32")
    acts = np.arange(3 * 6 * 4, dtype="float32").reshape(3, 6, 4)
    loc = w.write("abcd_0", acts, __import__("hallulog.storage").storage.SampleMeta(1, 5, -1))
    w.commit()
    line = {
        "prompt_id": "abcd",
        "sample_id": 0,
        "activation_key": "abcd_0",
        "layers": [0, 1, 2],
        "sequence_mode": "response",
        "prompt_token_count": 12,
        "response_token_count": 5,
        "row0_position": 11,
        "num_rows": 6,
        "worker_id": 0,
        **loc,
    }
    (tmp_path / "activation_index.jsonl").write_text(json.dumps(line) + "\n")
    r = open_store(tmp_path)
    assert r.meta(0) == {
        "sample_key": "abcd_0",
        "seq_len": 6,
        "prompt_len": 1,
        "response_len": 5,
        "label": -1,
    }
    np.testing.assert_array_equal(r.read(0, 1), acts[1])
    assert loc == {
        "file_path": "activations/abcd_0.npy",
        "shape": [3, 6, 4],
        "dtype": "float32",
        "size_bytes": 288,
    }
    assert np.array_equal(np.load(tmp_path / loc["file_path"]), acts)


def test_consolidated_layout(tmp_path):
    """A consolidated dir is the same layout: index lines + activations/ copied together."""
    data = {}
    for wid in range(2):
        w = open_writer("npy", tmp_path / f"worker_{wid}", layer_ids=[0, 1], hidden_size=4)
        for k in range(2):
            acts, meta = make_sample(10 * wid + k, 2, 4)
            persist(w, tmp_path / f"worker_{wid}", f"k_{10 * wid + k}", acts, meta)
            data[f"k_{10 * wid + k}"] = acts
    c = tmp_path / "consolidated"
    os.makedirs(c / "activations")
    with open(c / "activation_index.jsonl", "w") as out:
        for wid in range(2):
            src = tmp_path / f"worker_{wid}"
            out.write((src / "activation_index.jsonl").read_text())
            for n in os.listdir(src / "activations"):
                os.link(src / "activations" / n, c / "activations" / n)
    check_store(c, data)
