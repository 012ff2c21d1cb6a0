"""The worker side of ``--executor ray``: one actor per GPU (or per CPU slot) that owns its
inference server process and runs the ordinary worker (``hallulog.workers.worker.GroupWorker``) with a
channel over actor method calls instead of a pipe.

The class is plain Python; ``hallulog.orchestrator.run.ray_executor`` wraps it with ``ray.remote`` (so this
module imports nothing from Ray). The driver calls:

- ``start()``: check that the artifact root is shared (the probe file the driver wrote must be
  visible here with the same text; on an ``s3://`` root: the driver's session object in the
  bucket, and the worker directory is staged on this node and shipped by the actor,
  ``remote/actor_shipping.py``), roll the slot's worker directory back to its last commit
  (``recover_worker_dir``: the committed rows win over anything Ray remembers), spawn the server
  on a free port of this node, wait for its health, start the worker thread; returns the node,
  the server's URL and the committed prompt ids.
- ``submit(groups)``: hand prompt groups to the worker (the driver never exceeds its capacity).
- ``poll(wait)``: the worker's events since the last poll (``ready``, ``done``, ``failed``,
  ``requeue``, ``fatal``: the pipe's events), waiting up to ``wait`` s for the first.
- ``stop()``: let the worker finish its groups, stop the server.

``launch`` says how to start the server: ``command`` (a list in which ``{python}``, ``{port}``
and ``{spool_dir}`` are filled in on the node, also inside an argument such as vLLM's
``--kv-transfer-config`` JSON), ``env`` (added to the actor's environment), ``startup_timeout``
(seconds) and ``gpus``: how many GPUs the server spans (tensor x pipeline parallel size; 0 on
CPU). Ray gives the actor that many GPUs on one node and sets its ``CUDA_VISIBLE_DEVICES``; the
server inherits it, and an actor that sees fewer refuses to start. The worker directory is
``worker_{slot}`` (a stable name, not the Ray actor id), so the actor that replaces a lost one,
on any node, continues the same directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.process import die_with_parent
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.remote.actor_shipping import ActorShipping
from hallulog.workers.persist import recover_worker_dir
from hallulog.workers.runtime import run_event_loop, tune_gc
from hallulog.workers.worker import GroupWorker, WorkerSpec

__all__ = ["SlotActor", "SharedFsError", "PROBE_NAME"]

log = logging.getLogger(__name__)

PROBE_NAME = ".hallulog-shared-fs-probe"
"""File the driver writes into the artifact root; every actor must read back the same text."""


class SharedFsError(HallulogError, RuntimeError):
    """The artifact root is not the driver's: it is not on a filesystem shared by the nodes."""


class _CallChannel:
    """The worker's channel over method calls: ``submit`` fills the inbox, ``poll`` drains the
    outbox (the pipe's ``send``/``recv`` in ``hallulog.workers.worker``)."""

    def __init__(self) -> None:
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.shipping: ActorShipping | None = None
        """On a bucket root: holds ``done`` events until their segment is shipped."""

    def send(self, event: dict[str, Any]) -> None:
        if self.shipping is not None:
            self.shipping.event(event)
        else:
            self.outbox.put(event)

    def reader(self, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue) -> None:
        """Thread body: move submitted groups into the worker's event loop; None stops it."""
        while True:
            item = self.inbox.get()
            loop.call_soon_threadsafe(inbox.put_nowait, item)
            if item is None:
                return


class SlotActor:
    """One executor slot: a server process and a worker, on whichever node Ray placed it."""

    def __init__(
        self,
        slot: int,
        spec: WorkerSpec,
        launch: dict[str, Any],
        artifact_root: str,
        probe_text: str,
        recover: dict[str, Any],
        remote: dict[str, Any] | None = None,
    ) -> None:
        self.slot = slot
        self.remote = remote
        """On an ``s3://`` root: ``url``, ``ship_gap`` and the driver's ``session``."""
        self.spec = spec
        self.launch = launch
        self.root = Path(artifact_root)
        self.probe_text = probe_text
        self.recover = recover
        self.server: subprocess.Popen | None = None
        self.channel = _CallChannel()
        self.thread: threading.Thread | None = None
        self.url = ""

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        node = socket.gethostname()
        try:  # the Ray node, when running as an actor (hosts can hold several nodes)
            import ray

            if ray.is_initialized():  # never connect from here: only report where we run
                node = f"{node}/{ray.get_runtime_context().get_node_id()[:8]}"
        except Exception:  # plain object (tests) or no Ray: the host name is all there is
            pass
        if self.remote is not None:  # nothing shared but the bucket: stage on this node
            shipping = ActorShipping(self.remote, self.slot, node, self.channel.outbox.put)
            self.root = shipping.root
            self.spec = replace(self.spec, worker_dir=str(shipping.worker_dir))
            self.channel.shipping = shipping
        else:
            self._check_shared(node)
        devices = self._devices()
        committed = recover_worker_dir(Path(self.spec.worker_dir), **self.recover)
        self._start_server()
        self.spec = replace(self.spec, server_url=self.url)
        self.thread = threading.Thread(
            target=self._run_worker, name=f"worker_{self.slot}", daemon=True
        )
        self.thread.start()
        return {
            "slot": self.slot,
            "node": node,
            "pid": os.getpid(),
            "url": self.url,
            "devices": devices,
            "committed": sorted(committed),
        }

    def _check_shared(self, node: str) -> None:
        probe = self.root / PROBE_NAME
        try:
            seen = probe.read_text(encoding="utf-8")
        except OSError:
            seen = None
        if seen != self.probe_text:
            raise SharedFsError(
                f"artifact root {self.root} is not shared with node {node}: the driver's "
                f"{PROBE_NAME} is {'missing' if seen is None else 'different'} there (put the "
                "root on NFS/Lustre/a mounted bucket that every node mounts at the same path, "
                "or the run in a bucket: --artifact-root s3://BUCKET/PREFIX)"
            )

    def _devices(self) -> str:
        """The GPUs this actor's server runs on (``CUDA_VISIBLE_DEVICES`` as Ray set it; "" on
        CPU or when unset); fewer than the launch's ``gpus`` is an error naming both."""
        want = int(self.launch.get("gpus", 0))
        devices = os.environ.get("CUDA_VISIBLE_DEVICES") if want else None
        if devices is None:
            return ""
        seen = [d for d in devices.split(",") if d.strip()]
        if len(seen) < want:
            raise RuntimeError(
                f"slot {self.slot}: the server spans {want} GPUs (tensor x "
                f"pipeline parallel size) but the actor sees "
                f"CUDA_VISIBLE_DEVICES={devices!r}"
            )
        return devices

    def _start_server(self) -> None:
        port = _free_port()
        spool = Path(tempfile.mkdtemp(prefix=f"hallulog-spool-{self.slot}-"))
        fill = {"{python}": sys.executable, "{port}": str(port), "{spool_dir}": str(spool)}
        command = [_fill(part, fill) for part in self.launch["command"]]
        env = {**os.environ, **self.launch.get("env", {})}
        log_path = self.root / "servers" / f"ray_slot_{self.slot}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            out.write(
                f"\n=== start {time.strftime('%Y-%m-%dT%H:%M:%S')} on "
                f"{socket.gethostname()}: {' '.join(command)}\n".encode()
            )
            out.flush()
            self.server = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGKILL),
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + float(self.launch.get("startup_timeout", 600))
        while True:
            if self.server.poll() is not None:
                tail = log_path.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError(
                    f"slot {self.slot}: server exited with code "
                    f"{self.server.returncode}; {log_path}:\n" + "\n".join(tail)
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"slot {self.slot}: server not healthy in time ({log_path})")
            time.sleep(0.5)

    def _run_worker(self) -> None:
        try:
            tune_gc()
            run_event_loop(GroupWorker(self.spec, self.channel).run())
        except BaseException as exc:  # the driver stops the run on it, as on one node
            self.channel.send(
                {
                    "event": "fatal",
                    "worker_id": self.slot,
                    "error": {"error_message": f"{type(exc).__name__}: {exc}"},
                }
            )

    # -- the driver's calls ------------------------------------------------------------------
    def submit(self, groups: list[PromptGroup]) -> int:
        if self.channel.shipping is not None:
            self.channel.shipping.given(len(groups))
        for group in groups:
            self.channel.inbox.put(group)
        return len(groups)

    def poll(self, wait: float = 1.0) -> list[dict[str, Any]]:
        out = []
        try:
            out.append(self.channel.outbox.get(timeout=wait))
            while True:
                out.append(self.channel.outbox.get_nowait())
        except queue.Empty:
            pass
        return out

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the groups given, stop the worker and the server."""
        if self.thread is not None:
            self.channel.inbox.put(None)
            self.thread.join(timeout=timeout)
        if self.channel.shipping is not None:  # what the worker committed last
            self.channel.shipping.stop()
        if self.server is not None and self.server.poll() is None:
            try:
                os.killpg(self.server.pid, signal.SIGTERM)
                self.server.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.server.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __del__(self) -> None:  # the actor's process going away takes its server with it
        server = getattr(self, "server", None)
        if server is not None and server.poll() is None:
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _fill(part: str, fill: dict[str, str]) -> str:
    """``part`` with every placeholder of ``fill`` replaced (whole or inside, e.g. in JSON)."""
    for key, value in fill.items():
        part = part.replace(key, value)
    return part


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
