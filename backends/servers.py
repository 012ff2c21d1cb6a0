"""Backend server processes: spawn, wait for health, watch, stop.

The server object owns its subprocess: it runs in its own process group with one log file under
``artifact_root/servers/``; readiness polling is bounded and fails fast when the process exits;
stopping sends SIGTERM to the group, waits, then SIGKILLs it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import httpx

from hallulog.contracts import layout
from hallulog.contracts.process import die_with_parent
from hallulog.contracts.errors import BackendStartError
from hallulog.backends.base import ServerSpec
from hallulog.backends.ports import check_owner, close_listener, release_port
from hallulog.backends.registry import BACKENDS
from hallulog.backends.shm import shm_names, sweep
from hallulog.backends.vllm import engine_child_pids

__all__ = [
    "start_servers", "clear_spool", "remove_spools", "ServerProcess",
    "wait_healthy", "kill_stale_servers", "server_command", "ServerBoard",
]



class ServerBoard(Protocol):
    """Where server states are reported (the run's status board)."""

    def server_update(self, url: str, **fields: Any) -> None: ...


log = logging.getLogger(__name__)
say = logging.getLogger("orchestrator.startup")
"""What a person waits for at startup (the CLI prints it on stderr whatever the log level)."""

def server_command(spec: ServerSpec, *, host: str, port: int, spool_dir: Path | str,
                   inherited_socket: bool = False) -> list[str]:
    """The command line of one managed server of ``spec`` (its backend's: capture flags, the
    engine options, then ``--engine-args`` split as a shell would, last). ``inherited_socket``:
    the caller appends ``--fd N`` of a listening socket it bound (the embedded server always
    takes it)."""
    return spec.backend.command(spec, host=host, port=port, spool_dir=spool_dir,
                                inherited_socket=inherited_socket)


def wait_healthy(url: str, timeout: float, *, process: subprocess.Popen | None = None,
                 log_path: Path | None = None, interval: float = 0.5,
                 name: str | None = None, path: str = "/health") -> float:
    """Poll ``{url}{path}`` (the backend's health probe) until 200; returns seconds waited.
    Fails fast if ``process`` exits.

    With ``name``, says every 10 s that it is still waiting (startup messages)."""
    start = next_note = time.monotonic()
    probe = 5.0 if process is None else max(1.0, 2 * interval)
    while True:
        if name is not None and time.monotonic() >= next_note:
            say.info("%s: waiting for %s%s (%.0f s of at most %.0f s)", name, url, path,
                     time.monotonic() - start, timeout)
            next_note += 10.0
        if process is not None and process.poll() is not None:
            raise BackendStartError(f"server {url} exited with code {process.returncode} "
                                    f"before becoming healthy{_log_tail(log_path)}")
        try:  # short when the process is watched: a dead server's port may still accept
            # (its socket is the run's, run.ports), and the exit is noticed between polls
            if httpx.get(f"{url}{path}", timeout=probe).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        if time.monotonic() - start > timeout:
            raise BackendStartError(f"server {url} not healthy after {timeout:.0f} s "
                                    f"(--server-startup-timeout){_log_tail(log_path)}")
        time.sleep(interval)


def _log_tail(log_path: Path | None, lines: int = 30) -> str:
    if log_path is None or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"; last lines of {log_path}:\n" + "\n".join(tail)


def kill_stale_servers(servers_dir: Path) -> list[int]:
    """Kill the process groups recorded in ``servers_dir/*.pid`` by a run that crashed.

    A group is killed only while its leader's command line still names a backend's server
    (``Backend.process_markers``), so a recycled pid is never hit. Returns the killed group ids.
    """
    killed = []
    for pidfile in Path(servers_dir).glob("*.pid"):
        try:
            pgid = int(pidfile.read_text().split()[0])
            cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().replace(b"\0", b" ")
        except (ValueError, IndexError, OSError):
            pidfile.unlink(missing_ok=True)
            continue
        if any(m in cmdline for b in BACKENDS.values() for m in b.process_markers):
            log.warning("killing stale server process group %d left by a crashed run", pgid)
            _signal_group(pgid, signal.SIGKILL)
            killed.append(pgid)
        pidfile.unlink(missing_ok=True)
    if killed:
        time.sleep(1.0)  # let the kernel release the ports
    return killed


@dataclass
class ServerProcess:
    """One managed backend server."""

    name: str
    command: list[str]
    url: str
    log_path: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    startup_timeout: float = 600.0
    process: subprocess.Popen | None = None
    restarts: int = 0
    startup_seconds: float | None = None
    shm_before: set[str] = field(default_factory=set)
    """/dev/shm names present when it started: what appears after is its children's."""
    listener: socket.socket | None = None
    """A listening socket bound by the run (run.ports.listen_on_ports) that the server serves
    on (``--fd``: the embedded server, and vLLM through ``hallulog_vllm.serve``): the port stays
    the run's while the server restarts; None: the server binds its port itself."""
    health_path: str = "/health"
    """Its backend's health probe."""

    def start(self) -> None:
        """Spawn the process in its own process group, logging to ``log_path``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.shm_before = shm_names()
        command, inherited = self.command, ()
        if self.listener is not None:  # the run's bound socket, served on as it is
            inherited = (self.listener.fileno(),)
            command = [*command, "--fd", str(inherited[0])]
        log_file = open(self.log_path, "ab")
        log_file.write(f"\n=== start {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                       f"{' '.join(command)}\n".encode())
        log_file.flush()
        self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.env,
                                        start_new_session=True, pass_fds=inherited,
                                        preexec_fn=partial(die_with_parent, signal.SIGTERM,
                                                           os.getpid()))
        log_file.close()
        self.pid_path.write_text(f"{self.process.pid} {self.url}\n")  # group id, then url
        say.info("starting %s (pid %d) on %s, log %s", self.name, self.process.pid, self.url,
                 self.log_path)

    @property
    def pid_path(self) -> Path:
        """Records the process group so a later run can clean up after a crash."""
        return self.log_path.with_suffix(".pid")

    def wait_ready(self) -> float:
        """Block until healthy (bounded by ``startup_timeout``); returns the seconds it took."""
        assert self.process is not None, "start() first"
        self.startup_seconds = wait_healthy(self.url, self.startup_timeout,
                                            process=self.process, log_path=self.log_path,
                                            name=self.name, path=self.health_path)
        # a foreign server on the port answers /health too: it must be ours
        check_owner(self.name, self.port, self.process.pid)
        say.info("%s healthy after %.1f s", self.name, self.startup_seconds)
        return self.startup_seconds

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 20.0, *, final: bool = True) -> None:
        """SIGTERM the process group, wait up to ``grace`` s, then SIGKILL it. ``final``
        (not a restart): the port's reservation (run.ports) ends too."""
        proc = self.process
        if proc is None:
            if final:
                self._release_port()
            return
        pgid = proc.pid  # start_new_session: the group id is the leader's pid
        # vLLM's EngineCore and workers: remembered now, checked after the group is killed
        descendants = engine_child_pids(proc.pid)
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0f s: SIGKILL", self.name, grace)
        # Children (e.g. vLLM's EngineCore) may outlive the leader: kill what is left.
        _signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) survived SIGKILL", self.name, proc.pid)
        for pid in _still_alive(descendants):
            log.error("%s: child process %d survived its group's SIGKILL: killing it", self.name,
                      pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process = None
        self.pid_path.unlink(missing_ok=True)
        # shared memory its killed children could not unlink (run.shm)
        sweep(shm_names() - self.shm_before, min_age=2.0)
        if final:
            self._release_port()

    def _release_port(self) -> None:
        if self.listener is not None:
            close_listener(self.listener)
            self.listener = None
        else:
            release_port(self.port)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    def restart(self, grace: float = 5.0) -> None:
        """Stop (a short grace: it is presumably hung), start again, wait for health."""
        self.stop(grace=grace, final=False)
        self.restarts += 1
        self.start()
        self.wait_ready()


def _still_alive(pids: list[int], wait: float = 5.0) -> list[int]:
    """The pids (not zombies) still running after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for pid in pids:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
            except (OSError, IndexError):
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_servers(spec: ServerSpec, root: Path, cache_dir: Path, board: ServerBoard, *,
                  wait: bool = True) -> tuple[list[ServerProcess], list[str]]:
    """Start the managed servers of ``spec`` (one per ``--tensor-parallel-size`` x
    ``--pipeline-parallel-size`` GPUs of ``--gpus``, server i on the i-th group of consecutive
    ids; one on CPU) and wait until all are healthy (``wait=False``: only spawn them;
    ``run.fleet`` then waits for each); with ``--manage-servers false`` just report the given
    URLs. Returns (servers, urls)."""
    if not spec.manage:
        _note_unmanaged(spec)
        for url in spec.urls:
            board.server_update(url, health="external")
        return [], list(spec.urls)
    backend = spec.backend
    backend.require()
    slots = spec.gpu_slots
    kill_stale_servers(layout.servers_dir(root))
    sweep()  # shared memory of servers of runs that were SIGKILLed (run.shm)
    # reserved until stop(); every server serves on a socket bound here (run.ports): the
    # embedded server with --fd, vLLM through hallulog_vllm.serve --fd
    listeners, ports = backend.ports(len(slots), spec.base_port)
    run_dir = layout.run_spool_dir(root, cache_dir).name
    servers = []
    for i, (gpus, port) in enumerate(zip(slots, ports)):
        url = f"http://127.0.0.1:{port}"
        spool = layout.spool_dir(root, i, spec.spool_root)
        clear_spool(spool)
        command = server_command(spec, host="127.0.0.1", port=port, spool_dir=spool,
                                 inherited_socket=True)
        env = backend.environment(os.environ, gpus=gpus, cache_dir=cache_dir,
                                  ranks=spec.gpus_per_server, run_dir=run_dir)
        servers.append(ServerProcess(name=f"server_{i}", command=command, url=url,
                                     log_path=layout.servers_dir(root) / f"server_{i}.log", env=env,
                                     startup_timeout=spec.startup_timeout,
                                     listener=listeners[i], health_path=backend.health_path))
        if gpus is not None and len(gpus) > 1:
            say.info("server_%d: GPUs %s (tensor parallel %d x pipeline parallel %d)", i,
                     ",".join(map(str, gpus)), spec.engine.tensor_parallel_size,
                     spec.engine.pipeline_parallel_size)
    try:
        for server in servers:
            server.start()
            board.server_update(server.url, health="starting", restarts=0, in_flight=0)
        for server in servers if wait else ():
            server.wait_ready()
            board.server_update(server.url, health="healthy")
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers, [s.url for s in servers]


def _note_unmanaged(spec: ServerSpec) -> None:
    """Engine options do nothing to servers hallulog does not start: say so (they are still
    recorded in the manifest, as the config's values)."""
    given = spec.engine.given_flags()
    if given:
        say.info("--manage-servers false: %s only recorded in the manifest, not applied (the "
                 "servers at --server-urls run as they were started)", ", ".join(given))


def clear_spool(spool: Path) -> None:
    """Empty a server's spool dir: capture files of a crashed run are never read again."""
    if spool.exists():
        for leftover in spool.iterdir():
            if leftover.is_file():
                leftover.unlink()
    spool.mkdir(parents=True, exist_ok=True)


def remove_spools(root: Path, spool_root: Path | None) -> None:
    """Empty the run's server spools once its servers are stopped; with ``--spool-root`` the
    run's own directory there is removed."""
    parent = layout.run_spool_dir(root, spool_root)
    if spool_root is not None:
        shutil.rmtree(parent, ignore_errors=True)
        return
    for spool in parent.glob("server_*"):
        clear_spool(spool)
