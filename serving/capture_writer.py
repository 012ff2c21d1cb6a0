"""An engine's capture writes, off its thread.

Captured hidden states come out of each forward pass as one ``[rows, tokens, layer_ids,
hidden]`` tensor; the rows each capturing sequence's ``capture_rows`` keeps (every position, or
from the last prompt token on, ...) go straight to its spool file
(``hallulog.serving.capture.SpoolFile``): ``put`` collects a pass's rows, ``flush`` copies them
out of the pass's buffer together (so it is freed at once) and hands them to one writer thread
(at most ``WRITES_IN_FLIGHT`` passes behind), ``finish`` completes a sequence's file and resolves
its future. No sequence holds its states in memory. A sequence whose request asked for a capture
dtype (``contracts/capture_dtype.py``) has its rows cast as they are put.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading

import torch

__all__ = ["CaptureWriter", "WRITES_IN_FLIGHT"]

logger = logging.getLogger(__name__)

WRITES_IN_FLIGHT = 4  # passes whose capture rows may wait for the writer thread


class CaptureWriter:
    """The capture files of one engine's sequences (``spool``: a ``SpoolWriter``)."""

    def __init__(self, spool, metrics=None):
        self.spool = spool
        self.metrics = metrics
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="capture-writer")
        self._rows_out: list[tuple] = []  # (file, row, block) of this pass, for the writer
        self._writes = threading.Semaphore(WRITES_IN_FLIGHT)

    def put(self, seq):
        """Where ``seq.capture`` puts rows: its spool file (opened at its first rows), through
        this pass's list for the writer thread."""

        dtype = _dtype(seq.params.capture_dtype)

        def put(row: int, block: torch.Tensor) -> None:
            if dtype is not None and block.dtype != dtype:
                block = block.to(dtype)  # round to nearest even, as the worker would
            if seq.file is None:
                seq.file = self.spool.open(block.shape[1:], block.dtype)
            self._rows_out.append((seq.file, row, block))

        return put

    def flush(self) -> None:
        """Hand this pass's captured rows to the writer thread (one task, one copy of the rows),
        waiting while it is ``WRITES_IN_FLIGHT`` passes behind."""
        if not self._rows_out:
            return
        rows, self._rows_out = self._rows_out, []
        # one copy of the kept rows: the pass's buffer (every position of every layer id, joining
        # prompts' included) is freed now, not when the writer is done
        kept = torch.cat([block for _, _, block in rows])
        at, copied = 0, []
        for file, row, block in rows:
            copied.append((file, row, kept[at : at + block.shape[0]]))
            at += block.shape[0]
        self._writes.acquire()
        try:
            self._writer.submit(self._write_rows, copied)
        except BaseException:
            self._writes.release()
            raise

    def _write_rows(self, rows: list[tuple]) -> None:
        try:
            for file, row, block in rows:
                if file.error is None:
                    try:
                        file.write(row, block)
                    except OSError as exc:  # reported to the request at its end
                        file.error = exc
        finally:
            self._writes.release()

    def drop(self, seqs) -> None:
        """A failed pass: its rows are dropped, and the files of ``seqs`` discarded."""
        self._rows_out.clear()
        for seq in seqs:
            if seq.file is not None:
                self._writer.submit(seq.file.discard)

    def finish(self, seq, output, row_shape, dtype) -> None:
        """Complete ``seq``'s file (``row_shape``/``dtype`` when no row came) with its token
        ids and resolve its future with ``output`` (its ``hidden_states_path`` set)."""
        rows, row0 = seq.n_states, seq.row0
        tokens = (seq.prompt_ids + seq.out_ids)[row0 : row0 + rows]
        if seq.file is None:  # no row was kept
            seq.file = self.spool.open(row_shape, _dtype(seq.params.capture_dtype) or dtype)
        self._writer.submit(self._write_capture, seq.future, output, seq.file, row0, tokens)
        seq.file = None

    def _write_capture(self, future, output, file, row0: int, tokens) -> None:
        try:
            if file.error is not None:
                raise file.error
            output.hidden_states_path = file.finish(tokens, row0)
            if self.metrics:
                self.metrics.captures.inc()
            future.set_result(output)
        except Exception as exc:  # noqa: BLE001 - reported to the request
            logger.exception("writing a capture file failed")
            file.discard()
            future.set_exception(exc)

    def shutdown(self) -> None:
        self._writer.shutdown(wait=True)


def _dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of a request's capture dtype (``contracts/capture_dtype.py``)."""
    return None if name is None else getattr(torch, name)
