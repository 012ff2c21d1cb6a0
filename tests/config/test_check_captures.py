"""``--check-captures``: on by default, off from the command line or a study file, outside the
fingerprint (it changes no row that passes), handed to every worker."""

from __future__ import annotations

import pytest
from hallulog.cli.app import build_parser, config_from_args
from hallulog.config.run_config import RunConfig
from hallulog.contracts.errors import ConfigError


def test_on_by_default_and_outside_the_fingerprint():
    assert RunConfig().check_captures is True
    off = RunConfig(check_captures=False)
    assert off.fingerprint_fields() == RunConfig().fingerprint_fields()
    assert off.to_dict()["check_captures"] is False  # recorded in the manifest's config


def test_from_the_command_line_and_a_study_file(tmp_path):
    args = build_parser().parse_args(["run", "--check-captures", "false"])
    assert config_from_args(args).check_captures is False
    study = tmp_path / "study.toml"
    study.write_text("check_captures = false\n")
    args = build_parser().parse_args(["run", "--config", str(study)])
    assert config_from_args(args).check_captures is False
    study.write_text('check_captures = "no"\n')
    with pytest.raises((ConfigError, SystemExit)):
        config_from_args(build_parser().parse_args(["run", "--config", str(study)]))
