"""Batched generation on a background thread.

Every request is split into sequences (one per ``n``) that go into one queue. The engine thread
takes every waiting sequence up to ``max_batch_size``, waits up to ``batch_wait_ms`` for more,
then runs one left-padded prefill and a KV-cached decode loop over the batch. Each row has its own
sampling parameters, ``torch.Generator``, stop conditions and token budget; finished rows leave
the batch so the remaining rows decode faster. Sequences that arrive meanwhile are prefilled
between two decode steps and join the running batch (continuous batching). The KV cache is a
preallocated ``hallulog.serving.kvslots.SlotKVCache``: a decode step writes in place, a joining sequence
is written into a free row and a finished one replaced by the last row, so no step rebuilds the
cache (position ids are explicit per row). Models whose cache is not a plain full-attention one
run batch-at-a-time on a ``DynamicCache``.

Sequences admitted together with the same prompt (a run's ``k + 1`` answers of one question) are
prefilled once: one row per distinct prompt goes through the model, and its KV, logits and
captured states are copied to every sequence that shares it. Prefill and decode steps of a plain
Llama run through ``hallulog.serving.decode.FusedDecoder`` (fewer ops, oneDNN's packed matrix products);
other models, and ``fused_decode=False``, through the model's own forward with capture hooks.

Tokens, logprobs and stop rules per step: ``hallulog.serving.token_step``.

Captured rows go to each sequence's spool file as they come out of a pass
(``hallulog.serving.capture_writer``), so no sequence holds its states in memory.

Memory: a waiting sequence is admitted only while the key/value cache of the running ones, with
it, fits ``kv_budget`` at their longest (``hallulog.serving.memory``); the others wait in the
queue. ``want_threads`` (set by ``EnginePool``) is the engine's intra-op thread count from its
next step on.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch
from hallulog.serving.attention_capture import AttentionCapture
from hallulog.serving.capture import HiddenStateRecorder, SpoolWriter
from hallulog.serving.capture_writer import CaptureWriter
from hallulog.serving.decode import FusedDecoder, supports_fused_decode
from hallulog.serving.kvslots import Footprint, SlotKVCache, kv_bytes, kv_cell
from hallulog.serving.memory import KVBudget, trim_heap
from hallulog.serving.metrics import ServingMetrics
from hallulog.serving.model_loader import LoadedModel
from hallulog.serving.running_batch import Prompts, RunningBatch, supports_joining
from hallulog.serving.sampling import SAMPLING_EPS
from hallulog.serving.sequences import (
    SamplingParams,
    SequenceOutput,
    SequenceState,
    TokenLogprob,
)
from hallulog.serving.token_step import take_tokens

__all__ = ["Engine", "SamplingParams", "SequenceOutput", "TokenLogprob"]

logger = logging.getLogger(__name__)


class Engine:
    """Owns the model and the engine thread; ``submit`` is thread-safe."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_batch_size: int = 256,
        batch_wait_ms: float = 5.0,
        spool: SpoolWriter | None = None,
        capture_layers: Sequence[int] | None = None,
        metrics: ServingMetrics | None = None,
        fused_decode: bool = True,
        share_prefill: bool = True,
        decoder: FusedDecoder | None = None,
        kv_budget: KVBudget | None = None,
        budget_owner: int = 0,
    ):
        """``decoder``: a ``FusedDecoder`` of the same model to share (``EnginePool``: engines
        on one model hold its packed weights once). ``kv_budget``: the key/value cache's budget
        (shared by the engines of a pool, each its own ``budget_owner``); None: unbounded."""
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = next(self.model.parameters()).device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = max(batch_wait_ms, 0.0) / 1000.0
        self.metrics = metrics
        self.spool = spool
        self.recorder = (
            HiddenStateRecorder(self.model, capture_layers)
            if spool is not None and capture_layers
            else None
        )
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(loaded.eos_token_ids, default=0)
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        self._queue: queue.Queue[SequenceState] = queue.Queue()
        self._joinable = supports_joining(self.model)
        self.share_prefill = share_prefill
        fused = fused_decode and self._joinable and supports_fused_decode(self.model)
        fused = fused and self.device.type == "cpu"  # its buffers and kernels are the CPU's
        if fused and decoder is None:
            decoder = FusedDecoder(self.model, self.recorder.layer_ids if self.recorder else None)
        self._fused = decoder if fused else None
        self._num_cache_layers = self.model.config.num_hidden_layers
        in_pass = spool.spool_dir if spool is not None and self._fused is not None else None
        self._attention = AttentionCapture(self.model.config, in_pass)  # summaries, if asked
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serving-engine", daemon=True)
        self._captures = CaptureWriter(spool, metrics)
        self.kv_budget, self.budget_owner = kv_budget, budget_owner
        self._kv_cell = kv_cell(self.model.config, loaded.dtype)  # one column of one row
        self._pending: deque[SequenceState] = deque()  # taken from the queue, not yet admitted
        self.want_threads: int | None = None  # intra-op threads from the next step on
        self._threads: int | None = None
        self._shown = {"running": 0, "waiting": 0}  # what this engine added to the gauges
        self._shown_lock = threading.Lock()

    @property
    def capture_enabled(self) -> bool:
        return self.recorder is not None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._captures.shutdown()

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> concurrent.futures.Future:
        """Queue one sequence; the future resolves to a ``SequenceOutput``."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if max(prompt_ids) >= self.vocab_size or min(prompt_ids) < 0:
            raise ValueError(f"prompt token ids must be in 0..{self.vocab_size - 1}")
        if len(prompt_ids) >= self.loaded.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; this server's context is "
                f"{self.loaded.max_model_len}"
            )
        generator = None
        if params.temperature >= SAMPLING_EPS:
            generator = torch.Generator(device="cpu")
            if params.seed is None:
                generator.seed()
            else:
                generator.manual_seed(params.seed)
        seq = SequenceState(list(prompt_ids), params, concurrent.futures.Future(), generator)
        self._queue.put(seq)
        self._show(waiting=self._waiting())
        return seq.future

    def _waiting(self) -> int:
        return self._queue.qsize() + len(self._pending)

    def _show(self, **values: int) -> None:
        """Set this engine's share of the running/waiting gauges (engines of a pool share them)."""
        if self.metrics is None:
            return
        with self._shown_lock:
            for name, value in values.items():
                getattr(self.metrics, name).inc(value - self._shown[name])
                self._shown[name] = value

    # ---- engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        torch.get_num_threads()  # torch's per-thread setup first, so that ours is kept
        while not self._stopping.is_set():
            self._apply_threads()
            batch = self._next_batch()
            if not batch:
                continue
            self._show(waiting=self._waiting(), running=len(batch))
            try:
                with torch.inference_mode():
                    self._generate(batch)
            except Exception as exc:  # noqa: BLE001 - every waiting request must hear about it
                logger.exception("batch of %d sequences failed", len(batch))
                self._captures.drop(batch)
                for seq in batch:
                    if not seq.future.done():
                        seq.future.set_exception(exc)
            finally:
                self._claim(Footprint(), force=True)
                self._show(running=0)

    def _apply_threads(self) -> None:
        """Take ``want_threads`` as this thread's intra-op thread count (torch's count is per
        thread once set on it)."""
        want = self.want_threads
        if want is not None and want != self._threads:
            torch.set_num_threads(want)
            self._threads = want

    def _claim(self, need: Footprint, force: bool = False) -> bool:
        """Whether the sequences of ``need`` fit the key/value budget at their longest (claimed
        if so; ``force``: claimed whatever the others hold)."""
        if self.kv_budget is None or not self._joinable:
            return True
        size = kv_bytes(
            self._kv_cell,
            need.rows,
            need.generated,
            min(need.longest, self.loaded.max_model_len),
            len(need.prompts),
            need.prompt,
            shared=self._fused is not None,
        )
        if force:
            self.kv_budget.set(self.budget_owner, size)
            return True
        return self.kv_budget.claim(self.budget_owner, size)

    def _take(
        self, taken: list[SequenceState], room: int, running: list[SequenceState], deadline=None
    ) -> None:
        """Move waiting sequences to ``taken`` while there is ``room`` and the key/value
        budget holds them beside ``running``; until ``deadline`` (monotonic) waits for more,
        else never waits. A sequence the budget refuses stays first in line."""
        need = Footprint([*running, *taken])
        while len(taken) < room:
            if self._pending:
                seq = self._pending.popleft()
            else:
                remaining = 0.0 if deadline is None else deadline - time.monotonic()
                try:
                    if remaining > 0:
                        seq = self._queue.get(timeout=remaining)
                    else:
                        seq = self._queue.get_nowait()
                except queue.Empty:
                    return
            more = need.plus(seq)
            if not self._claim(more):
                self._pending.appendleft(seq)
                return
            taken.append(seq)
            need = more

    def _next_batch(self) -> list[SequenceState]:
        if self._pending:
            batch = [self._pending.popleft()]
        else:
            try:
                batch = [self._queue.get(timeout=0.1)]
            except queue.Empty:
                return []
        self._claim(Footprint(batch), force=True)  # an idle engine always runs one
        deadline = time.monotonic() + self.batch_wait_s
        self._take(batch, self.max_batch_size, [], deadline)
        return batch

    def _generate(self, batch: list[SequenceState]) -> None:
        """Run ``batch`` to completion; waiting sequences join it between decode steps.

        ``batch`` is kept equal to the unfinished sequences taken so far (joiners included), so the
        caller can fail every one of them on error.
        """
        run = RunningBatch(self._new_cache())
        self._admit(run, self._prompts(batch))
        while True:
            finished = self._sample_step(run.active, run.logits)
            for seq in finished:
                self._finish(seq)
            if finished:
                run.drop_finished()
                self._claim(Footprint(run.active), force=True)
            self._apply_threads()
            trim_heap()
            newcomers = self._take_waiting(self.max_batch_size - len(run.active), run.active)
            batch[:] = run.active + newcomers  # what is still owed an answer
            if not run.active and not newcomers:
                return
            joining = self._prompts(newcomers) if newcomers else None
            if run.active:
                next_ids = torch.tensor(
                    [[seq.out_ids[-1]] for seq in run.active], device=self.device
                )
                run.positions = run.positions + 1
                run.logits = self._decode(next_ids, run, joining)
                run.advance()
            if joining is not None:
                self._admit(run, joining)
            self._show(running=len(run.active), waiting=self._waiting())

    def _new_cache(self):
        from transformers import DynamicCache

        if self._joinable:  # the fused decoder reads a prompt's keys/values shared by its rows
            shared = self._fused is not None
            return SlotKVCache(self._num_cache_layers, self.max_batch_size, shared)
        return DynamicCache(config=self.model.config)

    def _take_waiting(self, room: int, running: list[SequenceState]) -> list[SequenceState]:
        """Sequences that can join the running batch now (never waits)."""
        taken: list[SequenceState] = []
        if self._joinable:
            self._take(taken, room, running)
        return taken

    def _prompts(self, batch: list[SequenceState]) -> Prompts:
        prompts = Prompts.of(batch, self.pad_id, self.share_prefill)
        prompts.summaries = self._attention.for_prefill(batch, prompts.lengths)
        for name in ("input_ids", "mask", "positions"):
            setattr(prompts, name, getattr(prompts, name).to(self.device))
        return prompts

    def _admit(self, run: RunningBatch, prompts: Prompts) -> None:
        """Add the sequences of ``prompts`` to ``run``, prefilling them unless a decode step
        did already (``prompts.outputs``): each distinct prompt's keys/values, logits and
        captured states are copied to every sequence of that prompt."""
        batch, source, width = prompts.batch, prompts.source, prompts.input_ids.shape[1]
        if self.metrics:
            self.metrics.prompt_tokens.inc(sum(len(seq.prompt_ids) for seq in batch))
        capturing = self._capturing(batch)
        if prompts.outputs is None:
            prompts.outputs = self._prefill(prompts, run, capturing)
        logits, kv, states = prompts.outputs
        self._attention.admitted(batch, source, prompts.summaries)
        if capturing:
            for seq, row in zip(batch, source):
                if seq.params.capture:
                    seq.capture(
                        states[row, width - prompts.lengths[row] :], self._captures.put(seq)
                    )
            self._captures.flush()
        mask, positions = prompts.mask, prompts.positions
        if run.shared_prompts and isinstance(kv, list):  # each distinct prompt's keys once
            index = torch.tensor(source)
            positions, logits = positions[index], logits[index]
            run.add_shared(batch, kv, prompts.lengths, source, positions[:, -1:], logits)
            return
        if prompts.unique < len(batch):  # copy each distinct prompt's row to its sequences
            index = torch.tensor(source)
            if isinstance(kv, list):
                kv = [(keys[index], values[index]) for keys, values in kv]
            else:
                kv.batch_select_indices(index)  # DynamicCache: every layer's keys and values
            mask, positions, logits = mask[index], positions[index], logits[index]
        run.add(batch, kv, mask, positions[:, -1:], logits)

    def _capturing(self, sequences: list[SequenceState]) -> bool:
        return self.recorder is not None and any(seq.params.capture for seq in sequences)

    def _prefill(self, prompts: Prompts, run: RunningBatch, capturing: bool):
        """One forward pass over the prompts alone: last logits, their keys/values (a list of
        ``(keys, values)`` per layer, or a ``DynamicCache``) and the captured states
        ``[rows, width, layer_ids, hidden]`` (None unless ``capturing``)."""
        from transformers import DynamicCache

        inputs = prompts.input_ids, prompts.mask, prompts.positions
        if self.metrics:
            self.metrics.batch_size.observe(prompts.unique)
        if self._fused is not None:
            return self._fused.prefill(*inputs, capturing, prompts.summaries)
        cache = DynamicCache(config=self.model.config) if run.slots else run.cache
        logits, states = self._forward(*inputs, cache, capturing)
        return logits, cache, states

    def _decode(
        self, next_ids: torch.Tensor, run: RunningBatch, joining: Prompts | None = None
    ) -> torch.Tensor:
        """One decode step of every running row; returns its logits. With the fused path the
        prompts ``joining`` are prefilled in the same pass (their outputs kept for ``_admit``)."""
        capturing = self._capturing(run.active)
        rows = len(run.active)
        summaries = self._attention.for_step(run.active)
        if self._fused is not None and joining is not None:
            both = capturing or self._capturing(joining.batch)
            step = (next_ids, run.positions, run.cache, run.step_mask())
            prefill = (joining.input_ids, joining.mask, joining.positions)
            logits, states, *joined = self._fused.forward(
                both, step=step, prefill=prefill, summaries=(summaries, joining.summaries)
            )
            joining.outputs = tuple(joined)
            rows += joining.unique
        elif self._fused is not None:
            logits, states = self._fused.step(
                next_ids, run.positions, run.cache, run.step_mask(), capturing, summaries
            )
        else:
            logits, states = self._forward(
                next_ids, run.step_mask(), run.positions, run.cache, capturing
            )
        self._attention.stepped(run.active, summaries)
        if self.metrics:
            self.metrics.batch_size.observe(rows)
        if capturing:
            for row, seq in enumerate(run.active):
                if seq.params.capture:
                    seq.capture(states[row, -1:], self._captures.put(seq))
            self._captures.flush()
        return logits

    def _forward(self, input_ids, mask, positions, cache, capturing: bool):
        """The model's own forward pass (no fused path): the last logits, and the captured
        states ``[rows, tokens, layer_ids, hidden]`` when ``capturing``."""
        if capturing:
            self.recorder.arm()
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        states = self.recorder.collect() if capturing else None
        return out.logits[:, -1, :].float(), states

    def _sample_step(
        self, active: list[SequenceState], logits: torch.Tensor
    ) -> list[SequenceState]:
        """Choose one token per row, record logprobs, apply stop rules; return rows that finished
        (``hallulog.serving.token_step``)."""
        if self.metrics:
            self.metrics.generation_tokens.inc(len(active))
        loaded = self.loaded
        return take_tokens(
            active, logits, loaded.eos_token_ids, self.tokenizer, loaded.max_model_len
        )

    def _finish(self, seq: SequenceState) -> None:
        if not seq.params.stop or seq.stop_reason is None:
            seq.text = self.tokenizer.decode(seq.out_ids, skip_special_tokens=True)
        output = seq.output(attention_path=self._attention.write(seq))
        if not (seq.params.capture and self.recorder is not None):
            seq.future.set_result(output)
            return
        layers = (len(self.recorder.layer_ids), self.model.config.hidden_size)
        self._captures.finish(seq, output, layers, self.loaded.dtype)
