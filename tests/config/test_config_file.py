"""Study files (``run --config FILE``): keys, types, layering under flags, paths, the TOML that
``--print-config`` writes, the manifest record and the fingerprint, and every example file."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from hallulog.cli.app import build_parser, config_from_args
from hallulog.config.config_file import PROVENANCE_KEYS, StudyFileError, dump_study, load_study
from hallulog.config.run_config import RunConfig
from hallulog.contracts import layout
from hallulog.contracts.ids import fingerprint

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.toml"))


def _config(*argv: str) -> RunConfig:
    return config_from_args(build_parser().parse_args(["run", *argv]))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _without_provenance(config: RunConfig) -> RunConfig:
    extra = {k: v for k, v in config.extra.items() if k not in PROVENANCE_KEYS}
    return dataclasses.replace(config, extra=extra)


def test_file_values_become_the_config(tmp_path):
    study = _write(
        tmp_path / "study.toml",
        "k_samples = 2\ngpus = [0, 1]\nresume = false\n"
        'sample_top_p = 1\nmodel_dtype = "bfloat16"\ncache_dir = "cache"\n'
        'prompt_template = """\nQ: {{ question }}\nA:"""\n',
    )
    cfg = _config("--config", str(study))
    assert (cfg.k_samples, cfg.gpus, cfg.resume, cfg.sample_top_p, cfg.model_dtype) == (
        2,
        (0, 1),
        False,
        1.0,
        "bfloat16",
    )
    assert cfg.cache_dir == Path("cache") and cfg.prompt_template == "Q: {{ question }}\nA:"
    assert isinstance(cfg.sample_top_p, float)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("k_sample = 2\n", "unknown key 'k_sample' (did you mean 'k_samples'?)"),
        ("k-samples = 2\n", "unknown key 'k-samples' (did you mean 'k_samples'?)"),
        ("[run]\nk_samples = 2\n", "unknown key 'run'"),
        ('status_token = "s3cret"\n', "unknown key 'status_token' (secret"),
    ],
)
def test_unknown_key_names_file_and_key(tmp_path, text, needle):
    study = _write(tmp_path / "study.toml", text)
    with pytest.raises(StudyFileError) as err:
        _config("--config", str(study))
    assert str(err.value).startswith(f"{study}: ") and needle in str(err.value)


@pytest.mark.parametrize(
    "text,needle",
    [
        ('k_samples = "five"\n', "k_samples = 'five': expected an integer"),
        ("k_samples = true\n", "k_samples = True: expected an integer"),
        ('sample_top_p = "high"\n', "expected a number"),
        ('resume = "no"\n', "resume = 'no': expected true or false"),
        ('gpus = "0,1"\n', "expected a list of integers"),
        ('gpus = [0, "1"]\n', "expected a list of integers"),
        ("server_urls = [1]\n", "expected a list of strings"),
        ('backend = "tgi"\n', "backend = 'tgi': expected one of embedded, vllm"),
        ('answer_kind = "fuzzy"\n', "expected one of aliases, choice, numeric, judge"),
        ('logging_profile = "huge"\n', "expected one of integrated, light, full"),
        ('storage_format = "hdf5"\n', "expected one of npy, packed, zarr"),
        ("artifact_root = 3\n", "artifact_root = 3: expected a path (a string)"),
        ('extra = "x"\n', "extra: expected a table"),
    ],
)
def test_wrong_type_names_file_key_and_type(tmp_path, text, needle):
    study = _write(tmp_path / "study.toml", text)
    with pytest.raises(StudyFileError) as err:
        _config("--config", str(study))
    assert str(err.value).startswith(f"{study}: ") and needle in str(err.value)


def test_a_bad_value_checked_by_runconfig_names_the_file(tmp_path):
    study = _write(tmp_path / "study.toml", "k_samples = -1\n")
    with pytest.raises(Exception, match=r"--k-samples must be >= 0 \(values from .*study.toml"):
        _config("--config", str(study))


def test_max_memory_gb_from_the_file_and_refused_there_in_one_line(tmp_path):
    study = _write(tmp_path / "study.toml", "max_memory_gb = 2.5\n")
    assert _config("--config", str(study)).max_memory_gb == 2.5
    _write(study, "max_memory_gb = 0\n")
    with pytest.raises(Exception, match=r"^--max-memory-gb must be > 0 \(gigabytes\) \(values"):
        _config("--config", str(study))


def test_flags_override_the_file(tmp_path):
    study = _write(
        tmp_path / "study.toml",
        'k_samples = 2\nmax_tokens = 9\ngpus = [0, 1]\ntask_path = "a.json"\n',
    )
    cfg = _config("--config", str(study), "--k-samples", "7", "--gpus", "", "--task-path", "b.json")
    assert (cfg.k_samples, cfg.max_tokens, cfg.gpus, cfg.task_path) == (7, 9, (), "b.json")


def test_post_run_layers_recorded_config_under_file_and_flags(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / layout.MANIFEST).write_text(
        json.dumps({"config": {"k_samples": 2, "max_tokens": 7, "seed": 3}})
    )
    study = _write(tmp_path / "study.toml", f'artifact_root = "{root}"\nmax_tokens = 9\nseed = 4\n')
    cfg = _config("--config", str(study), "--seed", "5", "--validate-only")
    assert (cfg.k_samples, cfg.max_tokens, cfg.seed) == (2, 9, 5)


def test_relative_paths(tmp_path, monkeypatch):
    """task_path, fewshot_path and prompt_template_file: against the file's directory;
    artifact_root (like every other path): against the working directory, as the flag."""
    study = _write(
        tmp_path / "studies" / "s.toml",
        'task_path = "data/dev.jsonl"\nfewshot_path = "../shots/train.jsonl"\n'
        'fewshot_k = 2\nprompt_template_file = "/abs/prompt.j2"\n'
        'artifact_root = "artifacts/s"\n',
    )
    monkeypatch.chdir(tmp_path)
    cfg = _config("--config", "studies/s.toml")
    assert cfg.task_path == str(tmp_path / "studies" / "data" / "dev.jsonl")
    assert cfg.fewshot_path == str(tmp_path / "shots" / "train.jsonl")
    assert cfg.prompt_template_file == "/abs/prompt.j2"
    assert cfg.artifact_root == Path("artifacts/s")
    assert cfg.extra["config_file"] == str(study)


def test_print_config_round_trip(tmp_path):
    template = 'Say "{{ question }}" \\ twice\t\u00e9\n\n"""quoted"""\nA:"'
    study = _write(
        tmp_path / "study.toml",
        dump_study(
            RunConfig(
                task="gsm8k",
                k_samples=3,
                gpus=(0, 2),
                server_urls=("http://a:1", "http://b:2"),
                numeric_tolerance=1e-9,
                prompt_template=template,
                system_prompt='one line "quoted"\x7f',
                limit=4,
                shard="1/3",
                fewshot_path=str(tmp_path / "shots.jsonl"),
                fewshot_k=2,
                answer_kind="numeric",
                extra={"study": "pilot", "tags": ["a", "b"], "nested": {"x": 1, "y": [1.5, True]}},
            )
        ),
    )
    first = _config("--config", str(study), "--max-tokens", "11")
    printed = _write(tmp_path / "printed.toml", dump_study(first))
    second = _config("--config", str(printed))
    assert _without_provenance(second) == _without_provenance(first)
    assert second.prompt_template == template and second.max_tokens == 11
    assert second.extra["config_file"] == str(printed) and "config_file" not in printed.read_text()


def test_defaults_round_trip(tmp_path):
    printed = _write(tmp_path / "d.toml", dump_study(RunConfig()))
    assert _without_provenance(_config("--config", str(printed))) == RunConfig()


def test_yaml(tmp_path):
    pytest.importorskip("yaml")
    study = _write(
        tmp_path / "study.yaml",
        "k_samples: 2\ngpus: [0, 1]\nlimit: null\ntask_path: data/x.json\nextra: {study: pilot}\n",
    )
    cfg = _config("--config", str(study))
    assert (cfg.k_samples, cfg.gpus, cfg.limit) == (2, (0, 1), None)
    assert cfg.task_path == str(tmp_path / "data" / "x.json") and cfg.extra["study"] == "pilot"
    bad = _write(tmp_path / "bad.yml", "k_samples: [1]\n")
    with pytest.raises(StudyFileError, match=r"bad.yml: k_samples = \[1\]: expected an integer"):
        _config("--config", str(bad))
    with pytest.raises(StudyFileError, match="max_tokens = None: expected an integer"):
        _config("--config", str(_write(tmp_path / "n.yaml", "max_tokens: null\n")))


def test_yaml_without_pyyaml_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml raises ImportError
    study = _write(tmp_path / "study.yaml", "k_samples: 2\n")
    with pytest.raises(StudyFileError) as err:
        load_study(study)
    assert str(err.value) == (
        f"reading {study} needs the Python package 'yaml', which is not "
        "installed: pip install 'hallulog[dev]'  (or: pip install pyyaml)"
    )


def test_malformed_and_missing_files(tmp_path):
    with pytest.raises(StudyFileError, match=r"s.toml: malformed TOML \(.*line 1"):
        load_study(_write(tmp_path / "s.toml", "k_samples = = 2\n"))
    with pytest.raises(StudyFileError, match="nope.toml: No such file"):
        load_study(tmp_path / "nope.toml")
    with pytest.raises(StudyFileError, match=r"s.json: a study file ends in \.toml"):
        load_study(_write(tmp_path / "s.json", "{}"))


def test_manifest_records_the_file_and_its_hash(tmp_path):
    from hallulog.config.manifest import build_manifest

    study = _write(tmp_path / "study.toml", 'k_samples = 2\n[extra]\nstudy = "pilot"\n')
    cfg = _config("--config", str(study))
    manifest = build_manifest(
        cfg,
        run_id=None,
        model_name="m",
        model_path="m",
        layer_ids=[0],
        hidden_size=8,
        num_hidden_layers=1,
        dataset="triviaqa",
        split="dev",
        prompt_template="t",
        worker_count=1,
        total_prompts=1,
    )
    extra = manifest["config"]["extra"]
    assert extra == {
        "study": "pilot",
        "config_file": str(study),
        "config_file_sha256": hashlib.sha256(study.read_bytes()).hexdigest(),
    }


def test_fingerprint_is_the_same_for_file_and_flags(tmp_path):
    """The same study as a file and as flags: one config fingerprint (paths, extra and the
    file's own record stay out of it)."""
    shots = tmp_path / "shots.jsonl"
    study = _write(
        tmp_path / "study.toml",
        f'''
task = "triviaqa"
k_samples = 3
sample_temperature = 0.9
max_tokens = 16
seed = 7
logging_profile = "light"
dtype = "float32"
storage_format = "npy"
answer_kind = "aliases"
system_prompt = "Be brief."
prompt_template = """
Q: {{{{ question }}}}
A:"""
fewshot_path = "shots.jsonl"
fewshot_k = 2
chat = false
gpus = [0, 1]
artifact_root = "{tmp_path / "a"}"
[extra]
study = "pilot"
''',
    )
    from_file = _config("--config", str(study))
    from_flags = _config(
        "--task",
        "triviaqa",
        "--k-samples",
        "3",
        "--sample-temperature",
        "0.9",
        "--max-tokens",
        "16",
        "--seed",
        "7",
        "--logging-profile",
        "light",
        "--dtype",
        "float32",
        "--storage-format",
        "npy",
        "--answer-kind",
        "aliases",
        "--system-prompt",
        "Be brief.",
        "--prompt-template",
        "Q: {{ question }}\nA:",
        "--fewshot-path",
        str(shots),
        "--fewshot-k",
        "2",
        "--chat",
        "false",
        "--gpus",
        "0,1",
        "--artifact-root",
        str(tmp_path / "b"),
    )
    assert fingerprint(from_file.fingerprint_fields()) == fingerprint(
        from_flags.fingerprint_fields()
    )
    assert from_file.fewshot_path == from_flags.fewshot_path
    assert fingerprint(from_file.fingerprint_fields()) != fingerprint(
        _config("--config", str(study), "--seed", "8").fingerprint_fields()
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_parse(example, tmp_path):
    """Every example is a valid study (parsed, not run) and survives --print-config."""
    cfg = _config("--config", str(example))
    assert isinstance(cfg, RunConfig) and cfg.extra["config_file"] == str(example)
    for field in ("task_path", "fewshot_path"):
        value = getattr(cfg, field)
        assert value is None or Path(value).is_file() or value.startswith("/shared/"), value
    printed = _write(tmp_path / "printed.toml", dump_study(cfg))
    assert _without_provenance(_config("--config", str(printed))) == _without_provenance(cfg)


def test_examples_cover_the_documented_set():
    names = {p.name for p in EXAMPLES}
    assert {
        "default.toml",
        "custom_csv_context.toml",
        "nq_open_fewshot.toml",
        "slurm_array_8b.toml",
        "ray_8b.toml",
    } <= names
    readme = (REPO / "examples" / "README.md").read_text()
    assert all(name in readme for name in names)


def test_cli_print_config_and_bad_key(tmp_path):
    study = _write(tmp_path / "study.toml", "k_samples = 2\nmax_tokens = 9\n")
    env_token = {"HALLULOG_STATUS_TOKEN": "tok-from-env"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--config",
            str(study),
            "--max-tokens",
            "12",
            "--status-token",
            "tok-flag",
            "--print-config",
            "--artifact-root",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **env_token},
    )
    assert proc.returncode == 0, proc.stderr
    assert "tok-" not in proc.stdout and "status_token" not in proc.stdout
    printed = tomllib.loads(proc.stdout)
    assert (printed["k_samples"], printed["max_tokens"]) == (2, 12)
    assert not (tmp_path / "run").exists()  # printed, not run

    bad = _write(tmp_path / "bad.toml", "k_samples = 2\nmax_token = 9\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--config",
            str(bad),
            "--artifact-root",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hallulog run: error: {bad}: unknown key 'max_token' (did you mean 'max_tokens'?)"
    ]
    assert not (tmp_path / "run").exists()
