"""RunConfig checks, the CLI derived from it, ids and the fingerprint."""

import json
import subprocess
import sys

import pytest
from hallulog.backends.servers import remove_spools
from hallulog.cli.app import build_parser, config_from_args
from hallulog.config.run_config import ConfigError, RunConfig, select_layer_ids
from hallulog.contracts import layout
from hallulog.contracts.ids import activation_key, prompt_id_for, sample_seed


def test_prompt_id_is_sha256_of_compact_json():
    import hashlib

    expected = hashlib.sha256(b'["triviaqa","dev","tc_33"]').hexdigest()[:16]
    assert prompt_id_for("triviaqa", "dev", "tc_33") == expected
    assert prompt_id_for("triviaqa", "dev", 7) == prompt_id_for("triviaqa", "dev", "7")
    assert activation_key("abc", 3) == "abc_3"


def test_sample_seeds_differ_per_sample_and_are_stable():
    seeds = {sample_seed(0, "p", s) for s in range(6)}
    assert len(seeds) == 6
    assert sample_seed(0, "p", 1) == sample_seed(0, "p", 1)
    assert sample_seed(1, "p", 1) != sample_seed(0, "p", 1)


def test_layer_selection():
    assert select_layer_ids("all", 30) == list(range(31))
    assert select_layer_ids("first_half", 30) == list(range(16))
    assert select_layer_ids("second_half", 30) == list(range(16, 31))


def test_profiles_and_overrides():
    cfg = RunConfig()
    assert (cfg.profile.target_layers, cfg.profile.sequence_mode) == ("all", "response")
    cfg = RunConfig(logging_profile="light", dtype="float32")
    assert cfg.profile.target_layers == "second_half" and cfg.profile.dtype == "float32"


def test_the_full_profile_stores_the_attention_summaries():
    """``full`` turns ``--attention-features`` on (the flag still wins); the fingerprint holds
    the resolved value only when on, as it did when the flag alone could set it."""
    from hallulog.config.plan import stored_of

    assert RunConfig(logging_profile="full").profile.attention_features
    assert not RunConfig(
        logging_profile="full", attention_features=False
    ).profile.attention_features
    assert not RunConfig().profile.attention_features
    assert RunConfig(attention_features=True).profile.attention_features
    on = {"attention_features": True}
    assert on.items() <= RunConfig(logging_profile="full").fingerprint_fields().items()
    assert on.items() <= RunConfig(attention_features=True).fingerprint_fields().items()
    for cfg in (
        RunConfig(),
        RunConfig(attention_features=False),
        RunConfig(logging_profile="full", attention_features=False),
    ):
        assert "attention_features" not in cfg.fingerprint_fields()
    assert (
        RunConfig(attention_features=False).fingerprint_fields() == RunConfig().fingerprint_fields()
    )
    assert stored_of(RunConfig(logging_profile="full"), 30).attention_features


@pytest.mark.parametrize(
    "kwargs,flag",
    [
        (dict(k_samples=-1), "--k-samples"),
        (dict(sample_top_p=0), "--sample-top-p"),
        (dict(logging_profile="huge"), "--logging-profile"),
        (dict(manage_servers=False), "--server-urls"),
        (dict(status_port=8080, status_host="0.0.0.0"), "--status-token"),
        (dict(spool_root="/nonexistent/spool"), "--spool-root"),
        (dict(storage_format="wds"), "--storage-format"),
        (dict(executor="slurm"), "--executor"),
    ],
)
def test_bad_values_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        RunConfig(**kwargs)


def test_fingerprint_ignores_paths_and_workers_only():
    base = RunConfig()
    assert (
        base.fingerprint_fields()
        == RunConfig(artifact_root="x", num_workers=3, limit=5, spool_root="/").fingerprint_fields()
    )
    assert base.fingerprint_fields() != RunConfig(k_samples=2).fingerprint_fields()
    assert base.fingerprint_fields() != RunConfig(storage_format="npy").fingerprint_fields()


def test_cli_maps_flags_to_config():
    args = build_parser().parse_args(
        [
            "run",
            "--k-samples",
            "2",
            "--gpus",
            "0,1",
            "--resume",
            "false",
            "--limit",
            "10",
            "--max-tokens",
            "16",
        ]
    )
    cfg = config_from_args(args)
    assert (cfg.k_samples, cfg.gpus, cfg.resume, cfg.limit, cfg.max_tokens) == (
        2,
        (0, 1),
        False,
        10,
        16,
    )


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--k-samples", "abc"], "argument --k-samples: invalid int value: 'abc'"),
        (["--resume", "maybe"], "argument --resume: expected true or false"),
        (["--sample-top-p", "2"], "--sample-top-p must be in (0, 1]"),
        (["--logging-profile", "huge"], "argument --logging-profile: invalid choice"),
        (["--storage-format", "wds"], "argument --storage-format: invalid choice: 'wds'"),
        (
            ["--spool-root", "/nonexistent/spool"],
            "--spool-root /nonexistent/spool is not a directory",
        ),
    ],
)
def test_bad_flag_is_a_clear_cli_error(argv, needle, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", *argv, "--artifact-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert not (tmp_path / "run_manifest.json").exists()


def test_spool_root_gives_each_artifact_root_its_own_spool(tmp_path):
    """Default: spool/ in the artifact root. Under --spool-root (e.g. /dev/shm, shared by
    every run on the machine) each artifact root gets a directory of its own, the same one on
    resume, so that one run's start-up and clean-up never touch another's capture files."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert layout.spool_dir(a, 1) == a / "spool" / "server_1"
    shared = tmp_path / "shm"
    sa, sb = layout.spool_dir(a, 0, shared), layout.spool_dir(b, 0, shared)
    assert sa.parent.parent == sb.parent.parent == shared and sa != sb
    assert sa == layout.spool_dir(tmp_path / "x" / ".." / "a", 0, shared)  # same root
    assert sa.parent == layout.run_spool_dir(a, shared)


def test_remove_spools_leaves_other_runs_alone(tmp_path):
    shared = tmp_path / "shm"
    mine, other = (
        layout.spool_dir(tmp_path / "a", 0, shared),
        layout.spool_dir(tmp_path / "b", 0, shared),
    )
    for spool in (mine, other):
        spool.mkdir(parents=True)
        (spool / "req.safetensors").write_bytes(b"x")
    remove_spools(tmp_path / "a", shared)
    assert not mine.parent.exists() and (other / "req.safetensors").exists()
    default = layout.spool_dir(tmp_path / "c", 0)
    default.mkdir(parents=True)
    (default / "req.safetensors").write_bytes(b"x")
    remove_spools(tmp_path / "c", None)
    assert default.is_dir() and not any(default.iterdir())  # emptied, kept in the layout


def test_post_run_commands_keep_a_recorded_spool_root_only_while_it_exists(tmp_path):
    """--retry-failed starts servers again: they spool where the run did, unless that directory
    is gone (a tmpfs after a reboot), when the artifact root's spool/ is used."""
    shm = tmp_path / "shm"
    shm.mkdir()
    root = tmp_path / "run"
    root.mkdir()
    (root / layout.MANIFEST).write_text(
        json.dumps({"config": {"spool_root": str(shm), "k_samples": 2}})
    )
    argv = ["run", "--artifact-root", str(root), "--retry-failed"]
    cfg = config_from_args(build_parser().parse_args(argv))
    assert cfg.spool_root == shm and cfg.k_samples == 2
    shm.rmdir()
    assert config_from_args(build_parser().parse_args(argv)).spool_root is None


@pytest.mark.parametrize(
    "command",
    ["run", "consolidate", "validate", "retry", "merge", "evaluate", "status", "estimate"],
)
def test_every_subcommand_has_its_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([command, "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: hallulog {command} ")


@pytest.mark.parametrize(
    "argv,command,line",
    [
        (
            ["--consolidate-only", "--merge"],
            "consolidate",
            "hallulog run --consolidate-only is deprecated: use `hallulog consolidate --artifact-root "
            "{root} --merge` (doing that now)",
        ),
        (
            ["--validate-only", "--deep"],
            "validate",
            "hallulog run --validate-only is deprecated: use `hallulog validate --artifact-root {root} "
            "--deep` (doing that now)",
        ),
        (
            ["--retry-failed"],
            "retry",
            "hallulog run --retry-failed is deprecated: use `hallulog retry --artifact-root {root}` "
            "(doing that now)",
        ),
    ],
)
def test_deprecated_run_flags_say_what_to_use_then_become_it(argv, command, line, tmp_path, capsys):
    from hallulog.cli.app import _replace_deprecated

    args = build_parser().parse_args(["run", "--artifact-root", str(tmp_path), *argv])
    _replace_deprecated(args)
    assert args.command == command
    assert capsys.readouterr().err.splitlines() == [line.format(root=tmp_path)]
    # and the post-run config comes from the recorded manifest, as for the subcommand
    (tmp_path / layout.MANIFEST).write_text(json.dumps({"config": {"k_samples": 3}}))
    assert config_from_args(args).k_samples == 3
    assert (
        config_from_args(
            build_parser().parse_args([command, "--artifact-root", str(tmp_path)])
        ).k_samples
        == 3
    )
    assert (
        config_from_args(
            build_parser().parse_args(["run", "--artifact-root", str(tmp_path)])
        ).k_samples
        == 5
    )  # run: the flags only


def test_another_package_registers_a_subcommand(tmp_path):
    from hallulog.cli import app as cli

    def add(sub):
        p = sub.add_parser("touch", help="Create a file.")
        p.add_argument("path", type=str)
        return p

    def handler(args) -> int:
        open(args.path, "w").close()
        return 7

    saved = list(cli.SUBCOMMANDS)
    try:
        cli.register_subcommand("touch", add, handler)
        assert cli.main(["touch", str(tmp_path / "made")]) == 7
        assert (tmp_path / "made").exists()
        cli.register_subcommand("touch", add, lambda args: 0)  # the same name replaces it
        assert [c.name for c in cli.SUBCOMMANDS].count("touch") == 1
        assert cli.main(["touch", str(tmp_path / "again")]) == 0
    finally:
        cli.SUBCOMMANDS[:] = saved
