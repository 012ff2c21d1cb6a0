"""The embedded server serves on a socket the run bound (run.ports.listen_on_ports): no other
program can take its port between the run's choice and the server's start, nor while the server
is down between two starts; a restart serves on the same port. Real server, real model."""

from __future__ import annotations

import errno
import socket
import sys

import pytest
from hallulog.backends.embedded import embedded_server_command
from hallulog.backends.ports import listen_on_ports, port_free
from hallulog.backends.servers import ServerProcess
from hallulog.serving.model_loader import default_model_dir

pytestmark = pytest.mark.e2e


def _foreign_bind(port: int) -> int:
    """What a foreign program trying to listen on ``port`` gets: 0 (it could) or the errno."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno or -1
    return 0


def test_the_run_holds_its_servers_port_across_restarts(tmp_path):
    (listener,) = listen_on_ports(1, None)
    port = listener.getsockname()[1]
    assert _foreign_bind(port) == errno.EADDRINUSE  # the run's from its choice on
    command = embedded_server_command(
        default_model_dir(),
        host="127.0.0.1",
        port=port,
        spool_dir=tmp_path / "spool",
        dtype="float32",
        layer_ids=[0, 30],
        served_model_name="m",
        extra_args=["--num-threads", "1"],
    )
    assert command[0] == sys.executable
    server = ServerProcess(
        name="server_0",
        command=command,
        url=f"http://127.0.0.1:{port}",
        log_path=tmp_path / "server_0.log",
        startup_timeout=300,
        listener=listener,
    )
    try:
        server.start()
        server.wait_ready()  # healthy, and the listening socket is its own (check_owner)
        server.stop(grace=5, final=False)  # down, as between a crash and its restart
        assert _foreign_bind(port) == errno.EADDRINUSE
        server.restart()
        assert server.alive()
        assert "--fd" in (tmp_path / "server_0.log").read_text()
    finally:
        server.stop(grace=5)
    assert server.listener is None
    assert port_free(port)  # given back once stopped for good
