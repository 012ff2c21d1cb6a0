"""Which ``RunConfig`` fields are secret, and which the config fingerprint covers.

The fingerprint (``RunConfig.fingerprint_fields``) is what a resume must match: every field but
those that change no artifact, and the fields added after earlier runs only once set.
"""

from __future__ import annotations

__all__ = ["SECRET_FIELDS", "FINGERPRINT_EXCLUDED", "FINGERPRINT_WHEN_SET"]

#: Fields never written anywhere (run_manifest.json, logs, the status snapshot).
SECRET_FIELDS = frozenset({"status_token"})

# Fields that do not change what the run produces: excluded from the config fingerprint.
FINGERPRINT_EXCLUDED = frozenset({
    "artifact_root", "num_workers", "groups_in_flight", "commit_interval_ms", "spool_root", "gpus",
    "manage_servers", "server_urls",
    "server_base_port", "server_startup_timeout", "resume", "limit", "checkpoint_every",
    "checkpoint_interval", "server_max_restarts", "server_restart_backoff",
    "status_host", "status_port", "status_token", "progress", "request_timeout", "task_path",
    # the prompt's text (template, system prompt, few-shot examples) enters the fingerprint as
    # its hash (RunConfig.fingerprint_fields' prompt_template_hash), not as file paths
    "task_format", "prompt_template_file", "fewshot_path",
    # how the engine is laid out and the storage cap change no artifact (quantization and
    # max_model_len do: they stay in)
    "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization",
    "enforce_eager", "max_storage_gb", "check_free_space",
    "consolidate", "watchdog_stall_seconds", "cache_dir", "extra", "judge_url", "judge_model",
    # the shards of one run share its fingerprint; the shard itself is recorded in the manifest
    # and checked on resume (orchestrator.manifest.check_resumable)
    "shard",
    "executor", "ray_address", "ray_actors", "ray_cpus_per_actor", "ray_max_restarts",
})


# Fields that enter the fingerprint only when set off their default: fields added after runs
# were made without them, so those runs keep their fingerprint (and resume).
FINGERPRINT_WHEN_SET = frozenset({
    "records_key", "question_field", "answers_field", "id_field", "context_field",
    "choices_field", "answer_kind", "numeric_tolerance", "with_context", "prompt_template",
    "system_prompt", "fewshot_k", "chat", "layers", "positions", "max_model_len",
    "quantization", "trust_remote_code", "engine_args",
})
