"""A real orchestrator run against instant backends, for benches and tests that need a run
without a model: the task file, a model directory of the right shape, the backends on free
ports, and the ``python -m orchestrator run`` command line.

    with InstantFleet(tmp, servers=2) as fleet:
        subprocess.run(fleet.command(root, prompts=500, k=3), env=fleet.env)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NUM_LAYERS, HIDDEN = 4, 64  # the light profile asks for layer ids 3, 4 of a 4-layer model
LAYER_IDS = 2

__all__ = ["InstantFleet", "write_task", "write_model", "free_port", "REPO", "NUM_LAYERS", "HIDDEN"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_task(path: Path, prompts: int) -> None:
    with open(path, "w") as f:
        for i in range(prompts):
            value = "Paris" if i % 2 else "Rome"
            f.write(
                json.dumps(
                    {
                        "QuestionId": f"bench_{i:07d}",
                        "Question": f"Which city is meant by riddle number {i}?",
                        "Answer": {
                            "Value": value,
                            "Aliases": [value],
                            "NormalizedAliases": [value.lower()],
                            "NormalizedValue": value.lower(),
                        },
                    }
                )
                + "\n"
            )


def write_model(path: Path, num_layers: int = NUM_LAYERS, hidden: int = HIDDEN) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": num_layers,
                "hidden_size": hidden,
            }
        )
    )


def wait_health(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.1)


class InstantFleet:
    """``servers`` instant backends (bench/instant_backend.py) on free ports, spooling under
    ``work/spool``; a fake model dir ``work/model``. Start with ``with`` or :meth:`start`.
    ``vary_rows``: captures of different prompts hold different rows (probes fit on them)."""

    def __init__(
        self, work: Path, servers: int = 1, answer_tokens: int = 4, vary_rows: bool = False
    ) -> None:
        self.work = Path(work)
        self.servers, self.answer_tokens, self.vary_rows = servers, answer_tokens, vary_rows
        self.model = self.work / "instant-model"
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []

    def start_one(self, i: int) -> subprocess.Popen:
        port = int(self.urls[i].rsplit(":", 1)[1]) if i < len(self.urls) else free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "bench" / "instant_backend.py"),
                "--port",
                str(port),
                "--spool-dir",
                str(self.work / "spool" / f"s{i}"),
                "--num-layer-ids",
                str(LAYER_IDS),
                "--hidden-size",
                str(HIDDEN),
                "--served-model-name",
                self.model.name,
                "--answer-tokens",
                str(self.answer_tokens),
                *(["--vary-rows"] if self.vary_rows else []),
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        if i < len(self.urls):
            self.procs[i] = proc
        else:
            self.urls.append(url)
            self.procs.append(proc)
        return proc

    def start(self) -> InstantFleet:
        write_model(self.model)
        for i in range(self.servers):
            self.start_one(i)
        for url, proc in zip(self.urls, self.procs):
            wait_health(url, proc=proc)
        return self

    def restart(self, i: int) -> None:
        """Start server ``i`` again on its port (after it was killed), wait for health."""
        for _ in range(50):
            proc = self.start_one(i)
            try:
                wait_health(self.urls[i], timeout=15, proc=proc)
                return
            except RuntimeError:  # the port not released yet
                time.sleep(0.2)
        raise RuntimeError(f"instant backend {i} did not come back")

    def command(
        self, root: Path, task: Path, *, k: int, workers: int | None = None, extra: list[str] = ()
    ) -> list[str]:
        return [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--artifact-root",
            str(root),
            "--task",
            "triviaqa",
            "--task-path",
            str(task),
            "--model",
            str(self.model),
            "--manage-servers",
            "false",
            "--server-urls",
            ",".join(self.urls),
            "--logging-profile",
            "light",
            "--k-samples",
            str(k),
            "--max-tokens",
            str(self.answer_tokens),
            "--num-workers",
            str(workers or self.servers),
            "--progress",
            "false",
            "--log-level",
            "WARNING",
            *extra,
        ]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()

    def __enter__(self) -> InstantFleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
