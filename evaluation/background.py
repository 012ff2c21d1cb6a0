"""The sentence-embedding methods in a child process, alongside the rest of the evaluation.

Encoding every answer with all-MiniLM-L6-v2 is the longest step of an evaluation (torch);
meanwhile the main process streams the other text methods and fits the label probes
(scikit-learn, one BLAS thread, mostly Python), so the two overlap, and the main process never
imports torch. (Torch keeps its default thread count: on a loaded 2-core machine one thread
made the whole evaluation slower, 93 s against 76 s; the embeddings are the same bits.) The
child streams the exports in the same order as the main process and sends
back one float per labelled prompt and method, its timings and its peak RSS.
"""

from __future__ import annotations

import logging
import multiprocessing
import resource
import time
from pathlib import Path

import numpy as np
from hallulog.contracts.errors import ArtifactError, HallulogError

__all__ = ["EmbeddingJob"]

log = logging.getLogger(__name__)


def _child(root: str, methods: list[str], conn) -> None:
    try:
        from hallulog.evaluation.data import Run
        from hallulog.evaluation.embeddings import Embedder, EmbeddingUnavailable
        from hallulog.evaluation.features import collect

        t0 = time.monotonic()
        try:
            embedder = Embedder()
        except EmbeddingUnavailable as exc:
            conn.send(("unavailable", str(exc)))
            return
        t1 = time.monotonic()
        feats = collect(Run(root), set(methods), embedder)
        conn.send(
            (
                "ok",
                feats.prompt_ids,
                {m: np.asarray(v, np.float64) for m, v in feats.scores.items()},
                {"embedding_model_load_s": t1 - t0, "embedding_methods_s": time.monotonic() - t1},
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            )
        )
    except HallulogError as exc:
        conn.send(("error", str(exc)))
    except BaseException as exc:  # noqa: BLE001  (reported by the parent, with its type)
        conn.send(("error", f"embedding methods failed: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class EmbeddingJob:
    """Scores of the embedding ``methods`` for every labelled prompt of ``root``, computed in a
    spawned process; ``result()`` waits for them."""

    def __init__(self, root: Path | str, methods: list[str]):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child,
            args=(str(root), sorted(methods), child_conn),
            name="hallulog-embeddings",
            daemon=True,
        )
        self._proc.start()
        child_conn.close()
        self.peak_rss_mib = 0.0

    def result(self) -> tuple[list[str], dict[str, np.ndarray], dict[str, float]] | str:
        """(prompt ids, {method: scores}, timings), or the reason the model is unavailable;
        raises ``ArtifactError`` when the child failed."""
        try:
            msg = self._conn.recv()
        except EOFError:
            msg = ("error", f"the embedding process died (exit code {self._proc.exitcode})")
        finally:
            self._proc.join()
            self._conn.close()
        if msg[0] == "unavailable":
            return msg[1]
        if msg[0] == "error":
            raise ArtifactError(msg[1])
        _, ids, scores, timings, self.peak_rss_mib = msg
        return ids, scores, timings

    def cancel(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join()
        self._conn.close()
