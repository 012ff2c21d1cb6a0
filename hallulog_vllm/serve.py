"""``python -m hallulog_vllm.serve --fd N [vLLM's api_server arguments]``: vLLM's OpenAI-compatible
server on a listening socket its parent bound and handed down (file descriptor ``N``).

vLLM 0.32's API server has no option to serve on an inherited socket (``--uds`` binds a Unix
socket path; ``--host``/``--port`` make it bind a TCP port itself, after its imports). Here its
``create_server_socket`` (``vllm.entrypoints.launchers.launcher``, the one place
``setup_server`` makes the socket) is given the inherited socket instead, then vLLM's own
``main`` runs with the remaining arguments: the port is the parent's from before the server
starts until after it stops, with no window in which another program could take it. The
``--host``/``--port`` arguments stay for vLLM's log lines and listen address.

A vLLM without that function stops at once with one line naming the version: the run then
knows its server cannot take the socket (the parent still holds the port, so vLLM could not
bind it either). Imports nothing of hallulog.
"""

from __future__ import annotations

import socket
import sys

__all__ = ["split_fd", "main"]


def split_fd(argv: list[str]) -> tuple[int, list[str]]:
    """``(fd, the other arguments)`` of ``argv`` (``--fd N`` or ``--fd=N``, anywhere)."""
    rest, fd = [], None
    it = iter(argv)
    for arg in it:
        if arg == "--fd":
            fd = next(it, None)
        elif arg.startswith("--fd="):
            fd = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if fd is None or not str(fd).isdigit():
        raise SystemExit(
            "hallulog_vllm.serve: --fd N (a listening socket's descriptor) is required"
        )
    return int(fd), rest


def main(argv: list[str] | None = None) -> None:
    fd, rest = split_fd(list(sys.argv[1:] if argv is None else argv))
    sock = socket.socket(fileno=fd)
    if sock.type != socket.SOCK_STREAM:
        raise SystemExit(f"hallulog_vllm.serve: descriptor {fd} is not a stream socket")
    import vllm
    from vllm.entrypoints.launchers import launcher

    if not callable(getattr(launcher, "create_server_socket", None)):
        raise SystemExit(
            f"hallulog_vllm.serve: vLLM {vllm.__version__} has no "
            "vllm.entrypoints.launchers.launcher.create_server_socket to hand the socket to"
        )

    def inherited(addr, *, reuse_port: bool = False) -> socket.socket:
        return sock

    launcher.create_server_socket = inherited
    from vllm.entrypoints.launchers.api_server.entry import main as serve

    sys.argv = [sys.argv[0], *rest]
    serve()


if __name__ == "__main__":
    main()
