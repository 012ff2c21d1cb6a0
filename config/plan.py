"""The run plan: a :class:`~hallulog.config.run_config.RunConfig` resolved once into what the
rest of the run reads.

Everything derived from the config is derived here, once: the task (its spec, its stream, its
prompt ids and split), what is stored (the layer ids on the model, the row rule, the dtype: the
six settings ``--logging-profile``, ``--target-layers``, ``--sequence-mode``, ``--layers``,
``--positions``, ``--capture-mode``), the servers (the backend chosen by ``--backend``, the engine
options, the GPUs), the worker count and the fresh run manifest. ``run``, ``estimate``, the
post-run commands, the bucket commands and the Ray executor read a plan; past it nothing calls
back into the config (``tests/config/test_plan_walk.py``): the values a part uses as they are
(``--request-timeout``, ``--k-samples``, ...) are read off the config as data, every value that
had to be worked out is the plan's.

```python
task = plan_task(config)              # post-run commands: the task's prompt ids
plan = plan_run(config, model, task)  # run, estimate, Ray: + what is stored, servers, manifest
plan.task.prompt_ids, plan.stored.layer_ids, plan.stored.capture_rows, plan.servers.backend
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hallulog.backends.base import ServerSpec
from hallulog.backends.models import ModelInfo, model_type, reasoning_markers
from hallulog.backends.registry import backend_for
from hallulog.config.manifest import build_manifest, recorded_config
from hallulog.config.profiles import select_layer_ids
from hallulog.config.run_config import RunConfig
from hallulog.config.specs import engine_options, task_spec
from hallulog.contracts.chat_options import template_kwargs
from hallulog.contracts.errors import ConfigError
from hallulog.contracts.positions import parse_layers
from hallulog.contracts.reasoning import ReasoningMarkers
from hallulog.contracts.stored import Stored
from hallulog.tasks import TaskStream, open_task_spec
from hallulog.tasks.spec import TaskSpec

__all__ = [
    "TaskPlan",
    "RunPlan",
    "plan_task",
    "plan_recorded_task",
    "plan_run",
    "stored_of",
    "server_spec",
]


@dataclass(frozen=True)
class TaskPlan:
    """The task of a run, opened once and read once for its prompt ids."""

    spec: TaskSpec
    stream: TaskStream
    """Reads the task file again, group by group, each time it is iterated."""
    prompt_ids: frozenset[str]
    """Every prompt of the run (``--limit`` and ``--shard`` applied): what a finished run
    holds (the expected ids of ``consolidate``, ``validate``, ``retry``)."""
    split: str
    """The split of its prompts (empty when it has none)."""
    answer_kind: str
    """aliases, choice, numeric or judge."""


@dataclass(frozen=True)
class RunPlan:
    """A run resolved on its model: what ``run`` (its workers, servers and stores),
    ``estimate`` and the Ray executor read instead of the config's derived values."""

    task: TaskPlan
    model: ModelInfo
    stored: Stored
    """What each generation stores (layer ids, row rule, dtype, capture mode)."""
    storage_format: str
    servers: ServerSpec
    """The servers to start (or the URLs of running ones) and their backend."""
    worker_count: int
    groups_in_flight: int
    manifest: Mapping[str, Any]
    """The run manifest of a fresh run of this plan (a new run id; ``run`` keeps an existing
    run's id and start time)."""
    chat_template_kwargs: Mapping[str, Any]
    """The chat template's keyword arguments (``--chat-template-kwargs`` with ``--thinking``:
    ``hallulog.contracts.chat_options``); empty by default."""
    reasoning: ReasoningMarkers | None = None
    """The model's reasoning markers when its generations are split into reasoning and answer
    (docs/reasoning.md): its tokenizer has ``<think>``/``</think>`` as added tokens and the run
    goes through the chat template; None otherwise."""


def stored_of(config: RunConfig, num_hidden_layers: int) -> Stored:
    """What ``config`` stores on a model of ``num_hidden_layers`` layers: ``--layers`` (a
    ConfigError when an id is out of range), else the profile's target layers; the profile's
    rows (``--sequence-mode``, ``--positions``) and dtype; the capture mode."""
    profile = config.profile
    if config.layers is None:
        layer_ids = select_layer_ids(profile.target_layers, num_hidden_layers)
    else:
        try:
            layer_ids = parse_layers(config.layers, num_hidden_layers)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return Stored(
        layer_ids=tuple(layer_ids),
        sequence_mode=profile.sequence_mode,
        dtype=profile.dtype,
        capture_mode=config.capture_mode,
        positions=profile.positions,
        attention_features=config.profile.attention_features,
    )


def server_spec(config: RunConfig, model: ModelInfo, layer_ids: tuple[int, ...]) -> ServerSpec:
    """The servers of ``config`` serving ``model`` and capturing ``layer_ids``: the one place
    ``--backend`` (``backends/registry.py``) and ``--reasoning-parser`` are resolved."""
    backend = backend_for(config.backend)
    parser = backend.reasoning_parser_for(
        config.reasoning_parser,
        model_type=model_type(Path(model.path)),
        has_think_tokens=reasoning_of(config, model) is not None,
    )
    return ServerSpec(
        backend=backend,
        reasoning_parser=parser,
        model_path=Path(model.path),
        model_name=model.name,
        model_dtype=config.model_dtype,
        layer_ids=tuple(layer_ids),
        engine=engine_options(config),
        gpus=tuple(config.gpus),
        base_port=config.server_base_port,
        startup_timeout=config.server_startup_timeout,
        spool_root=config.spool_root,
        manage=config.manage_servers,
        urls=tuple(config.server_urls),
    )


def plan_task(config: RunConfig) -> TaskPlan:
    """The task of ``config``: opened (its few-shot file read) and read once for its prompt
    ids and split."""
    spec = task_spec(config)
    stream = open_task_spec(spec)
    ids: set[str] = set()
    split = ""
    for group in stream.groups():
        ids.add(group.prompt_id)
        split = split or group.split
    return TaskPlan(
        spec=spec,
        stream=stream,
        prompt_ids=frozenset(ids),
        split=split,
        answer_kind=stream.answer_kind,
    )


def plan_recorded_task(manifest: Mapping[str, Any], **overrides: Any) -> TaskPlan:
    """The task of a run as its manifest recorded its config (``overrides``: fields given
    another value, e.g. ``shard``): what ``merge`` checks a shard root against."""
    return plan_task(RunConfig(**{**recorded_config(manifest), **overrides}))


def plan_run(config: RunConfig, model: ModelInfo, task: TaskPlan | None = None) -> RunPlan:
    """``config`` resolved on ``model`` (``task``: its task plan when already made).
    ConfigError when ``--layers`` names a layer the model does not have."""
    task = task if task is not None else plan_task(config)
    stored = stored_of(config, model.num_hidden_layers)
    manifest = build_manifest(
        config,
        run_id=None,
        model_name=model.name,
        model_path=str(model.path),
        layer_ids=list(stored.layer_ids),
        hidden_size=model.hidden_size,
        num_hidden_layers=model.num_hidden_layers,
        dataset=config.task,
        split=task.split,
        prompt_template=task.stream.prompt_template,
        worker_count=config.worker_count,
        total_prompts=len(task.prompt_ids),
        answer_kind=task.answer_kind,
        prompt_fingerprinted=task.stream.spec is not None,
    )
    return RunPlan(
        task=task,
        model=model,
        stored=stored,
        storage_format=config.storage_format,
        servers=server_spec(config, model, stored.layer_ids),
        worker_count=config.worker_count,
        groups_in_flight=int(config.groups_in_flight),  # type: ignore[arg-type]
        manifest=manifest,
        chat_template_kwargs=template_kwargs(config.chat_template_kwargs, config.thinking),
        reasoning=reasoning_of(config, model),
    )


def reasoning_of(config: RunConfig, model: ModelInfo) -> ReasoningMarkers | None:
    """The markers that split ``model``'s generations (``RunPlan.reasoning``): none in a
    chat-less run (``--chat false``), else the tokenizer's think tokens. Which generations
    reason is then decided per generation by its prompt (``contracts/reasoning.py``): ``auto``
    follows the template's own default, ``--thinking off`` closes the block in the prompt (a
    template that always opens it, as the R1 distills' do, still reasons, and is split)."""
    if not config.chat:
        return None
    return reasoning_markers(Path(model.path))
