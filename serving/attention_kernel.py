"""A fused decode-attention kernel in C over the slot KV cache, built once with the system's C
compiler and called through ``ctypes``; ``matmul`` attention where it cannot be built.

One decode step of grouped-query attention as two batched matrix products (scores, then the
weighted values) spends its time in per-matrix overhead (each row and key/value head is a
``[groups, head_dim] x [head_dim, columns]`` product) and reads every live column of every row,
including the columns left of a row's own tokens. The kernel reads each row's keys and values
once, only from the row's first real column, and computes the scores, the softmax and the
weighted sum of all the query heads of one key/value head in one pass (float32 throughout;
the sums in another order than ``matmul``, so results differ by rounding only).

It runs on the calling thread (no OpenMP): engines of an ``EnginePool`` with one intra-op
thread each call it side by side (``ctypes`` releases the GIL); an engine with more intra-op
threads cuts its rows into as many blocks, run at once on helper threads. ``decode_attention`` is None
when no compiler is found, the build fails, ``HALLULOG_ATTENTION_KERNEL=0`` is set, or the shape
does not fit (``head_dim`` a multiple of 16, at most 128; at most 16 query heads per key/value
head). The shared object goes to ``$HALLULOG_CACHE_DIR/kernels/`` under a name derived from the
source, the flags and the CPU, written to a temporary name and renamed.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

__all__ = ["load_kernel", "decode_attention", "kernel_fits"]

logger = logging.getLogger(__name__)

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUPS 16
#define MAX_CHUNKS 8 /* head_dim <= 128 */
typedef float v16 __attribute__((vector_size(64), aligned(4)));

static inline float hsum(v16 a) {
    float t = 0.f;
    for (int i = 0; i < 16; i++) t += a[i];
    return t;
}

/* The query heads of one key/value head over np prefix columns (kp, vp) then n - np own columns
   (k, v): q [groups, dim] (scaled), keys and values [columns, dim] (column stride dim), out
   [groups, dim]; s: groups * n floats. The columns are taken in that order, one by one, as if
   they were one run of n columns. With `summ` (a constant: two copies are compiled, the one
   without is the plain kernel), the summaries go to fo [groups, 5] and each weight on a column
   c >= p - 1 to dg[(c - p + 1) * ds + g]. */
static inline __attribute__((always_inline)) void
one_of(const float *q, const float *kp, const float *vp, int64_t np, const float *k,
       const float *v, int64_t n, int64_t groups, int64_t dim, float *out, float *s, const int summ,
       float *fo, float *dg, int64_t ds, int64_t p) {
    int64_t w = dim / 16;
    float m[MAX_GROUPS], inv[MAX_GROUPS];
    for (int64_t c = 0; c < n; c++) {
        const v16 *kc = (const v16 *)(c < np ? kp + c * dim : k + (c - np) * dim);
        for (int64_t g = 0; g < groups; g++) {
            const v16 *qg = (const v16 *)(q + g * dim);
            v16 acc = qg[0] * kc[0];
            for (int64_t i = 1; i < w; i++) acc += qg[i] * kc[i];
            float x = hsum(acc);
            s[g * n + c] = x;
            if (c == 0 || x > m[g]) m[g] = x;
        }
    }
    for (int64_t g = 0; g < groups; g++) {
        float *sg = s + g * n, total = 0.f;
        for (int64_t c = 0; c < n; c++) {
            float e = expf(sg[c] - m[g]);
            sg[c] = e;
            total += e;
        }
        inv[g] = 1.f / total;
        if (summ) {
            float ctx = 0.f;
            for (int64_t c = 0; c < n && c < p; c++) ctx += sg[c];
            fo[g * 5] = ctx * inv[g];
            fo[g * 5 + 1] = (total - ctx) * inv[g];
            fo[g * 5 + 2] = n > 1 ? sg[n - 2] * inv[g] : 0.f;
            fo[g * 5 + 3] = sg[n - 1] * inv[g];
            fo[g * 5 + 4] = 0.f;
            for (int64_t c = p > 0 ? p - 1 : 0; c < n; c++)
                dg[(c - p + 1) * ds + g] = sg[c] * inv[g];
        }
    }
    v16 acc[MAX_GROUPS * MAX_CHUNKS];
    memset(acc, 0, sizeof(v16) * groups * w);
    for (int64_t c = 0; c < n; c++) {
        const v16 *vc = (const v16 *)(c < np ? vp + c * dim : v + (c - np) * dim);
        for (int64_t g = 0; g < groups; g++) {
            float p = s[g * n + c];
            for (int64_t i = 0; i < w; i++) acc[g * w + i] += p * vc[i];
        }
    }
    for (int64_t g = 0; g < groups; g++)
        for (int64_t i = 0; i < w; i++) {
            v16 r = acc[g * w + i] * inv[g];
            memcpy(out + g * dim + i * 16, &r, sizeof(v16));
        }
}

static void one(const float *q, const float *kp, const float *vp, int64_t np, const float *k,
                const float *v, int64_t n, int64_t groups, int64_t dim, float *out, float *s) {
    one_of(q, kp, vp, np, k, v, n, groups, dim, out, s, 0, 0, 0, 0, 0);
}

static void one_summ(const float *q, const float *kp, const float *vp, int64_t np,
                     const float *k, const float *v, int64_t n, int64_t groups, int64_t dim,
                     float *out, float *s, float *fo, float *dg, int64_t ds, int64_t p) {
    one_of(q, kp, vp, np, k, v, n, groups, dim, out, s, 1, fo, dg, ds, p);
}

/* q, out: [rows, kv_heads, groups, dim] contiguous. keys, values: [rows, kv_heads, columns, dim]
   with row stride rs, head stride hs (in floats), column stride dim. Row r attends columns
   start[r] .. end - 1, after (when entry is not NULL) the first length[r] columns of prefix
   entry[r] of pkeys, pvalues ([entries, kv_heads, columns, dim], strides prs, phs). scratch:
   groups * (the most columns of a row) floats. feat (NULL: none): the attention summaries of
   layer `layer` of `layers`, [rows, layers, kv_heads * groups, 5] (context, generated, previous,
   self, 0) and each weight on a column c >= plen[r] - 1 at deg [rows, width, layers, kv_heads *
   groups], index c - plen[r] + 1 (a row's columns are its positions 0 .. n - 1). */
void decode_attention(const float *q, const float *keys, const float *values, int64_t rs,
                      int64_t hs, const int64_t *start, int64_t end, int64_t rows,
                      int64_t kv_heads, int64_t groups, int64_t dim, float *out, float *scratch,
                      const float *pkeys, const float *pvalues, int64_t prs, int64_t phs,
                      const int64_t *entry, const int64_t *length, float *feat, float *deg,
                      const int64_t *plen, int64_t layer, int64_t layers, int64_t width) {
    int64_t heads = kv_heads * groups, ds = layers * heads;
    for (int64_t r = 0; r < rows; r++) {
        int64_t c0 = start[r], np = entry ? length[r] : 0, pe = entry ? entry[r] : 0;
        for (int64_t h = 0; h < kv_heads; h++) {
            int64_t at = r * rs + h * hs + c0 * dim, o = (r * kv_heads + h) * groups * dim;
            int64_t pat = pe * prs + h * phs, hd = layer * heads + h * groups;
            if (!feat) {
                one(q + o, pkeys + pat, pvalues + pat, np, keys + at, values + at, np + end - c0,
                    groups, dim, out + o, scratch);
                continue;
            }
            one_summ(q + o, pkeys + pat, pvalues + pat, np, keys + at, values + at,
                     np + end - c0, groups, dim, out + o, scratch, feat + (r * ds + hd) * 5,
                     deg + r * width * ds + hd, ds, plen[r]);
        }
    }
}
"""

# -ffast-math for the compile only (vectorised sums and expf): linked without it, so the shared
# object does not carry crtfastmath, whose constructor would flush denormals process-wide
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fPIC", "-c"]
LINK_FLAGS = ["-shared"]

_lock = threading.Lock()
_loaded: list = []  # [function or None] once tried


def _cpu_key() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {flags}"


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc, gcc or $CC) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, obj, out = (Path(tmp) / name for name in ("attention.c", "attention.o", "out.so"))
        src.write_text(SOURCE)
        _run([compiler, *COMPILE_FLAGS, "-o", str(obj), str(src)])
        try:  # glibc's vector expf (libmvec) where it exists
            _run([compiler, *LINK_FLAGS, "-o", str(out), str(obj), "-lmvec", "-lm"])
        except RuntimeError:
            _run([compiler, *LINK_FLAGS, "-o", str(out), str(obj), "-lm"])
        os.replace(out, target)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()[-500:]}")


def load_kernel():
    """The ``decode_attention`` C function (built on first use), or None (see the module)."""
    with _lock:
        if _loaded:
            return _loaded[0]
        function = None
        if os.environ.get("HALLULOG_ATTENTION_KERNEL", "1") != "0":
            from hallulog.serving.model_loader import cache_dir

            key = "\0".join([SOURCE, *COMPILE_FLAGS, *LINK_FLAGS, _cpu_key()])
            key = hashlib.sha256(key.encode()).hexdigest()
            target = cache_dir() / "kernels" / f"decode_attention-{key[:16]}.so"
            try:
                if not target.exists():
                    _build(target)
                library = ctypes.CDLL(str(target))
                function = library.decode_attention
                function.restype = None
                pointer, size = ctypes.c_void_p, ctypes.c_int64
                function.argtypes = [pointer, pointer, pointer, size, size, pointer]
                function.argtypes += [size] * 5 + [pointer, pointer]
                function.argtypes += [pointer, pointer, size, size, pointer, pointer]
                function.argtypes += [pointer, pointer, pointer, size, size, size]
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                logger.info("decode attention through matmul (no C kernel: %s)", exc)
                function = None
        _loaded.append(function)
        return function


def kernel_fits(head_dim: int, groups: int, dtype: torch.dtype) -> bool:
    return dtype == torch.float32 and head_dim % 16 == 0 and head_dim <= 128 and groups <= 16


def decode_attention(
    function,
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    start: torch.Tensor,
    end: int,
    parts: int = 1,
    prefix: tuple | None = None,
    summaries=None,
) -> torch.Tensor:
    """Attention of ``query`` ``[rows, kv_heads, groups, head_dim]`` (scaled, contiguous) over
    columns ``start[r] .. end - 1`` of each row of the slot buffers ``keys``/``values``
    ``[row_capacity, kv_heads, columns, head_dim]``; returns ``[rows, kv_heads, groups,
    head_dim]``. ``prefix``: ``(keys, values, entry, length)``, each row's first columns: the
    first ``length[r]`` columns of entry ``entry[r]`` of ``keys``/``values`` ``[entries,
    kv_heads, columns, head_dim]`` (a prompt shared by rows), then its own. ``parts`` > 1: the
    rows are cut into that many blocks, run side by side on this thread and helper threads (a
    row's result is the same either way). ``summaries``: ``(feat, deg, plen, layer)`` of a
    ``hallulog.serving.attention_capture.StepSummaries`` (the kernel writes the layer's
    summaries there); None: none (no extra work)."""
    rows, kv_heads, groups, dim = query.shape
    if keys.stride(2) != dim or keys.stride(3) != 1 or values.stride() != keys.stride():
        raise ValueError("the slot buffers must be contiguous in their last two dimensions")
    start = start.to(torch.int64).contiguous()
    out = torch.empty_like(query)
    parts = max(1, min(parts, rows // 2))
    bounds = [rows * i // parts for i in range(parts + 1)]
    width = end - start
    if prefix is not None:
        pkeys, pvalues, entry, length = prefix
        if pkeys.stride(2) != dim or pkeys.stride(3) != 1 or pvalues.stride() != pkeys.stride():
            raise ValueError("the prefix buffers must be contiguous in their last two dimensions")
        entry = entry.to(torch.int64).contiguous()
        length = length.to(torch.int64).contiguous()
        width = width + length
    scratch = torch.empty((parts, groups * max(int(width.max()), 1)), dtype=torch.float32)
    row_bytes = keys.stride(0) * keys.element_size()

    def block(i: int) -> None:
        lo, hi = bounds[i], bounds[i + 1]
        if prefix is None:
            tail = (None, None, 0, 0, None, None)
        else:
            tail = (
                pkeys.data_ptr(),
                pvalues.data_ptr(),
                pkeys.stride(0),
                pkeys.stride(1),
                entry[lo].data_ptr(),
                length[lo].data_ptr(),
            )
        if summaries is None:
            extra = (None, None, None, 0, 0, 0)
        else:
            feat, deg, plen, layer = summaries
            extra = (
                feat[lo].data_ptr(),
                deg[lo].data_ptr(),
                plen[lo].data_ptr(),
                layer,
                feat.shape[1],
                deg.shape[1],
            )
        function(
            query[lo].data_ptr(),
            keys.data_ptr() + lo * row_bytes,
            values.data_ptr() + lo * row_bytes,
            keys.stride(0),
            keys.stride(1),
            start[lo].data_ptr(),
            end,
            hi - lo,
            kv_heads,
            groups,
            dim,
            out[lo].data_ptr(),
            scratch[i].data_ptr(),
            *tail,
            *extra,
        )

    if parts == 1:
        block(0)
        return out
    helpers = [_helpers().submit(block, i) for i in range(1, parts)]
    block(0)  # ctypes lets go of the GIL: the blocks run at once
    for helper in helpers:
        helper.result()
    return out


_pool: list[concurrent.futures.ThreadPoolExecutor] = []


def _helpers() -> concurrent.futures.ThreadPoolExecutor:
    with _lock:
        if not _pool:
            workers = max(1, (os.cpu_count() or 2) - 1)
            _pool.append(
                concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="attention")
            )
        return _pool[0]
