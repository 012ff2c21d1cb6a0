"""``saev``: export to saev's sharded activation files, as saev's own readers load them; read back.

Normative description: docs/formats/saev.md. Layout (``DST`` is new or empty)::

    DST/saev/shards/<HASH>/metadata.json  shards.json  acts000000.bin …  hallulog_samples.jsonl

Examples are *tokens*: every real token row of every sample is one saev example
(``content_tokens_per_example = 1``, ``cls_token = false``), so no padding row exists for an SAE
to train on. Each shard is one C-order float32 array ``(examples_per_shard, len(layers), 1,
d_model)``. The field names are the ones saev's code reads (``content_tokens_per_example``,
``max_tokens_per_shard``, ``pixel_agg``), not its protocol doc's (``patches_per_ex``,
``patches_per_shard``). ``metadata.data`` is a JSON *string* describing the source — never a
pickle; this reader never unpickles anything.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import json
import logging
import math
import os

import numpy as np

from hallulog.contracts.errors import MalformedLineError
from hallulog.contracts.jsonl import iter_lines

from hallulog.exports._export_dir import staged_dir
from hallulog.storage._io import atomic_write_bytes, malformed_is_manifest_error, write_all
from hallulog.storage.base import ActivationReader
from hallulog.storage.dtypes import to_float32
from hallulog.storage.errors import CorruptShardError, ManifestError, StorageError
from hallulog.storage.registry import open_store

log = logging.getLogger(__name__)

__all__ = ["export_saev", "SaevReader", "saev_hash", "plan_shards", "SAEV_FAMILIES", "FAMILY", "PROTOCOL",
           "SAEV_HEAD_COMMIT"]

PROTOCOL = "2.1"
#: the saev source this export was checked against (github.com/OSU-NLP-Group/saev, 2026-03-11)
SAEV_HEAD_COMMIT = "3d73f1f7122738563404e4c50a98d897aa18a7d0"
DTYPE = "float32"
PIXEL_AGG = "majority"
DEFAULT_MAX_TOKENS_PER_SHARD = 2_400_000
SIDECAR = "hallulog_samples.jsonl"
DATA_KIND = "hallulog.activation_store"
#: saev head's closed list (``saev.data.shards.Metadata.family``); it has no LLM family
SAEV_FAMILIES = ("bird-mae", "clip", "dinov2", "dinov3", "fake-clip", "pe-core", "pe-spatial", "siglip")
#: what we write: saev's placeholder family; no saev reader looks at it, ``ckpt`` names the LLM
FAMILY = "fake-clip"
#: the path saev asserts: ``.../saev/shards/<hash>``
SHARDS_SUBDIR = ("saev", "shards")

#: metadata.json keys, in saev head's ``Metadata`` order (docs table "metadata.json")
METADATA_FIELDS = (
    "family", "ckpt", "layers", "content_tokens_per_example", "cls_token", "d_model", "n_examples",
    "max_tokens_per_shard", "data", "dataset", "pixel_agg", "dtype", "protocol",
)
#: saev's protocol.md names for the fields its code renamed (docs table "renamed fields")
PROTOCOL_DOC_NAMES = {"content_tokens_per_example": "patches_per_ex", "max_tokens_per_shard": "patches_per_shard"}
#: shards.json entries (table "shards.json")
SHARD_FIELDS = ("name", "n_examples")
#: keys of the JSON object encoded in metadata.data (table "data")
DATA_FIELDS = ("kind", "source_format", "num_samples", "layer_positions", "example", "sidecar")
#: sidecar lines (table "hallulog_samples.jsonl")
SIDECAR_FIELDS = ("sample", "sample_key", "example_start", "seq_len", "prompt_len", "response_len", "label")


def saev_hash(metadata: dict) -> str:
    """saev head's ``Metadata.hash``: the first 8 hex digits of sha256 over the compact JSON.

    saev serializes its ``Metadata`` dataclass with orjson's ``OPT_SORT_KEYS``, which does not
    reorder dataclass fields: the keys stay in field order (``METADATA_FIELDS``), not sorted.
    """
    raw = json.dumps({k: metadata[k] for k in METADATA_FIELDS}, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:8]


def shard_name(k: int) -> str:
    return f"acts{k:06d}.bin"


def plan_shards(n_examples: int, n_layers: int, budget: int) -> tuple[int, int]:
    """``(examples_per_shard, max_tokens_per_shard)`` for ``n_examples`` one-token examples.

    At most ``budget`` tokens per shard; the examples are spread evenly over the fewest shards,
    and ``max_tokens_per_shard`` is written as exactly ``examples_per_shard * n_layers`` so saev's
    ``max_tokens_per_shard // (tokens_per_example * len(layers))`` gives back the same number.
    """
    per = int(budget) // int(n_layers)
    if per < 1:
        raise ValueError(f"max_tokens_per_shard: {budget} holds no example of 1 token x {n_layers} layers")
    n_shards = max(1, math.ceil(n_examples / per))
    s = max(1, math.ceil(n_examples / n_shards))
    return s, s * int(n_layers)


class _ShardStream:
    """Appends example rows ``(k, L, D)`` float32 across fixed-size shard files."""

    def __init__(self, out: str, per_shard: int, example_bytes: int):
        self.out, self.per_shard, self.example_bytes = out, per_shard, example_bytes
        self.shards: list[dict] = []
        self.fd, self.filled = None, 0

    def _open_next(self) -> None:
        self._close_current()
        self.fd = os.open(os.path.join(self.out, shard_name(len(self.shards))), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.filled = 0

    def _close_current(self) -> None:
        if self.fd is None:
            return
        # saev memory-maps every shard with the full shard shape: pre-size a short last shard
        # (a sparse zero tail past shards.json's n_examples, which no saev reader indexes)
        os.ftruncate(self.fd, self.per_shard * self.example_bytes)
        os.fsync(self.fd)
        os.close(self.fd)
        self.shards.append({"name": shard_name(len(self.shards)), "n_examples": self.filled})
        self.fd = None

    def write(self, rows: np.ndarray) -> None:
        k = 0
        while k < len(rows):
            if self.fd is None or self.filled == self.per_shard:
                self._open_next()
            take = min(len(rows) - k, self.per_shard - self.filled)
            write_all(self.fd, np.ascontiguousarray(rows[k:k + take]))
            self.filled += take
            k += take

    def close(self) -> list[dict]:
        self._close_current()
        return self.shards


def _sources(reader: ActivationReader, layers) -> tuple[list[int], list[int]]:
    """``(layer ids, their positions in the store)``; ``StorageError`` naming ``layers``."""
    layer_ids = list(reader.layer_ids) if layers is None else [int(x) for x in layers]
    missing = [x for x in layer_ids if x not in reader.layer_ids]
    if missing or not layer_ids:
        raise StorageError(f"layers: {missing or layer_ids} not stored (stored: {list(reader.layer_ids)})", reader.path)
    return layer_ids, [reader.layer_ids.index(x) for x in layer_ids]


def export_saev(src, dst, layers=None, max_tokens_per_shard: int = DEFAULT_MAX_TOKENS_PER_SHARD,
                ckpt: str = "", family: str = FAMILY) -> str:
    """Write the store at ``src`` for saev under the new directory ``dst``; returns the shards dir.

    The result is ``dst/saev/shards/<hash>`` (the layout saev asserts). ``layers``: model layer
    ids (default every stored layer). ``family`` must be one of ``SAEV_FAMILIES`` (saev type-checks
    it). Files are built in a temporary sibling of ``dst`` and renamed at the end.
    """
    if family not in SAEV_FAMILIES:
        raise ValueError(f"family: {family!r} is not one saev accepts {SAEV_FAMILIES}")
    reader = src if isinstance(src, ActivationReader) else open_store(src)
    layer_ids, positions = _sources(reader, layers)
    lengths = [int(reader.meta(i)["seq_len"]) for i in range(len(reader))]
    n_examples = sum(lengths)
    if n_examples == 0:
        raise StorageError("src: store has no activations (no sample has a token row)", reader.path)
    L, D = len(layer_ids), int(reader.hidden_size)
    per_shard, max_tokens = plan_shards(n_examples, L, max_tokens_per_shard)
    data = {"kind": DATA_KIND, "source_format": type(reader).__name__, "num_samples": len(reader),
            "layer_positions": positions, "example": "token", "sidecar": SIDECAR}
    metadata = {
        "family": family, "ckpt": ckpt, "layers": layer_ids, "content_tokens_per_example": 1,
        "cls_token": False, "d_model": D, "n_examples": n_examples, "max_tokens_per_shard": max_tokens,
        "data": json.dumps(data, sort_keys=True, separators=(",", ":")),
        "dataset": os.path.abspath(reader.path), "pixel_agg": PIXEL_AGG, "dtype": DTYPE, "protocol": PROTOCOL,
    }
    digest = saev_hash(metadata)
    with staged_dir(dst) as tmp:
        out = os.path.join(tmp, *SHARDS_SUBDIR, digest)
        os.makedirs(out)
        stream = _ShardStream(out, per_shard, L * D * 4)
        side, start = [], 0
        for i, t in enumerate(lengths):
            m = reader.meta(i)
            if t:
                acts = np.stack(reader.read_pairs([i] * L, positions))  # (L, t, D)
                stream.write(to_float32(acts).transpose(1, 0, 2))  # (t, L, D): one example per row
            side.append(json.dumps({"sample": i, "sample_key": m["sample_key"], "example_start": start,
                                    "seq_len": t, "prompt_len": m["prompt_len"],
                                    "response_len": m["response_len"], "label": m["label"]}) + "\n")
            start += t
        shards = stream.close()
        atomic_write_bytes(os.path.join(out, SIDECAR), "".join(side).encode())
        atomic_write_bytes(os.path.join(out, "metadata.json"), (json.dumps(metadata, indent=2) + "\n").encode())
        atomic_write_bytes(os.path.join(out, "shards.json"), (json.dumps(shards, indent=2) + "\n").encode())
    final = os.path.join(os.path.abspath(os.fspath(dst)), *SHARDS_SUBDIR, digest)
    log.info("wrote %d token examples of %d samples in %d saev shards to %s", n_examples, len(lengths),
             len(shards), final)
    return final


def _json(path: str, hint: str = ""):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ManifestError(f"missing{': ' + hint if hint else ''}", path) from None
    except ValueError as e:
        raise ManifestError(f"unparsable JSON ({e})", path) from None


def check_metadata(md: dict, path: str, check_hash: bool = True) -> dict:
    """What saev head's ``Metadata.load`` demands, plus hallulog's own ``data``; returns ``data``."""
    if set(md) != set(METADATA_FIELDS):
        raise ManifestError(f"metadata keys differ from saev's: missing {sorted(set(METADATA_FIELDS) - set(md))}, "
                            f"extra {sorted(set(md) - set(METADATA_FIELDS))}", path)
    if not isinstance(md["data"], str):
        raise ManifestError("metadata 'data' must be a string (saev type-checks it)", path)
    try:
        data = json.loads(md["data"])
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("kind") != DATA_KIND:
        raise ManifestError("metadata 'data' is not hallulog's JSON description (a base64 pickle written by "
                            "saev itself?); it is never unpickled", path)
    wrong = {k: md[k] for k, v in (("dtype", DTYPE), ("protocol", PROTOCOL), ("cls_token", False),
                                   ("content_tokens_per_example", 1), ("pixel_agg", PIXEL_AGG)) if md[k] != v}
    if md["family"] not in SAEV_FAMILIES:
        wrong["family"] = md["family"]
    if wrong:
        raise ManifestError(f"metadata values saev or this reader do not accept: {wrong}", path)
    if check_hash and saev_hash(md) != os.path.basename(os.path.dirname(path)):
        raise ManifestError("directory name is not the hash of metadata.json (config drift?)", path)
    return data


class SaevReader(ActivationReader):
    """Reads a saev export back: per-sample (``read``/``meta``) and per-example (``locate``, ``vector``).

    ``path`` is the ``.../saev/shards/<hash>`` directory. Shards are memory-mapped lazily per
    process with the full shard shape, as saev does.
    """

    _unpicklable = ActivationReader._unpicklable + ("_maps", "_maps_pid")

    @malformed_is_manifest_error
    def __init__(self, path, check_hash: bool = True):
        self.path = os.path.abspath(os.fspath(path))
        if tuple(self.path.split(os.sep)[-3:-1]) != SHARDS_SUBDIR:
            raise ManifestError("not a .../saev/shards/<hash> directory (saev asserts that layout)", self.path)
        mpath = os.path.join(self.path, "metadata.json")
        spath = os.path.join(self.path, "shards.json")
        md = _json(mpath)
        self.data = check_metadata(md, mpath, check_hash)
        self.shards = _json(spath, "export not finished")
        self.metadata = md
        self.layers = self.layer_ids = list(md["layers"])
        self.hidden_size = self.d_model = int(md["d_model"])
        self.dtype = np.dtype(DTYPE)
        self.n_examples = int(md["n_examples"])
        self.examples_per_shard = int(md["max_tokens_per_shard"]) // len(self.layers)
        counts = [int(s["n_examples"]) for s in self.shards]
        if sum(counts) != self.n_examples or any(c != self.examples_per_shard for c in counts[:-1]) \
                or (counts and not 0 < counts[-1] <= self.examples_per_shard):
            raise ManifestError(f"shard sizes {counts} disagree with n_examples={self.n_examples} and "
                                f"examples_per_shard={self.examples_per_shard}", spath)
        full = self.examples_per_shard * len(self.layers) * self.d_model * 4
        for k, s in enumerate(self.shards):
            p = os.path.join(self.path, s["name"])
            if s["name"] != shard_name(k) or not os.path.isfile(p):
                raise CorruptShardError("shard file is missing or misnamed", p)
            if os.path.getsize(p) != full:
                raise CorruptShardError(f"size {os.path.getsize(p)} != the full shard shape's {full} bytes", p)
        self._side = self._sidecar(os.path.join(self.path, self.data.get("sidecar", SIDECAR)))
        self._starts = [r["example_start"] for r in self._side]

    def _sidecar(self, path: str) -> list[dict]:
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        rows, start = [], 0
        try:
            for line in iter_lines(path):
                n, r = line.lineno, line.row
                if r.get("example_start") != start or r.get("sample") != n - 1:
                    raise ManifestError(f"sample {n - 1} should start at example {start}", path, line=n)
                start += int(r["seq_len"])
                rows.append(r)
        except MalformedLineError as exc:
            raise ManifestError("unparsable sidecar line", path, line=exc.line) from None
        if start != self.n_examples:
            raise ManifestError(f"sidecar rows sum to {start} examples, metadata says {self.n_examples}", path)
        return rows

    # ---- example side (saev's view) ------------------------------------------------------------
    def layer_index(self, layer: int) -> int:
        try:
            return self.layers.index(int(layer))
        except ValueError:
            raise KeyError(f"layer {layer} is not in this export's layers {self.layers}") from None

    def locate(self, ex: int, layer: int) -> tuple[str, int]:
        """The shard file and byte offset of example ``ex`` (one token) at model layer ``layer``."""
        if not 0 <= ex < self.n_examples:
            raise IndexError(f"example {ex} out of range for {self.n_examples}")
        shard, j = divmod(ex, self.examples_per_shard)
        off = (j * len(self.layers) + self.layer_index(layer)) * self.d_model * 4
        return os.path.join(self.path, shard_name(shard)), off

    def _map(self, shard: int) -> np.ndarray:
        if self.__dict__.get("_maps_pid") != os.getpid():
            self._maps, self._maps_pid = {}, os.getpid()
        m = self._maps.get(shard)
        if m is None:
            m = self._maps[shard] = np.memmap(os.path.join(self.path, shard_name(shard)), dtype=np.float32, mode="r",
                                              shape=(self.examples_per_shard, len(self.layers), 1, self.d_model))
        return m

    def vector(self, ex: int, layer: int) -> np.ndarray:
        """``(d_model,)`` of example ``ex`` at model layer ``layer``."""
        self.locate(ex, layer)
        shard, j = divmod(ex, self.examples_per_shard)
        return np.array(self._map(shard)[j, self.layer_index(layer), 0])

    def example_of(self, ex: int) -> tuple[int, int]:
        """``(sample, row)``: which sample and which of its rows example ``ex`` is."""
        i = bisect.bisect_right(self._starts, ex) - 1
        return i, ex - self._starts[i]

    # ---- sample side (ActivationReader) --------------------------------------------------------
    def __len__(self) -> int:
        return len(self._side)

    def meta(self, i: int) -> dict:
        i, _ = self._check_index(i, 0)
        r = self._side[i]
        return {k: r[k] for k in ("sample_key", "seq_len", "prompt_len", "response_len", "label")}

    def read(self, i: int, layer: int) -> np.ndarray:
        i, layer = self._check_index(i, layer)
        start, t = self._side[i]["example_start"], self._side[i]["seq_len"]
        out = np.empty((t, self.d_model), np.float32)
        k = 0
        while k < t:
            shard, j = divmod(start + k, self.examples_per_shard)
            take = min(t - k, self.examples_per_shard - j)
            out[k:k + take] = self._map(shard)[j:j + take, layer, 0]
            k += take
        return out

    def close(self) -> None:
        self.__dict__.pop("_maps", None)
        self.__dict__.pop("_maps_pid", None)
