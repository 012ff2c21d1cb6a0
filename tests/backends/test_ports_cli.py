"""Ports and identity of managed servers, and the CLI's one-line errors.

A foreign OpenAI-protocol server (a few lines of ``http.server``) answers on a port in this
suite's range (9300-9399) in its own session, like another user's server would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from hallulog.backends.ports import (
    check_owner,
    choose_ports,
    listening_pids,
    port_free,
    release_port,
)
from hallulog.contracts.errors import BackendStartError

REPO = Path(__file__).resolve().parents[2]
FOREIGN = textwrap.dedent("""
    import http.server, json, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"object": "list", "data": [{"id": "someone-elses-model"}]})
            self.send_response(200); self.end_headers(); self.wfile.write(body.encode())
        def do_POST(self):
            self.send_response(500); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _free_in_range(start: int = 9340, stop: int = 9399) -> int:
    for port in range(start, stop):
        if port_free(port):
            return port
    pytest.skip("no free port in 9340-9399")


@pytest.fixture
def foreign_server():
    port = _free_in_range()
    proc = subprocess.Popen([sys.executable, "-c", FOREIGN, str(port)], start_new_session=True)
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "foreign server did not start"
        time.sleep(0.1)
    yield port, proc
    proc.kill()
    proc.wait()


def test_a_taken_base_port_is_an_error_naming_it(foreign_server):
    port, proc = foreign_server
    with pytest.raises(BackendStartError, match=f"port {port} .*already in use.*pid {proc.pid}"):
        choose_ports(1, port)


def test_without_a_base_port_taken_ports_are_skipped():
    ports = choose_ports(2, None)
    try:
        assert len(set(ports)) == 2 and all(port_free(p) for p in ports)
    finally:
        for port in ports:
            release_port(port)


def test_the_listening_process_must_be_the_one_started(foreign_server):
    port, proc = foreign_server
    assert proc.pid in (listening_pids(port) or set())
    check_owner("server_0", port, proc.pid)  # its own server: accepted
    with pytest.raises(BackendStartError, match=f"port {port} is answered by pid {proc.pid}"):
        check_owner("server_0", port, os.getpid())


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_missing_task_file_is_one_line(tmp_path):
    proc = _cli(
        "run",
        "--artifact-root",
        str(tmp_path / "r"),
        "--task-path",
        str(tmp_path / "nope.jsonl"),
        "--limit",
        "1",
    )
    assert proc.returncode == 1
    assert "nope.jsonl" in _one_line_error(proc)


def test_artifact_root_that_cannot_be_created_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _cli("run", "--artifact-root", str(blocker / "run"), "--limit", "1")
    assert proc.returncode == 1
    assert str(blocker) in _one_line_error(proc)


def test_debug_shows_the_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _cli("run", "--artifact-root", str(blocker / "run"), "--limit", "1", "--debug")
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_status_of_a_missing_root_is_one_line(tmp_path):
    proc = _cli("status", "--artifact-root", str(tmp_path / "none"))
    assert proc.returncode == 1
    _one_line_error(proc)


@pytest.mark.slow
def test_run_refuses_a_foreign_server_on_its_port(foreign_server, tmp_path):
    """The reported bug: a foreign server on the base port was taken as the managed one (every
    capture failed, yet '0 failed' and 'validation OK')."""
    port, proc = foreign_server
    run = _cli(
        "run",
        "--artifact-root",
        str(tmp_path / "r"),
        "--limit",
        "3",
        "--k-samples",
        "1",
        "--max-tokens",
        "4",
        "--server-base-port",
        str(port),
        "--progress",
        "false",
        timeout=600,
    )
    assert run.returncode == 1, run.stderr[-3000:]
    line = _one_line_error(run)
    assert f"port {port}" in line and "already in use" in line
    assert "preparing the default model" in run.stderr  # startup says what it is doing
    assert proc.poll() is None  # the foreign server was left alone


def test_servers_left_by_a_sigkilled_run_are_stopped_by_the_rerun(tmp_path, foreign_server):
    """A run killed with SIGKILL leaves servers/server_i.pid (group id, url); the next run's
    start_servers kills those groups before choosing ports, so the port is free again."""
    from hallulog.backends.servers import kill_stale_servers

    port = _free_in_range(9380)
    # stands in for `python -m hallulog.serving ...` (the name kill_stale_servers checks)
    left = subprocess.Popen(
        [sys.executable, "-c", FOREIGN, str(port), "-m", "hallulog.serving", "--model", "x"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while port_free(port):
            assert time.monotonic() < deadline, "stand-in server did not bind"
            time.sleep(0.1)
        servers = tmp_path / "servers"
        servers.mkdir()
        (servers / "server_0.pid").write_text(f"{left.pid} http://127.0.0.1:{port}\n")
        # an unrelated process recorded by mistake (recycled pid) is left alone
        other_port, other = foreign_server
        (servers / "server_1.pid").write_text(f"{other.pid} http://127.0.0.1:{other_port}\n")
        assert kill_stale_servers(servers) == [left.pid]
        assert left.wait(timeout=10) is not None
        assert other.poll() is None
        assert port_free(port)
        assert not list(servers.glob("*.pid"))
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()


@pytest.mark.parametrize(
    "argv", [["run", "--k-samples", "abc"], ["run", "--sample-top-p", "2"], ["bogus"]]
)
def test_a_bad_flag_is_one_line_and_exit_2(tmp_path, argv):
    proc = _cli(*argv, "--artifact-root", str(tmp_path)) if argv[0] == "run" else _cli(*argv)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and "--help" in lines[0], proc.stderr
