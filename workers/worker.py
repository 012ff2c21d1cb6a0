"""The worker process: receives prompt groups on its own pipe from the driver, generates the
primary and K samples on its server, captures activations, persists the group, and reports back
on the same pipe.

The channel is one duplex ``multiprocessing`` connection per worker: the driver sends
``PromptGroup`` objects (at most ``groups_in_flight`` unresolved at once) and ``None`` to stop;
the worker sends ``ready`` once it is up, then one event per group (``done`` or ``failed``),
plus ``fatal`` when it cannot go on. No lock is shared with another process, so a worker killed at any moment leaves the driver
an EOF, never a held lock. Several groups are in flight at once (asyncio); persisting is
serialised so that groups commit one at a time (see ``hallulog.workers.persist``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hallulog.contracts.capture_rows import prefill_start, rows_to_ask
from hallulog.contracts.process import die_with_parent
from hallulog.contracts.ids import activation_key, sample_seed
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.attention_files import drop_attention, keep_attention
from hallulog.workers.capture import (CaptureError, CapturedRows, discard_capture, open_capture,
                                      select_rows)
from hallulog.workers.capture_check import capture_reasons, check_captured
from hallulog.workers.client import BackendClient, Completion, is_retryable
from hallulog.workers.group_commit import GroupCommitter
from hallulog.workers.positions import (PositionRows, exact_answer_spans, index_fields,
                                        missing_positions, select_positions)
from hallulog.workers.persist import GenerationRecord, PersistBroken, WorkerDir
from hallulog.contracts.reasoning import ReasoningMarkers
from hallulog.workers.reasoning import ReasoningMismatch, answer_starts, split_all
from hallulog.workers.rows import answer_grader, generation_row, prompt_row, split_args
from hallulog.workers.runtime import run_event_loop, run_on, tune_gc
from hallulog.workers.errors import FULL_DISK, disk_full, error_record

__all__ = ["WorkerSpec", "GroupWorker", "worker_main", "answer_grader"]

log = logging.getLogger(__name__)

#: a group's capture files up to this size are loaded on the event loop's own thread: handing
#: them to a thread cost more (GIL hand-offs, futex calls) than reading them
_INLINE_LOAD_BYTES = 1 << 20


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs (pickled into the spawned process)."""

    worker_id: int
    server_url: str
    model_name: str
    worker_dir: str
    storage_format: str
    layer_ids: tuple[int, ...]
    """Layer ids stored, in order; the server captures exactly these."""
    hidden_size: int
    sequence_mode: str
    dtype: str
    capture_mode: str
    k_samples: int
    primary_temperature: float
    sample_temperature: float
    sample_top_p: float
    max_tokens: int
    seed: int
    groups_in_flight: int
    request_timeout: float
    retry_backoff: float = 1.0
    commit_interval_ms: float = 20.0
    positions: tuple[str, ...] | None = None
    """Token positions by name (contracts/positions.py); None: ``sequence_mode``'s rows."""
    chat_template_kwargs: dict[str, Any] | None = None  # contracts/chat_options.py
    check_captures: bool = True
    """Fail a capture whose rows are all zeros, non-finite or repeated across different tokens
    (workers/capture_check.py); false: store the rows as they come."""
    reasoning: ReasoningMarkers | None = None
    """The model's reasoning markers (``RunPlan.reasoning``): chat replies are split into
    reasoning and answer (workers/reasoning.py); None: stored as they come."""
    attention: bool = False
    """Ask the server for attention summaries captured during generation
    (``--attention-features`` on a backend that captures them, ``Backend.attention_in_pass``)."""
    driver_pid: int | None = None
    """The pid of the process that starts this worker: a worker whose parent is another one
    when it comes up (the driver died while it started) exits at once."""


def worker_main(spec: WorkerSpec, conn) -> None:
    """Entry point of a spawned worker process; ``conn`` is its end of the driver's pipe."""
    # never outlive a crashed orchestrator: it owns the work (and the next session redoes the
    # groups in this pipe, so an orphan must not commit them)
    die_with_parent(signal.SIGKILL, spec.driver_pid)
    logging.basicConfig(level=os.environ.get("HALLULOG_LOG_LEVEL", "WARNING"),
                        format=f"%(asctime)s worker_{spec.worker_id} %(levelname)s %(message)s")
    if os.environ.get("HALLULOG_FAULTS"):  # fault tests only (workers/_faults.py)
        from hallulog.workers._faults import install_from_env

        install_from_env()
    channel = _Channel(conn)
    tune_gc()
    try:
        run_event_loop(GroupWorker(spec, channel).run())
    except BaseException as exc:  # report, then die: the orchestrator decides what happens next
        channel.send({"event": "fatal", "worker_id": spec.worker_id,
                      "error": error_record(exc, None, None, "worker_crash", worker_id=spec.worker_id,
                                           server_url=spec.server_url)})
        raise
    finally:
        conn.close()


class _Channel:
    """The worker's end of its pipe: sends from any thread, one at a time."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self._lock = threading.Lock()  # this process's own lock: dies with it

    def send(self, event: dict[str, Any]) -> None:
        with self._lock:
            try:
                self.conn.send(event)
            except OSError:  # the driver is gone; PDEATHSIG ends this process
                log.warning("driver unreachable; event %s dropped", event.get("event"))

    def reader(self, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue) -> None:
        """Thread body: move received groups into the event loop; None at EOF or stop."""
        while True:
            try:
                item = self.conn.recv()
            except (EOFError, OSError):
                item = None
            loop.call_soon_threadsafe(inbox.put_nowait, item)
            if item is None:
                return


class GroupWorker:
    """Runs and commits the prompt groups of ``channel`` (in a process or a Ray actor)."""

    def __init__(self, spec: WorkerSpec, channel: _Channel) -> None:
        self.spec = spec
        self.channel = channel
        self.client = BackendClient(spec.server_url, spec.model_name,
                                    timeout=spec.request_timeout, backoff_base=spec.retry_backoff,
                                    template_kwargs=spec.chat_template_kwargs,
                                    capture_dtype=spec.dtype)
        self.out = WorkerDir(Path(spec.worker_dir), worker_id=spec.worker_id,
                             storage_format=spec.storage_format, layer_ids=list(spec.layer_ids),
                             hidden_size=spec.hidden_size, dtype=spec.dtype)
        self.committer = GroupCommitter(self.out, min_interval_s=spec.commit_interval_ms / 1000)
        self.fatal = False
        # the narrowest capture the server can make for the rows kept (contracts/capture_rows.py)
        self.capture_rows = rows_to_ask(sequence_mode=spec.sequence_mode, positions=spec.positions)
        # large captures load on a thread kept for the run (the loop's default executor, up to
        # six threads, cost ~10 % of a worker's CPU in hand-offs)
        self._loading = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture-load")

    async def run(self) -> None:
        inbox: asyncio.Queue = asyncio.Queue()
        threading.Thread(target=self.channel.reader, args=(asyncio.get_running_loop(), inbox),
                         name="channel-reader", daemon=True).start()
        tasks: set[asyncio.Task] = set()
        # once per process: the driver counts its groups as work on the server from now on
        self.channel.send({"event": "ready", "worker_id": self.spec.worker_id})
        try:
            while True:
                group = await inbox.get()
                if group is None:
                    break
                if self.fatal:  # hand it back: another worker or the next run does it
                    self.channel.send({"event": "requeue", "worker_id": self.spec.worker_id,
                                       "prompt_id": group.prompt_id})
                    continue
                task = asyncio.create_task(self._guarded(group))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            await self.client.close()
            self._loading.shutdown(wait=True)
            self.committer.close()
            self.out.close()

    async def _guarded(self, group: PromptGroup) -> None:
        try:
            await self._process(group)
        except Exception as exc:  # a bug in one group must not leave it unresolved
            log.exception("prompt %s: unexpected error", group.prompt_id)
            self._report_failure(group.prompt_id, None, exc, "worker_error")

    async def _process(self, group: PromptGroup) -> None:
        spec = self.spec
        capture_in_generation = spec.capture_mode == "generation"
        requests = [self._request_params(group.prompt_id, sid) for sid in range(spec.k_samples + 1)]
        capture = dict(capture=capture_in_generation, capture_rows=self.capture_rows)
        if spec.attention:  # summaries captured during generation (contracts/attention_wire.py)
            capture["attention"] = True
        outcomes = await asyncio.gather(*[
            self.client.chat(group.messages, **capture, **params)
            if group.prompt is None else  # --chat false: the raw text to /v1/completions
            self.client.complete(group.prompt, **capture, **params)
            for params in requests], return_exceptions=True)
        failures = [(sid, o) for sid, o in enumerate(outcomes) if isinstance(o, BaseException)]
        if failures:
            drop_attention([o for o in outcomes if not isinstance(o, BaseException)])
            for o in outcomes:
                if not isinstance(o, BaseException):
                    discard_capture(o.hidden_states_path)
            sample_id, exc = failures[0]
            if disk_full(exc):  # the server's spool (the artifact root's, or --spool-root)
                self._report_failure(group.prompt_id, sample_id, self._full(exc),
                                     "storage_full", fatal=True)
                return
            self._report_failure(group.prompt_id, sample_id, exc, "generation_failed")
            return
        completions: list[Completion] = list(outcomes)  # type: ignore[arg-type]
        try:  # the answer apart from the reasoning, checked against the token ids
            split_all(completions, spec.reasoning if group.prompt is None else None)
        except ReasoningMismatch as exc:
            for comp in completions:
                discard_capture(comp.hidden_states_path)
            self._report_failure(group.prompt_id, None, exc, "reasoning_mismatch")
            return
        if not capture_in_generation:  # an extraction server writes a file for every request
            for comp in completions:
                discard_capture(comp.hidden_states_path)

        records, errors = await self._capture_all(group, completions, requests)
        full = [e for e in errors if disk_full(e["error_message"])]
        if full:  # committing the group without its activations would hide a full disk
            for rec in records:
                rec.acts = None
            self._report_failure(group.prompt_id, full[0]["sample_id"],
                                 self._full(full[0]["error_message"]), "storage_full",
                                 fatal=True)
            return
        keep_attention(spec.worker_dir, group.prompt_id, completions)  # before the commit
        prompt = prompt_row(group, completions[0], records[0].row,
                            num_generations=spec.k_samples + 1, worker_id=spec.worker_id)
        try:
            await self.committer.commit(prompt, records)
        except OSError as exc:  # persist_groups rolled the group back (or says it could not)
            full = exc.errno in FULL_DISK
            self._report_failure(group.prompt_id, None, exc,
                                 "storage_full" if full else "storage_error",
                                 fatal=full or isinstance(exc, PersistBroken))
            return
        except Exception as exc:  # e.g. a shard store refusing a key it already holds
            self._report_failure(group.prompt_id, None, exc, "storage_error",
                                 fatal=isinstance(exc, PersistBroken))
            return
        for err in errors:  # the group is committed: a lost error row must not undo that
            try:
                await self.committer.run(self.out.record_error, err)
            except OSError:
                log.exception("could not record a capture error of %s", group.prompt_id)
        tokens = sum(len(c.token_ids) for c in completions)
        event = {"event": "done", "worker_id": spec.worker_id, "prompt_id": group.prompt_id,
                 "generations": len(completions), "tokens": tokens,
                 "capture_errors": len(errors), "capture_reasons": capture_reasons(errors),
                 "no_answer": sum(c.split is not None and c.split.answer_start is None
                                  for c in completions)}
        if spec.positions:
            event["positions_missing"] = missing_positions(records)
        self.channel.send(event)

    def _full(self, cause: BaseException | str) -> OSError:
        return OSError(errno.ENOSPC, f"disk full under the artifact root (this worker writes "
                       f"{self.spec.worker_dir}) or under its server's spool (--spool-root, "
                       f"default the artifact root's spool/): {cause}", self.spec.worker_dir)

    def _request_params(self, prompt_id: str, sample_id: int) -> dict[str, Any]:
        spec = self.spec
        if sample_id == 0:
            return dict(temperature=spec.primary_temperature, top_p=1.0,
                        max_tokens=spec.max_tokens, seed=sample_seed(spec.seed, prompt_id, 0))
        return dict(temperature=spec.sample_temperature, top_p=spec.sample_top_p,
                    max_tokens=spec.max_tokens, seed=sample_seed(spec.seed, prompt_id, sample_id))

    async def _capture_all(self, group: PromptGroup, completions: list[Completion],
                           requests: list[dict[str, Any]]
                           ) -> tuple[list[GenerationRecord], list[dict[str, Any]]]:
        """Every sample's record, with its activations where capture worked.

        The capture files of the whole group are loaded in one worker-thread call: a thread
        hop per sample costs more than loading a light-profile file.
        """
        paths = await asyncio.gather(*[self._capture_path(c) for c in completions],
                                     return_exceptions=True)
        grade = answer_grader(group)
        starts = answer_starts(completions)  # no answer (None): never graded
        grades = [None if a is None else grade(c.text) for c, a in zip(completions, starts)]
        spans = exact_answer_spans(completions, grades, starts) if self.spec.positions else None
        if self._capture_bytes(completions) <= _INLINE_LOAD_BYTES:
            captured = self._load_rows(completions, paths, spans)
        else:
            captured = await run_on(self._loading, self._load_rows, completions, paths, spans)
        records, errors = [], []
        for sample_id, (comp, params, rows, graded) in enumerate(
                zip(completions, requests, captured, grades)):
            row = generation_row(group, sample_id, comp, params, graded,
                                 model_name=self.spec.model_name, worker_id=self.spec.worker_id)
            record = GenerationRecord(row=row,
                                      label=graded.label if graded is not None else None)
            if isinstance(rows, BaseException):  # activations are optional: keep the generation
                log.warning("capture failed for %s sample %d: %s", group.prompt_id, sample_id,
                            rows)
                errors.append(self._error(rows, group.prompt_id, sample_id,
                                            "capture_failed"))
                record.row["activation_key"] = None
            else:
                self._attach(record, group, sample_id, comp, rows)
                record.row["activation_key"] = record.activation_row["activation_key"]
            records.append(record)
        return records, errors

    def _capture_bytes(self, completions: list[Completion]) -> int:
        """Upper bound of the bytes a group's capture files hold (float32 rows)."""
        tokens = sum(len(c.prompt_token_ids) + len(c.token_ids) for c in completions)
        return tokens * len(self.spec.layer_ids) * self.spec.hidden_size * 4

    async def _capture_path(self, comp: Completion) -> str:
        """The capture file of one completion (a prefill request in ``prefill`` mode)."""
        if not comp.prompt_token_ids or not comp.token_ids:
            raise CaptureError("backend returned no prompt/completion token ids")
        if self.spec.capture_mode == "generation":
            path = comp.hidden_states_path
        else:
            start = prefill_start(self.capture_rows, prompt_len=len(comp.prompt_token_ids),
                                  response_len=len(comp.token_ids))
            path = await self.client.prefill_capture(comp.prompt_token_ids + comp.token_ids, start)
        if not path:
            raise CaptureError("backend returned no kv_transfer_params.hidden_states_path")
        return path

    def _load_rows(self, completions: list[Completion], paths: list[str | BaseException],
                   spans: list[dict | None] | None = None
                   ) -> list[CapturedRows | BaseException]:
        """Thread body: load and slice every capture file of a group; errors per sample.
        ``spans``: each sample's exact answer span (runs with positions)."""
        out: list[CapturedRows | BaseException] = []
        for i, (comp, path) in enumerate(zip(completions, paths)):
            if isinstance(path, BaseException):
                out.append(path)
                continue
            try:
                out.append(self._load_one(comp, path, spans[i] if spans else None))
            except Exception as exc:
                out.append(exc)
        return out

    def _load_one(self, comp: Completion, path: str, span: dict | None = None
                  ) -> CapturedRows:
        spec = self.spec
        prompt_ids, response_ids = comp.prompt_token_ids, comp.token_ids
        expected = (prompt_ids + response_ids[:-1] if spec.capture_mode == "generation"
                    else prompt_ids + response_ids)
        with open_capture(path, expected) as hidden:  # only the rows kept are read
            if hidden.shape[1] != len(spec.layer_ids) or hidden.shape[2] != spec.hidden_size:
                raise CaptureError(f"{path}: capture has {hidden.shape[1]} layer ids x "
                                   f"{hidden.shape[2]}, expected {len(spec.layer_ids)} x "
                                   f"{spec.hidden_size}")
            if spec.positions:
                rows = select_positions(hidden, prompt_len=len(prompt_ids),
                                        response_len=len(response_ids),
                                        capture_mode=spec.capture_mode, names=spec.positions,
                                        exact_answer_span=span, layer_index=None,
                                        dtype=spec.dtype, **split_args(comp))
            else:
                rows = select_rows(hidden, prompt_len=len(prompt_ids),
                                   response_len=len(response_ids),
                                   sequence_mode=spec.sequence_mode, layer_index=None,
                                   dtype=spec.dtype)
        if spec.check_captures:  # the rows as they would be stored (docs/alignment.md)
            check_captured(rows, token_ids=expected, layer_ids=spec.layer_ids)
        return rows

    def _attach(self, record: GenerationRecord, group: PromptGroup, sample_id: int,
                comp: Completion, rows: CapturedRows) -> None:
        spec = self.spec
        record.acts = rows.acts
        record.prompt_rows, record.response_rows = rows.prompt_rows, rows.response_rows
        record.activation_row = {
            "prompt_id": group.prompt_id, "sample_id": sample_id,
            "activation_key": activation_key(group.prompt_id, sample_id),
            "layers": list(spec.layer_ids), "sequence_mode": spec.sequence_mode,
            "capture_mode": spec.capture_mode,
            "prompt_token_count": len(comp.prompt_token_ids),
            "response_token_count": len(comp.token_ids),
            "row0_position": rows.row0_position, "num_rows": int(rows.acts.shape[1]),
            "prompt_rows": rows.prompt_rows, "response_rows": rows.response_rows,
        }
        if isinstance(rows, PositionRows):
            record.activation_row.update(index_fields(rows))

    def _error(self, exc: BaseException, prompt_id: str | None, sample_id: int | None,
               kind: str) -> dict[str, Any]:
        return error_record(exc, prompt_id, sample_id, kind, worker_id=self.spec.worker_id,
                            server_url=self.spec.server_url)

    def _report_failure(self, prompt_id: str, sample_id: int | None, exc: BaseException,
                        kind: str, fatal: bool = False) -> None:
        err = self._error(exc, prompt_id, sample_id, kind)
        try:
            self.out.record_error(err)
        except OSError:
            log.exception("could not record error for %s", prompt_id)
        self.channel.send({"event": "failed", "worker_id": self.spec.worker_id,
                          "prompt_id": prompt_id, "error": err,
                          "retryable": not fatal and is_retryable(exc)})
        if fatal:
            self.fatal = True
            self.channel.send({"event": "fatal", "worker_id": self.spec.worker_id, "error": err})
