"""A tiny worker target for pool tests: speaks the real channel protocol, no model, no server.

Behaviour is chosen by the spec's ``server_url`` (``fake://fast``, ``fake://slow``,
``fake://doomed`` dies on every group) and by the group's ``meta`` (``sleep``, ``fail``,
``die_once``/``hang_once``: a marker path; ``commit_then_die``). A group is committed by
appending its id to ``{worker_dir}/committed.txt`` before ``done`` is sent.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FakeSpec:
    worker_id: int
    server_url: str
    worker_dir: str
    groups_in_flight: int = 2


def committed(worker_dir: str | Path) -> list[str]:
    path = Path(worker_dir) / "committed.txt"
    return path.read_text().split() if path.exists() else []


def _once(marker: str) -> bool:
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def fake_worker(spec: FakeSpec, conn) -> None:
    lock = threading.Lock()
    Path(spec.worker_dir).mkdir(parents=True, exist_ok=True)
    out = Path(spec.worker_dir) / "committed.txt"

    def send(event):
        with lock:
            conn.send({**event, "worker_id": spec.worker_id})

    def process(group):
        meta = group.meta
        if spec.server_url == "fake://doomed":
            os.kill(os.getpid(), signal.SIGKILL)
        if meta.get("die_once") and _once(meta["die_once"]):
            os.kill(os.getpid(), signal.SIGKILL)
        if meta.get("hang_once") and _once(meta["hang_once"]):
            time.sleep(3600)
        time.sleep(meta.get("sleep", 0.3 if spec.server_url == "fake://slow" else 0.01))
        if meta.get("fail"):
            send(
                {
                    "event": "failed",
                    "prompt_id": group.prompt_id,
                    "error": {"error_message": "asked to fail"},
                }
            )
            return
        with lock:
            with open(out, "a") as f:
                f.write(group.prompt_id + "\n")
        if meta.get("commit_then_die"):
            os.kill(os.getpid(), signal.SIGKILL)
        send({"event": "done", "prompt_id": group.prompt_id, "generations": 3, "tokens": 7})

    threads = []
    send({"event": "ready"})
    while True:
        try:
            group = conn.recv()
        except EOFError:
            break
        if group is None:
            break
        t = threading.Thread(target=process, args=(group,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
