"""Streaming PyTorch Dataset over a WebDataset export (see exports/wds.py, docs/formats/wds.md).

Kept apart from exports/wds.py so that exporting never imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np
from hallulog.exports.wds import decode_npy, iter_wds_records, read_wds_manifest
from hallulog.storage._layer_draw import draw_layers
from hallulog.storage.dtypes import as_container, to_tensor
from hallulog.storage.errors import CorruptShardError


def _torch_iterable():
    from torch.utils.data import IterableDataset

    return IterableDataset


class WdsPairsDataset(_torch_iterable()):
    """Streams a WDS export; each record → ``layers_per_sample`` random layers, all tokens.

    Item: the dict of ``ActivationPairsDataset`` (``acts`` (k, T, H), ``layers``, ``layer_pos``,
    ``label``, ``seq_len``, ``prompt_len``, ``response_len``, ``index`` = sample_index); for a
    given (seed, epoch, sample index) the layers and tensors are the same. Order: shards are
    permuted per (seed, epoch) and split over DataLoader workers (records are split instead when
    there are fewer shards than workers), then a shuffle buffer of ``shuffle_buffer`` records
    mixes them (``0`` = stream order). Each record is read once per epoch.
    """

    def __init__(
        self,
        path,
        layers_per_sample: int = 2,
        seed: int = 0,
        shuffle_buffer: int = 64,
        layer_positions=None,
        backend: str = "tarfile",
    ):
        self.path = os.fspath(path)
        self.manifest = read_wds_manifest(self.path)
        self.layers_per_sample = int(layers_per_sample)
        self.seed, self.epoch = int(seed), 0
        self.shuffle_buffer = int(shuffle_buffer)
        self.backend = backend
        L = len(self.manifest["layer_ids"])
        self.layer_positions = (
            np.arange(L) if layer_positions is None else np.asarray(layer_positions)
        )
        if self.layers_per_sample > len(self.layer_positions):
            raise ValueError(
                f"{self.layers_per_sample} layers per sample but the export has {len(self.layer_positions)}"
            )
        self.layer_ids = np.asarray(self.manifest["layer_ids"])

    def __len__(self) -> int:
        return int(self.manifest["num_records"])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def layers_for(self, index: int) -> np.ndarray:
        """The same positions as ``ActivationPairsDataset.layers_for`` gives this index."""
        pick = draw_layers(
            self.seed, self.epoch, [int(index)], len(self.layer_positions), self.layers_per_sample
        )[0]
        return np.asarray(self.layer_positions)[pick]

    def _records(self) -> Iterator[dict]:
        from torch.utils.data import get_worker_info

        wi = get_worker_info()
        wid, nw = (wi.id, wi.num_workers) if wi is not None else (0, 1)
        shards = [s["file"] for s in self.manifest["shards"]]
        order = np.random.default_rng((self.seed, self.epoch)).permutation(len(shards))
        if len(shards) >= nw:
            mine, rec_filter = [shards[k] for k in order[wid::nw]], None
        else:
            mine, rec_filter = [shards[k] for k in order], (wid, nw)
        n = 0
        for name in mine:
            for rec in iter_wds_records(os.path.join(self.path, name), self.backend):
                if rec_filter is None or n % rec_filter[1] == rec_filter[0]:
                    yield rec
                n += 1

    def _shuffled(self) -> Iterator[dict]:
        from torch.utils.data import get_worker_info

        wi = get_worker_info()
        rng = np.random.default_rng((self.seed, self.epoch, 1 + (wi.id if wi is not None else 0)))
        buf: list[dict] = []
        for rec in self._records():
            if len(buf) < self.shuffle_buffer:
                buf.append(rec)
                continue
            j = int(rng.integers(len(buf)))
            buf[j], rec = rec, buf[j]
            yield rec
        rng.shuffle(buf)
        yield from buf

    def decode(self, rec: dict) -> dict:
        """One raw record → the training item (picks the layers, copies only those)."""
        import torch

        key = rec.get("__key__", "?")
        try:
            meta = json.loads(rec["meta.json"])
            dtype = self.manifest["dtype"]
            pa = decode_npy(rec["prompt_acts.npy"], f"{key}.prompt_acts.npy", dtype)
            ra = decode_npy(rec["response_acts.npy"], f"{key}.response_acts.npy", dtype)
        except KeyError as e:
            raise CorruptShardError(f"record {key} lacks member {e}", self.path) from None
        idx, p, r = int(meta["sample_index"]), int(meta["prompt_len"]), int(meta["response_len"])
        pos = self.layers_for(idx)
        acts = np.empty((len(pos), p + r, pa.shape[2]), pa.dtype)
        words = as_container(acts)  # bfloat16: copied as uint16 words
        words[:, :p] = as_container(pa)[pos, :p]
        words[:, p:] = as_container(ra)[pos, :r]
        return {
            "acts": to_tensor(acts),
            "layers": torch.from_numpy(self.layer_ids[pos].astype(np.int64)),
            "layer_pos": torch.from_numpy(pos.astype(np.int64)),
            "label": torch.tensor(int(meta["hallu_label"]), dtype=torch.int64),
            "seq_len": torch.tensor(p + r, dtype=torch.int64),
            "prompt_len": torch.tensor(p, dtype=torch.int64),
            "response_len": torch.tensor(r, dtype=torch.int64),
            "index": torch.tensor(idx, dtype=torch.int64),
        }

    def __iter__(self):
        for rec in self._shuffled() if self.shuffle_buffer > 0 else self._records():
            yield self.decode(rec)


__all__ = ["WdsPairsDataset"]
