"""``saev``: export to saev's sharded activation file protocol (seed 001) and read it back.

Normative description: docs/formats/saev.md. Layout::

    <dump_to>/<HASH>/metadata.json  shards.json  acts000000.bin …  hallulog_examples.jsonl

``HASH = sha256(json.dumps(metadata, sort_keys=True, separators=(",", ":")))``. Every shard is
one C-order ``(n_examples_in_shard, len(layers), tokens_per_ex, d_model)`` array of raw bytes.
Our token axis is ragged, so each sample is cut to a window of at most ``tokens_per_ex`` rows
(``align="left"``: the first rows, zeros after; ``"right"``: the last rows, zeros before) and
the sidecar ``hallulog_examples.jsonl`` records where the window came from. ``metadata.data``
is a JSON description of the source, never a pickle; the reader refuses pickled ``data``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import numpy as np

from ._io import atomic_write_bytes, fsync_dir, malformed_is_manifest_error, write_all
from .base import ActivationReader
from .errors import CorruptShardError, ManifestError, StorageError

log = logging.getLogger(__name__)

__all__ = ["export_saev", "SaevReader", "metadata_hash", "PROTOCOL_F32", "PROTOCOL_F16"]

PROTOCOL_F32 = "2.1"
#: hallulog extension: float16 shards (itemsize 2 in §4.2); a minor bump, nothing else changes
PROTOCOL_F16 = "2.2"
DEFAULT_PATCHES_PER_SHARD = 2_400_000
SIDECAR = "hallulog_examples.jsonl"

#: metadata.json keys (docs/formats/saev.md, table "metadata.json"), seed 001 §2.1
METADATA_FIELDS = (
    "family", "ckpt", "layers", "patches_per_ex", "cls_token", "d_model", "n_examples",
    "patches_per_shard", "data", "dataset", "dtype", "protocol",
)
#: shards.json entries (table "shards.json"), seed 001 §2.2
SHARD_FIELDS = ("name", "n_examples")
#: metadata.data keys (table "data")
DATA_FIELDS = ("kind", "source_format", "num_samples", "layer_positions", "align", "sidecar")
#: sidecar lines (table "hallulog_examples.jsonl")
SIDECAR_FIELDS = ("example", "sample_key", "seq_len", "prompt_len", "response_len", "label",
                  "src_start", "tok_start", "kept")


def metadata_hash(metadata: dict) -> str:
    return hashlib.sha256(json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def shard_name(k: int) -> str:
    return f"acts{k:06d}.bin"


def examples_per_shard(patches_per_shard: int, tokens_per_ex: int, n_layers: int) -> int:
    """Seed 001 §3 (cls_token false, so tokens_per_ex = patches_per_ex)."""
    return patches_per_shard // (tokens_per_ex * n_layers)


def window(seq_len: int, tokens_per_ex: int, align: str) -> tuple[int, int, int]:
    """``(src_start, tok_start, kept)``: token ``tok_start + j`` holds source row ``src_start + j``."""
    kept = min(seq_len, tokens_per_ex)
    if align == "left":
        return 0, 0, kept
    if align == "right":
        return seq_len - kept, tokens_per_ex - kept, kept
    raise ValueError(f"align must be 'left' or 'right', got {align!r}")


def export_saev(src, dump_to, tokens_per_ex: int, patches_per_shard: int = DEFAULT_PATCHES_PER_SHARD,
                dtype: str = "float32", layers=None, align: str = "left", ckpt: str = "",
                family: str = "llm", overwrite: bool = False) -> str:
    """Write the store at ``src`` as a saev shard directory under ``dump_to``; returns its path.

    ``layers``: model layer ids to export (default every stored layer). ``dtype``: ``float32``
    (protocol 2.1) or ``float16`` (protocol 2.2, the hallulog extension). Each shard is written
    to ``.tmp`` and renamed; ``shards.json`` is written last and marks the export complete.
    """
    from .registry import open_store

    reader = src if isinstance(src, ActivationReader) else open_store(src)
    dt = np.dtype(dtype)
    if dt not in (np.dtype("float32"), np.dtype("float16")):
        raise ValueError(f"saev dtype must be float32 or float16, got {dtype}")
    tokens_per_ex = int(tokens_per_ex)
    if tokens_per_ex < 1:
        raise ValueError("tokens_per_ex must be >= 1")
    window(0, tokens_per_ex, align)  # validates align
    layer_ids = list(reader.layer_ids) if layers is None else [int(x) for x in layers]
    missing = [x for x in layer_ids if x not in reader.layer_ids]
    if missing:
        raise StorageError(f"layers {missing} are not stored (stored: {reader.layer_ids})", reader.path)
    positions = [reader.layer_ids.index(x) for x in layer_ids]
    L, D, n = len(layer_ids), reader.hidden_size, len(reader)
    per_shard = examples_per_shard(patches_per_shard, tokens_per_ex, L)
    if per_shard < 1:
        raise ValueError(f"patches_per_shard={patches_per_shard} holds no example of "
                         f"{tokens_per_ex} tokens x {L} layers")
    metadata = {
        "family": family, "ckpt": ckpt, "layers": layer_ids, "patches_per_ex": tokens_per_ex,
        "cls_token": False, "d_model": D, "n_examples": n, "patches_per_shard": int(patches_per_shard),
        "data": {"kind": "hallulog.activation_store", "source_format": type(reader).__name__,
                 "num_samples": n, "layer_positions": positions, "align": align, "sidecar": SIDECAR},
        "dataset": os.path.abspath(reader.path), "dtype": dt.name,
        "protocol": PROTOCOL_F32 if dt == np.dtype("float32") else PROTOCOL_F16,
    }
    out = os.path.join(os.fspath(dump_to), metadata_hash(metadata))
    if os.path.exists(os.path.join(out, "shards.json")) and not overwrite:
        raise StorageError("an export with this exact metadata exists (pass overwrite=True to redo it)", out)
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "shards.json")):
        os.unlink(os.path.join(out, "shards.json"))
    atomic_write_bytes(os.path.join(out, "metadata.json"), (json.dumps(metadata, indent=2) + "\n").encode())
    shards = []
    buf = np.zeros((L, tokens_per_ex, D), dt)
    side_tmp = os.path.join(out, SIDECAR + ".tmp")
    with open(side_tmp, "w", encoding="utf-8") as side:
        for k, start in enumerate(range(0, n, per_shard)):
            stop = min(n, start + per_shard)
            path = os.path.join(out, shard_name(k))
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for i in range(start, stop):
                    m = reader.meta(i)
                    s0, t0, kept = window(m["seq_len"], tokens_per_ex, align)
                    buf[...] = 0
                    for j, a in enumerate(reader.read_pairs([i] * L, positions)):
                        buf[j, t0:t0 + kept] = a[s0:s0 + kept]
                    write_all(fd, buf)
                    side.write(json.dumps({"example": i, "sample_key": m["sample_key"], "seq_len": m["seq_len"],
                                           "prompt_len": m["prompt_len"], "response_len": m["response_len"],
                                           "label": m["label"], "src_start": s0, "tok_start": t0,
                                           "kept": kept}) + "\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(path + ".tmp", path)
            shards.append({"name": shard_name(k), "n_examples": stop - start})
        side.flush()
        os.fsync(side.fileno())
    os.replace(side_tmp, os.path.join(out, SIDECAR))
    fsync_dir(out)
    atomic_write_bytes(os.path.join(out, "shards.json"), (json.dumps(shards, indent=2) + "\n").encode())
    log.info("wrote %d examples in %d saev shards to %s", n, len(shards), out)
    return out


class SaevReader(ActivationReader):
    """Reads a saev shard directory with numpy memmaps (opened lazily per process).

    Protocol side: ``locate(ex, layer, token) -> (file, byte offset)`` (§4.2), ``vector``,
    ``example(ex, layer) -> (tokens_per_ex, d_model)``; ``layer`` is a *model layer id* and must
    be in ``metadata.layers``. Store side (``ActivationReader``): ``read(i, layer_pos)`` returns
    the ``kept`` real rows of the window (padding dropped) and ``meta(i)`` the sidecar's lengths.
    """

    _unpicklable = ActivationReader._unpicklable + ("_maps", "_maps_pid")

    @malformed_is_manifest_error
    def __init__(self, path, check_hash: bool = True):
        self.path = os.fspath(path)
        mpath = os.path.join(self.path, "metadata.json")
        spath = os.path.join(self.path, "shards.json")
        md = self._json(mpath)
        shards = self._json(spath, "export not finished (shards.json is written last)")
        missing = [k for k in METADATA_FIELDS if k not in md]
        if missing:
            raise ManifestError(f"metadata lacks {missing}", mpath)
        if not isinstance(md["data"], dict):
            raise ManifestError("metadata 'data' is not a JSON object (a base64 pickle?); "
                                "refusing to unpickle it", mpath)
        major = str(md["protocol"]).split(".")[0]
        if major != "2":
            raise ManifestError(f"protocol {md['protocol']} has a different major version than 2.x", mpath)
        if check_hash and metadata_hash(md) != os.path.basename(os.path.normpath(self.path)):
            raise ManifestError("directory name is not the sha256 of metadata.json (config drift?)", mpath)
        if md["cls_token"]:
            raise ManifestError("cls_token true is not produced by hallulog; this reader does not handle it", mpath)
        self.metadata, self.shards = md, shards
        self.layers = list(md["layers"])
        self.layer_ids = self.layers
        self.hidden_size = self.d_model = int(md["d_model"])
        self.tokens_per_ex = int(md["patches_per_ex"])
        self.dtype = np.dtype(md["dtype"])
        self.n_examples = int(md["n_examples"])
        counts = [int(s["n_examples"]) for s in shards]
        if sum(counts) != self.n_examples:
            raise ManifestError(f"shards hold {sum(counts)} examples, metadata says {self.n_examples}", spath)
        self.examples_per_shard = examples_per_shard(int(md["patches_per_shard"]), self.tokens_per_ex, len(self.layers))
        if any(c != self.examples_per_shard for c in counts[:-1]) or (counts and counts[-1] > self.examples_per_shard):
            raise ManifestError(f"shard sizes {counts} disagree with examples_per_shard={self.examples_per_shard}", spath)
        ex_bytes = len(self.layers) * self.tokens_per_ex * self.d_model * self.dtype.itemsize
        for s in shards:
            p = os.path.join(self.path, s["name"])
            if not os.path.exists(p):
                raise CorruptShardError("shard file is missing", p)
            if os.path.getsize(p) != int(s["n_examples"]) * ex_bytes:
                raise CorruptShardError(f"size {os.path.getsize(p)} != {s['n_examples']} examples x {ex_bytes} bytes", p)
        self._side = self._sidecar(os.path.join(self.path, md["data"].get("sidecar", SIDECAR)))

    @staticmethod
    def _json(path, hint: str = ""):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            raise ManifestError(f"missing{': ' + hint if hint else ''}", path) from None
        except ValueError as e:
            raise ManifestError(f"unparsable JSON ({e})", path) from None

    def _sidecar(self, path) -> list[dict] | None:
        if not os.path.exists(path):
            return None
        rows = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise ManifestError("unparsable sidecar line", path, line=n) from None
        if len(rows) != self.n_examples:
            raise ManifestError(f"sidecar has {len(rows)} lines for {self.n_examples} examples", path)
        return rows

    # ---- protocol side (§4.2) -------------------------------------------------------------
    def layer_index(self, layer: int) -> int:
        try:
            return self.layers.index(int(layer))
        except ValueError:
            raise KeyError(f"layer {layer} is not in this export's layers {self.layers}") from None

    def locate(self, ex: int, layer: int, token: int) -> tuple[str, int]:
        """Seed 001 §4.2: the shard file and byte offset of vector ``[ex, layer, token]``."""
        if not 0 <= ex < self.n_examples:
            raise IndexError(f"example {ex} out of range for {self.n_examples}")
        if not 0 <= token < self.tokens_per_ex:
            raise IndexError(f"token {token} out of range for tokens_per_ex={self.tokens_per_ex}")
        li = self.layer_index(layer)
        S, L, T = self.examples_per_shard, len(self.layers), self.tokens_per_ex
        shard, ex_in_shard = divmod(ex, S)
        offset_in_vectors = ex_in_shard * L * T + li * T + token
        return os.path.join(self.path, shard_name(shard)), offset_in_vectors * self.d_model * self.dtype.itemsize

    def _map(self, shard: int) -> np.ndarray:
        maps = self.__dict__.get("_maps")
        if maps is None or self.__dict__.get("_maps_pid") != os.getpid():
            maps = self._maps = {}
            self._maps_pid = os.getpid()
        m = maps.get(shard)
        if m is None:
            n = int(self.shards[shard]["n_examples"])
            m = maps[shard] = np.memmap(os.path.join(self.path, shard_name(shard)), dtype=self.dtype, mode="r",
                                        shape=(n, len(self.layers), self.tokens_per_ex, self.d_model))
        return m

    def example(self, ex: int, layer: int) -> np.ndarray:
        """``(tokens_per_ex, d_model)`` of example ``ex`` at model layer ``layer``, padding included."""
        self.locate(ex, layer, 0)
        shard, j = divmod(ex, self.examples_per_shard)
        return np.array(self._map(shard)[j, self.layer_index(layer)])

    def vector(self, ex: int, layer: int, token: int) -> np.ndarray:
        self.locate(ex, layer, token)
        shard, j = divmod(ex, self.examples_per_shard)
        return np.array(self._map(shard)[j, self.layer_index(layer), token])

    # ---- store side (ActivationReader) ----------------------------------------------------
    def __len__(self) -> int:
        return self.n_examples

    def meta(self, i: int) -> dict:
        """Lengths of the stored window: ``seq_len`` = ``kept``; the source's in ``source_*``."""
        i, _ = self._check_index(i, 0)
        if self._side is None:
            return {"sample_key": str(i), "seq_len": self.tokens_per_ex, "prompt_len": 0,
                    "response_len": self.tokens_per_ex, "label": -1}
        r = self._side[i]
        s0, kept = r["src_start"], r["kept"]
        p = max(0, min(r["prompt_len"], s0 + kept) - s0)
        return {"sample_key": r["sample_key"], "seq_len": kept, "prompt_len": p, "response_len": kept - p,
                "label": r["label"], "source_seq_len": r["seq_len"], "src_start": s0, "tok_start": r["tok_start"]}

    def read(self, i: int, layer: int) -> np.ndarray:
        i, layer = self._check_index(i, layer)
        m = self.meta(i)
        t0 = m.get("tok_start", 0)
        return self.example(i, self.layers[layer])[t0:t0 + m["seq_len"]]

    def close(self) -> None:
        self.__dict__.pop("_maps", None)
