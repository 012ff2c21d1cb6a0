"""RunConfig's fingerprint membership lives in its fields' metadata; the fingerprints it gives are
byte-identical to those of the hand-kept lists it replaced (kept below as the record), so every
earlier artifact root still resumes. Its choice fields are ``Literal`` types: checked on
construction, and the CLI's and the study file's choices."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from hallulog.cli.app import build_parser
from hallulog.config.fields import ALWAYS, NEVER, WHEN_SET, membership
from hallulog.config.profiles import PROFILES
from hallulog.config.run_config import ConfigError, RunConfig
from hallulog.contracts.config_cli import literal_choices
from hallulog.contracts.ids import fingerprint

from hallulog import storage

# The lists the fingerprint was computed from before it moved into field metadata (the record:
# never edit them; a new field declares its membership in its own metadata).
OLD_EXCLUDED = frozenset(
    {
        "artifact_root",
        "num_workers",
        "groups_in_flight",
        "commit_interval_ms",
        "spool_root",
        "gpus",
        "manage_servers",
        "server_urls",
        "server_base_port",
        "server_startup_timeout",
        "resume",
        "limit",
        "checkpoint_every",
        "checkpoint_interval",
        "server_max_restarts",
        "server_restart_backoff",
        "status_host",
        "status_port",
        "status_token",
        "progress",
        "request_timeout",
        "task_path",
        "task_format",
        "prompt_template_file",
        "fewshot_path",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "gpu_memory_utilization",
        "enforce_eager",
        "max_storage_gb",
        "check_free_space",
        "consolidate",
        "watchdog_stall_seconds",
        "cache_dir",
        "extra",
        "judge_url",
        "judge_model",
        "shard",
        "executor",
        "ray_address",
        "ray_actors",
        "ray_cpus_per_actor",
        "ray_max_restarts",
    }
)
OLD_WHEN_SET = frozenset(
    {
        "records_key",
        "question_field",
        "answers_field",
        "id_field",
        "context_field",
        "choices_field",
        "answer_kind",
        "numeric_tolerance",
        "with_context",
        "prompt_template",
        "system_prompt",
        "fewshot_k",
        "chat",
        "layers",
        "positions",
        "max_model_len",
        "quantization",
        "trust_remote_code",
        "engine_args",
    }
)

OLD_ALWAYS = frozenset(
    {
        "task",
        "split",
        "model",
        "backend",
        "model_dtype",
        "k_samples",
        "primary_temperature",
        "sample_temperature",
        "sample_top_p",
        "max_tokens",
        "seed",
        "logging_profile",
        "target_layers",
        "sequence_mode",
        "dtype",
        "capture_mode",
        "storage_format",
    }
)
OLD_FIELDS = OLD_EXCLUDED | OLD_WHEN_SET | OLD_ALWAYS
"""Every field RunConfig had when the lists were replaced."""


def _old_fingerprint_fields(config: RunConfig) -> dict:
    """``RunConfig.fingerprint_fields`` as the lists computed it (over the fields of then)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config) if f.name in OLD_WHEN_SET}
    d = {
        k: v
        for k, v in config.to_dict().items()
        if k in OLD_FIELDS and k not in OLD_EXCLUDED and not (k in defaults and v == defaults[k])
    }
    profile = config.profile
    d.update(
        target_layers=profile.target_layers,
        sequence_mode=profile.sequence_mode,
        dtype=profile.dtype,
    )
    if profile.positions is not None:
        d["positions"] = ",".join(profile.positions)
    return d


def test_every_field_keeps_its_membership():
    got = membership(RunConfig)
    assert set(got) == {f.name for f in dataclasses.fields(RunConfig)}
    assert OLD_FIELDS <= set(got)  # no field of then was dropped
    for name, kind in got.items():
        if name in OLD_FIELDS:
            expected = (
                NEVER if name in OLD_EXCLUDED else WHEN_SET if name in OLD_WHEN_SET else ALWAYS
            )
            assert kind == expected, name
        else:  # a field added since must leave every earlier fingerprint as it was
            assert kind in (NEVER, WHEN_SET), f"{name}: a new field is {kind} in the fingerprint"
    assert {name for name, kind in got.items() if kind == NEVER} >= OLD_EXCLUDED


# A value off the default for every field that takes one without other fields (those whose
# checks need a partner are given one below).
_OFF_DEFAULT = dict(
    artifact_root=Path("elsewhere"),
    task="precisewikiqa",
    split="test",
    limit=3,
    shard="1/2",
    model="some/model",
    backend="vllm",
    model_dtype="bfloat16",
    k_samples=2,
    primary_temperature=0.5,
    sample_temperature=0.3,
    sample_top_p=0.5,
    max_tokens=7,
    seed=9,
    logging_profile="light",
    target_layers="first_half",
    sequence_mode="last",
    dtype="float32",
    layers="0,2-3",
    max_storage_gb=1.5,
    check_free_space=False,
    capture_mode="prefill",
    storage_format="npy",
    num_workers=2,
    groups_in_flight=2,
    commit_interval_ms=5.0,
    gpus=(0, 1),
    max_model_len=512,
    gpu_memory_utilization=0.5,
    quantization="fp8",
    enforce_eager=True,
    trust_remote_code=True,
    engine_args="--swap-space 8",
    server_base_port=9000,
    server_startup_timeout=5.0,
    request_timeout=9.0,
    watchdog_stall_seconds=7.0,
    resume=False,
    checkpoint_every=3,
    checkpoint_interval=2.0,
    server_max_restarts=1,
    server_restart_backoff=1.0,
    consolidate=False,
    judge_url="http://x",
    judge_model="j",
    status_port=8123,
    status_token="secret",
    progress=False,
    cache_dir=Path("/tmp"),
    extra={"a": 1},
    records_key="data",
    question_field="q",
    answers_field="a",
    id_field="i",
    context_field="c",
    choices_field="ch",
    numeric_tolerance=0.1,
    with_context=True,
    prompt_template="Q: {{ question }}",
    system_prompt="Be brief.",
    chat=False,
    ray_address="local",
    ray_actors=2,
    ray_cpus_per_actor=2.0,
    ray_max_restarts=1,
    spool_root=Path("/tmp"),
    tensor_parallel_size=1,
    pipeline_parallel_size=1,
)

_QA = dict(
    task="qa",
    task_path=str(
        Path(__file__).resolve().parents[2] / "tasks" / "data" / "gsm8k-sample-test.jsonl"
    ),
)
_PARTNER = {  # what a field's checks need beside it
    **dict.fromkeys(
        ("gpu_memory_utilization", "quantization", "enforce_eager", "trust_remote_code"),
        dict(backend="vllm"),
    ),
    **dict.fromkeys(
        ("question_field", "answers_field", "id_field", "context_field", "choices_field"), _QA
    ),
    "with_context": dict(task="squad"),
    "status_host": dict(status_port=8123, status_token="secret"),
}
_OFF_DEFAULT["status_host"] = "0.0.0.0"

_CONFIGS = [
    {},
    *({k: v, **_PARTNER.get(k, {})} for k, v in _OFF_DEFAULT.items()),
    dict(_QA, answer_kind="numeric", task_format="jsonl", question_field="q"),
    dict(fewshot_path="f.jsonl", fewshot_k=2),
    dict(positions="tbg,slt,last:3"),
    dict(logging_profile="probes"),
    dict(manage_servers=False, server_urls=("http://a", "http://b")),
    dict(executor="ray", ray_actors=3),
    dict(backend="vllm", gpus=(0, 1, 2, 3), tensor_parallel_size=2, pipeline_parallel_size=2),
    dict(prompt_template_file="t.j2"),
    dict(task_path="data.jsonl"),
]


@pytest.mark.parametrize("kwargs", _CONFIGS, ids=lambda k: ",".join(k) or "default")
def test_fingerprint_is_byte_identical_to_the_lists(kwargs):
    try:
        config = RunConfig(**kwargs)
    except ConfigError as exc:  # the case needs a partner field it does not have
        pytest.fail(f"{kwargs}: {exc}")
    old = _old_fingerprint_fields(config)
    assert config.fingerprint_fields() == old
    assert list(config.fingerprint_fields()) == list(old)  # same key order: same bytes
    assert fingerprint(config.fingerprint_fields()) == fingerprint(old)


def test_every_off_default_value_is_covered():
    """The cases above set every field of the record off its default (fields added since are
    held to NEVER or WHEN_SET by test_every_field_keeps_its_membership)."""
    touched = set().union(*(set(c) for c in _CONFIGS))
    assert touched >= OLD_FIELDS


@pytest.mark.parametrize(
    "field,bad",
    [
        ("storage_format", "wds"),
        ("executor", "slurm"),
        ("backend", "tgi"),
        ("capture_mode", "decode"),
        ("model_dtype", "int8"),
        ("logging_profile", "huge"),
        ("target_layers", "spread"),
        ("sequence_mode", "positions"),
        ("dtype", "bf16"),
        ("task_format", "xml"),
        ("answer_kind", "fuzzy"),
    ],
)
def test_a_value_outside_its_literal_type_is_refused(field, bad):
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ConfigError, match=f"^{flag}: '{bad}' is not one of "):
        RunConfig(**{field: bad})


def test_the_types_are_the_choices():
    choices = literal_choices(RunConfig)
    assert set(choices["storage_format"]) == set(storage.FORMATS)
    assert set(choices["logging_profile"]) == set(PROFILES)
    assert choices["dtype"] == ("float16", "float32", "bfloat16")
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    by_dest = {a.dest: a for a in run._actions}
    for name, values in choices.items():
        assert list(by_dest[name].choices) == list(values), name
    assert typing.get_args(typing.get_type_hints(RunConfig)["storage_format"]) == typing.get_args(
        storage.StorageFormat
    )


def test_server_config_checks_its_literal_types_too():
    from hallulog.serving.config import ServerConfig

    with pytest.raises(ValueError, match="^--dtype: 'int8' is not one of float32, bfloat16"):
        ServerConfig(dtype="int8")
    assert ServerConfig(dtype="bfloat16").dtype == "bfloat16"
