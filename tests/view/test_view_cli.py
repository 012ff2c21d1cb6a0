"""``hallulog view``: the subcommand's export, its one-line errors, and a real server process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from hallulog.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_export_from_the_command_line(synthetic_run, tmp_path, capsys):
    out = tmp_path / "site"
    code = main(["view", str(synthetic_run), "--export", str(out), "--export-limit", "3"])
    assert code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"exported {synthetic_run} to {out / 'index.html'} (")
    assert (out / "index.html").is_file()


def test_a_root_without_consolidated_is_one_line(tmp_path, capsys):
    assert main(["view", str(tmp_path), "--port", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"hallulog view: error: {tmp_path} has no consolidated/ (not a finished run): run "
        f"`hallulog consolidate --artifact-root {tmp_path}`"
    ]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--memory-limit", "lots"], "--memory-limit 'lots': a size such as 512MB"),
        (["--export-limit", "0"], "--export-limit must be >= 1, got 0"),
        (["--port", "x"], "argument --port: invalid int value"),
    ],
)
def test_bad_flags_are_one_line(synthetic_run, capsys, flags, words):
    try:
        code = main(["view", str(synthetic_run), *flags])
    except SystemExit as exc:  # argparse's own checks
        code = exc.code
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert words in line


def test_off_loopback_without_a_token_is_refused(synthetic_run, capsys, monkeypatch):
    monkeypatch.delenv("HALLULOG_VIEW_TOKEN", raising=False)
    assert main(["view", str(synthetic_run), "--host", "0.0.0.0"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "not loopback, without a token; pass --token TOKEN" in line


@pytest.mark.slow
def test_without_duckdb_the_install_line(synthetic_run):
    code = (
        "import sys\nsys.modules['duckdb'] = None\nfrom hallulog.cli import main\n"
        f"raise SystemExit(main(['view', {str(synthetic_run)!r}, '--port', '0']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "hallulog view: error: hallulog view needs the Python package 'duckdb', which is not "
        "installed: pip install 'hallulog[view]'  (or: pip install duckdb)"
    ]


@pytest.mark.slow
def test_serves_until_interrupted(unevaluated_run):
    proc = subprocess.Popen(
        [sys.executable, "-m", "hallulog", "view", str(unevaluated_run), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "HALLULOG_VIEW_TOKEN": ""},
    )
    try:
        banner = proc.stdout.readline().strip()  # blocks until the socket is bound
        assert banner.startswith("hallulog view: http://127.0.0.1:"), banner
        url = banner.split()[2]
        with urllib.request.urlopen(url + "api/run", timeout=30) as r:
            summary = json.load(r)
        assert summary["counts"]["prompts"] == 300 and summary["ranking"] == []
        assert "hallulog evaluate --artifact-root" in summary["evaluation_missing"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read()
        assert err.startswith(f"note: {unevaluated_run} has no evaluation"), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
