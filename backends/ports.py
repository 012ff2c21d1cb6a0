"""Ports of managed servers: a free port before start, and the right process behind it after.

A managed server must be the process the orchestrator started. Another OpenAI-protocol server
already answering on the port would pass every health check and then fail every capture, so:

* before starting, each port is bind-checked; a taken port is an error naming it when
  ``--server-base-port`` was given, else the next free port is used (and said);
* a port the run chose itself is also *reserved* for the run's life: an exclusive ``flock`` on
  ``$TMPDIR/hallulog-ports/<port>.lock`` held by the driver (released by the kernel however the
  driver ends). Two runs choosing ports at the same instant skip each other's reservations, so
  they never pick the same port and never fight over it (a port between the bind check and the
  server's own bind is otherwise free for anyone: a server needs seconds before it binds);
* after health, the socket listening on the port must belong to the started process group
  (``/proc/net/tcp*`` socket inode → ``/proc/<pid>/fd``), whichever backend it is.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from hallulog.contracts.errors import BackendStartError

__all__ = [
    "DEFAULT_BASE_PORT",
    "port_free",
    "choose_ports",
    "listen_on_ports",
    "close_listener",
    "listening_pids",
    "check_owner",
    "reserve_port",
    "release_port",
    "reservation_dir",
]

log = logging.getLogger(__name__)
say = logging.getLogger("orchestrator.startup")

DEFAULT_BASE_PORT = 8000
_SCAN = 200  # ports tried past the default base before giving up


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listening socket could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def choose_ports(count: int, base: int | None, host: str = "127.0.0.1") -> list[int]:
    """``count`` ports for the managed servers, each free now and reserved for this process.

    ``base`` given (``--server-base-port``): exactly ``base .. base+count-1``, and a taken one is
    an error naming it. ``base`` None: free ports from :data:`DEFAULT_BASE_PORT` on.
    """
    return _claim(count, base, host, lambda port: port if port_free(port, host) else None)


def listen_on_ports(count: int, base: int | None, host: str = "127.0.0.1") -> list[socket.socket]:
    """As :func:`choose_ports`, but each port is bound here: listening sockets, one per server.

    A server that takes its listening socket from its parent (``hallulog serve --fd N``)
    has its port from this moment on, across its restarts, with no window in which another
    program could bind it (a port only checked free stays free for anyone until the server's
    own bind, seconds later). Close a socket with :func:`close_listener` once its server is
    stopped for good.
    """
    return _claim(count, base, host, lambda port: _listener(port, host))


def close_listener(sock: socket.socket) -> None:
    """Close a socket of :func:`listen_on_ports` and end its port's reservation."""
    port = sock.getsockname()[1]
    sock.close()
    release_port(port)


def _listener(port: int, host: str) -> socket.socket | None:
    """A socket listening on ``host:port``, or None when the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog
    except OSError:
        sock.close()
        return None
    return sock


T = TypeVar("T")


def _claim(count: int, base: int | None, host: str, take: Callable[[int], T | None]) -> list[T]:
    """``count`` ports reserved for this process and taken with ``take`` (None: in use)."""
    taken: list[T] = []

    def give_back(ports: Iterable[int]) -> None:
        for held in ports:
            release_port(held)
        for item in taken:
            if isinstance(item, socket.socket):
                item.close()

    if base is not None:
        for i in range(count):
            port = base + i
            problem = None
            reserved = reserve_port(port)
            item = take(port) if reserved else None
            if not reserved:
                problem = (
                    f"port {port} (--server-base-port {base} + {i}) is reserved by another "
                    f"hallulog run ({reservation_dir() / f'{port}.lock'}); pick another "
                    "--server-base-port"
                )
            elif item is None:
                problem = (
                    f"port {port} (--server-base-port {base} + {i}) is already in use"
                    f"{_owner_text(port)}; stop that process or pick another "
                    "--server-base-port"
                )
            if problem is not None:
                give_back(range(base, port + 1))  # a refused run keeps no reservation
                raise BackendStartError(problem)
            taken.append(item)
        return taken
    ports: list[int] = []
    for port in range(DEFAULT_BASE_PORT, DEFAULT_BASE_PORT + _SCAN):
        if len(taken) == count:
            break
        if not reserve_port(port):
            say.info("port %d is reserved by another hallulog run: trying the next one", port)
            continue
        item = take(port)
        if item is not None:
            taken.append(item)
            ports.append(port)
        else:
            release_port(port)
            say.info("port %d is already in use%s: trying the next one", port, _owner_text(port))
    if len(taken) < count:
        give_back(ports)
        raise BackendStartError(
            f"no {count} free port(s) in {DEFAULT_BASE_PORT}-"
            f"{DEFAULT_BASE_PORT + _SCAN - 1}; pass --server-base-port"
        )
    return taken


_reserved: dict[int, int] = {}  # port -> the fd whose flock reserves it
_reserved_lock = threading.Lock()


def reservation_dir() -> Path:
    """Where ports are reserved: one directory for every user of this machine (sticky, like
    /tmp), so runs of different users skip each other's ports too."""
    path = Path(
        os.environ.get("HALLULOG_PORT_DIR") or Path(tempfile.gettempdir()) / "hallulog-ports"
    )
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        try:
            path.chmod(0o1777)
        except OSError:
            pass
    return path


def reserve_port(port: int) -> bool:
    """Reserve ``port`` for this process (re-entrant); False when another process holds it."""
    with _reserved_lock:
        if port in _reserved:
            return True
        path = reservation_dir() / f"{port}.lock"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except PermissionError:  # another user's file we cannot open: theirs
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        _reserved[port] = fd
        return True


def release_port(port: int) -> None:
    """End this process's reservation of ``port`` (nothing when it holds none)."""
    with _reserved_lock:
        fd = _reserved.pop(port, None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor releases the flock


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(fields[9])
    return inodes


def listening_pids(port: int) -> set[int] | None:
    """Pids holding a socket that listens on ``port`` (None: /proc cannot tell)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    pids = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                try:
                    if os.readlink(fd.path) in wanted:
                        pids.add(int(entry.name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return pids or None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120]


def _owner_text(port: int) -> str:
    pids = listening_pids(port)
    if not pids:
        return ""
    pid = min(pids)
    return f" by pid {pid} ({_cmdline(pid)})"


def check_owner(name: str, port: int, leader_pid: int) -> None:
    """Raise unless the socket listening on ``port`` belongs to ``leader_pid``'s group."""
    pids = listening_pids(port)
    if pids is None:
        log.warning(
            "%s: cannot tell which process listens on port %d (no /proc): trusting "
            "the health check",
            name,
            port,
        )
        return
    if any(_pgid(p) == leader_pid for p in pids):
        return
    pid = min(pids)
    raise BackendStartError(
        f"port {port} is answered by pid {pid} ({_cmdline(pid)}), not by {name} (pid "
        f"{leader_pid}) that this run started; stop that process or pick another "
        "--server-base-port"
    )
