"""The run plan (config/plan.py): the default job's plan and fingerprint, pinned; the six
settings that decide what is stored resolved once; the task, engine and study specs made from
the config with its defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hallulog.backends.embedded import EmbeddedBackend
from hallulog.backends.engine import ENGINE_FIELDS, EngineOptions
from hallulog.backends.models import ModelInfo
from hallulog.backends.vllm import VllmBackend
from hallulog.config.plan import plan_recorded_task, plan_run, plan_task, stored_of
from hallulog.config.run_config import ConfigError, RunConfig
from hallulog.config.specs import STUDY_FIELDS, task_spec
from hallulog.contracts.ids import fingerprint
from hallulog.tasks.study import Study

#: the default job's fingerprint (``hallulog run`` with no flag): a run made before must resume
DEFAULT_FINGERPRINT = "59573f6c6c1719d2f76497885b691df88c76a1532923730972b6d077a9e7884d"
SMOLLM2 = ModelInfo(Path("/models/smollm2"), num_hidden_layers=30, hidden_size=576, name="m")


def test_the_default_jobs_fingerprint_is_pinned():
    assert fingerprint(RunConfig().fingerprint_fields()) == DEFAULT_FINGERPRINT
    plan = plan_run(RunConfig(), SMOLLM2)
    assert plan.manifest["config_fingerprint"] == DEFAULT_FINGERPRINT


def test_the_default_jobs_plan():
    plan = plan_run(RunConfig(), SMOLLM2)
    assert plan.stored.layer_ids == tuple(range(31))
    assert (plan.stored.sequence_mode, plan.stored.dtype, plan.stored.positions) == (
        "response",
        "float16",
        None,
    )
    assert plan.stored.capture_mode == "generation" and plan.stored.capture_rows == "response"
    assert isinstance(plan.servers.backend, EmbeddedBackend)
    assert plan.servers.layer_ids == plan.stored.layer_ids and plan.servers.count == 1
    assert (plan.worker_count, plan.groups_in_flight, plan.storage_format) == (1, 32, "packed")
    assert plan.task.spec.name == "triviaqa" and plan.task.split == "dev"
    assert len(plan.task.prompt_ids) == plan.manifest["total_prompts"] > 0
    assert plan.manifest["layer_ids"] == list(range(31))


PROBES = ("tbg", "slt", "exact_answer", "last")
FIRST_HALF_PROMPT = {"target_layers": "first_half", "sequence_mode": "prompt"}
LAYERS_POSITIONS = {"layers": "0,-1", "positions": "tbg,last:2", "dtype": "float32"}


@pytest.mark.parametrize(
    "kwargs, layer_ids, mode, positions, dtype, rows",
    [
        ({"logging_profile": "light"}, tuple(range(16, 31)), "last", None, "float16", "last"),
        ({"logging_profile": "probes"}, (15, 20), "positions", PROBES, "float16", "response"),
        (FIRST_HALF_PROMPT, tuple(range(16)), "prompt", None, "float16", "prompt"),
        (LAYERS_POSITIONS, (0, 30), "positions", ("tbg", "last:2"), "float32", "all"),
        ({"logging_profile": "full", "capture_mode": "prefill"}, tuple(range(31)), "all", None, "float32", "all"),
    ],
)  # fmt: skip
def test_the_six_settings_resolve_once(kwargs, layer_ids, mode, positions, dtype, rows):
    stored = stored_of(RunConfig(**kwargs), 30)
    assert (stored.layer_ids, stored.sequence_mode, stored.positions, stored.dtype) == (
        layer_ids,
        mode,
        positions,
        dtype,
    )
    assert stored.capture_rows == rows
    assert stored.capture_mode == kwargs.get("capture_mode", "generation")


def test_a_layer_the_model_lacks_is_refused_by_the_plan():
    with pytest.raises(ConfigError, match="--layers: layer 40 is out of range"):
        plan_run(RunConfig(layers="0,40"), SMOLLM2)


def test_the_backend_is_resolved_once_into_the_servers():
    plan = plan_run(RunConfig(backend="vllm", max_model_len=512), SMOLLM2)
    assert isinstance(plan.servers.backend, VllmBackend)
    assert plan.servers.engine == EngineOptions(max_model_len=512)
    assert plan.groups_in_flight == 4


def test_the_config_and_its_specs_agree_on_every_default():
    """EngineOptions and Study are the backends' and the tasks' own types: each field is a
    RunConfig field of the same name and default, so a spec made from a default config is the
    spec's default."""
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for cls, names in ((EngineOptions, ENGINE_FIELDS), (Study, STUDY_FIELDS)):
        for f in dataclasses.fields(cls):
            assert f.name in defaults, f"{cls.__name__}.{f.name} is no RunConfig field"
            assert defaults[f.name] == f.default, f"{cls.__name__}.{f.name}"
        assert tuple(f.name for f in dataclasses.fields(cls)) == names
    assert task_spec(RunConfig()).study == Study()


def test_the_post_run_commands_and_merge_read_the_same_prompt_ids(tmp_path):
    config = RunConfig(limit=7, shard="1/2")
    task = plan_task(config)
    manifest = {"config": config.to_dict()}
    assert plan_recorded_task(manifest).prompt_ids == task.prompt_ids
    assert plan_recorded_task(manifest, shard=None).prompt_ids > task.prompt_ids
    assert len(plan_recorded_task(manifest, shard=None).prompt_ids) == 7
