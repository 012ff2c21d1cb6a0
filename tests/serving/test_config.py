"""CLI parsing (no model needed)."""

import pytest
from hallulog.serving.config import ServerConfig, parse_args


def test_defaults():
    cfg = parse_args([])
    assert cfg.model == "default" and cfg.host == "127.0.0.1" and cfg.dtype == "float32"
    assert cfg.spool_dir is None and cfg.model_name == "smollm2-135m-instruct"


def test_flags():
    cfg = parse_args(
        [
            "--model",
            "/m",
            "--port",
            "9",
            "--spool-dir",
            "/s",
            "--dtype",
            "bfloat16",
            "--max-batch-size",
            "4",
            "--batch-wait-ms",
            "2.5",
            "--capture-layers",
            "0,3",
        ]
    )
    assert (cfg.port, cfg.max_batch_size, cfg.batch_wait_ms) == (9, 4, 2.5)
    assert cfg.model_name == "/m" and cfg.capture_layers == "0,3" and cfg.spool_dir == "/s"
    assert parse_args(["--served-model-name", "x"]).model_name == "x"
    cfg = parse_args(["--engines", "3", "--num-threads", "2"])
    assert (cfg.engines, cfg.num_threads) == (3, 2)


@pytest.mark.parametrize(
    "argv",
    [
        ["--dtype", "int8"],
        ["--port", "x"],
        ["--max-batch-size", "0"],
        ["--batch-wait-ms", "-1"],
        ["--engines", "-1"],
    ],
)
def test_bad_flags_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_config_checks():
    with pytest.raises(ValueError, match="port"):
        ServerConfig(port=70000)
