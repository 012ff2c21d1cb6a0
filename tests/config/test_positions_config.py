"""``--layers``, ``--positions`` and the ``probes`` profile in the run config (docs/alignment.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hallulog.config.plan import stored_of
from hallulog.config.run_config import PROFILES, ConfigError, RunConfig, select_layer_ids

REPO = Path(__file__).resolve().parents[2]


def test_positions_override_the_sequence_mode():
    config = RunConfig(positions="TBG, last:2,tbg")
    assert config.profile.sequence_mode == "positions"
    assert config.profile.positions == ("tbg", "last:2")
    assert config.fingerprint_fields()["positions"] == "tbg,last:2"
    with pytest.raises(ConfigError, match="--positions or --sequence-mode"):
        RunConfig(positions="tbg", sequence_mode="all")
    with pytest.raises(ConfigError, match="--positions: unknown position 'mid'"):
        RunConfig(positions="tbg,mid")


def test_the_default_config_is_unchanged():
    config = RunConfig()
    assert config.profile == PROFILES["integrated"] and config.profile.positions is None
    fields = config.fingerprint_fields()
    assert "positions" not in fields and "layers" not in fields
    assert fields["sequence_mode"] == "response" and fields["target_layers"] == "all"
    assert list(stored_of(config, 30).layer_ids) == list(range(31))


def test_the_probes_profile():
    config = RunConfig(logging_profile="probes")
    profile = config.profile
    assert profile.positions == ("tbg", "slt", "exact_answer", "last")
    assert profile.sequence_mode == "positions" and profile.dtype == "float16"
    assert list(stored_of(config, 30).layer_ids) == [15, 20]
    assert select_layer_ids("spread", 32) == [16, 21]
    assert config.fingerprint_fields()["positions"] == "tbg,slt,exact_answer,last"
    # a sequence mode given replaces the profile's positions
    assert RunConfig(logging_profile="probes", sequence_mode="last").profile.positions is None


def test_layers_override_the_profile_and_are_checked_against_the_model():
    config = RunConfig(layers="0,15,-1", target_layers="first_half")
    assert list(stored_of(config, 30).layer_ids) == [0, 15, 30]
    with pytest.raises(
        ConfigError,
        match=r"--layers: layer 40 is out of range for a model "
        r"with 30 layers \(ids 0\.\.30\)",
    ):
        list(stored_of(RunConfig(layers="0,40"), 30).layer_ids)
    with pytest.raises(ConfigError, match="--layers: cannot read"):
        RunConfig(layers="0,x")


def test_a_bad_layer_stops_the_run_before_any_server(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--artifact-root",
            str(tmp_path / "run"),
            "--layers",
            "0,99",
            "--limit",
            "1",
            "--progress",
            "false",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert lines == [
        "error: --layers: layer 99 is out of range for a model with 30 layers (ids 0..30)"
    ], proc.stderr[-2000:]
    assert "starting server" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "run_manifest.json").exists()
