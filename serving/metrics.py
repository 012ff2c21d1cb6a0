"""Prometheus metrics under vLLM's names, so one watchdog reads both backends.

vLLM names used: ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (label ``model_name``). Running and
waiting count sequences (a request with ``n`` counts n times), as vLLM's scheduler does.
hallulog's own: ``hallulog_serving_batch_size`` (sequences per forward pass, one observation per
forward pass) and ``hallulog_serving_captures_total``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class ServingMetrics:
    """One registry per server (tests create several apps in one process)."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self._prompt = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=self.registry
        )
        self._generation = Counter(
            "vllm:generation_tokens", "Generated tokens.", labels, registry=self.registry
        )
        self._running = Gauge(
            "vllm:num_requests_running",
            "Sequences in the running batch.",
            labels,
            registry=self.registry,
        )
        self._waiting = Gauge(
            "vllm:num_requests_waiting",
            "Sequences waiting for a batch.",
            labels,
            registry=self.registry,
        )
        self._batch = Histogram(
            "hallulog_serving_batch_size",
            "Sequences per forward pass.",
            labels,
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self._captures = Counter(
            "hallulog_serving_captures",
            "Hidden-state files written.",
            labels,
            registry=self.registry,
        )
        self.prompt_tokens = self._prompt.labels(model_name)
        self.generation_tokens = self._generation.labels(model_name)
        self.running = self._running.labels(model_name)
        self.waiting = self._waiting.labels(model_name)
        self.batch_size = self._batch.labels(model_name)
        self.captures = self._captures.labels(model_name)
