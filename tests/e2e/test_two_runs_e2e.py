"""Two runs on one machine at the same instant, with an empty model cache (the real model):
both finish with clean artifacts on different ports; the cache holds one converted model.
The same with ``--backend vllm`` (vllm-cpu): each vLLM server serves on the socket its run bound
(``hallulog_vllm.serve --fd``), so while vLLM imports and loads, the port is already taken (a
foreign bind gets EADDRINUSE). bench/bench_two_runs.py repeats this round N times."""

from __future__ import annotations

import errno
import re
import socket
import threading
import time

import pytest

from bench.bench_two_runs import one_round

pytestmark = [pytest.mark.e2e, pytest.mark.alone]  # two runs racing for ports and the model cache


def test_two_runs_started_together_on_an_empty_cache(tmp_path):
    result = one_round(tmp_path, limit=2)
    assert result["problems"] == [], result
    assert len(result["ports"]) == 2 and all(result["ports"])


def _probe_ports(work, stop: threading.Event, seen: dict) -> None:
    """As soon as a run's server is started, bind its port from here (a foreign program):
    ``run name -> (errno of the bind, whether the server was still starting)``."""
    pattern = re.compile(r"=== start \S+: (.*)")
    while not stop.is_set() and len(seen) < 2:
        for name in ("a", "b"):
            log = work / name / "servers" / "server_0.log"
            if name in seen or not log.exists():
                continue
            text = log.read_text(errors="replace")
            found = pattern.search(text)
            if not found:
                continue
            argv = found.group(1).split()
            port = int(argv[argv.index("--port") + 1])
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                    code = 0
                except OSError as exc:
                    code = exc.errno
            starting = "Application startup complete" not in log.read_text(errors="replace")
            seen[name] = (code, starting, argv)
        time.sleep(0.05)


@pytest.mark.vllm
def test_two_vllm_runs_hold_their_ports_from_the_start(tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")
    seen: dict = {}
    stop = threading.Event()
    probe = threading.Thread(target=_probe_ports, args=(tmp_path, stop, seen), daemon=True)
    probe.start()
    try:
        result = one_round(tmp_path, limit=2, backend="vllm")
    finally:
        stop.set()
        probe.join(timeout=10)
    assert result["problems"] == [], result
    assert len(result["ports"]) == 2 and all(result["ports"])
    assert set(seen) == {"a", "b"}, seen
    for name, (code, _, argv) in seen.items():
        assert argv[1:3] == ["-m", "hallulog_vllm.serve"] and "--fd" in argv, argv
        assert code == errno.EADDRINUSE, (name, code)  # the run's port, before vLLM binds
    assert any(starting for _, starting, _ in seen.values())  # probed while vLLM was loading
