"""A real orchestrator run against instant backends, for benches and tests that need a run
without a model: the task file, a model directory of the right shape, the backends on free
ports, and the ``python -m orchestrator run`` command line.

    with InstantFleet(tmp, servers=2) as fleet:
        subprocess.run(fleet.command(root, prompts=500, k=3), env=fleet.env)

One backend on its own (the tests' ``instant_backend`` fixtures, tests/conftest.py):

    with running_instant_backend(spool, num_layer_ids=3, hidden_size=16) as url:
        ...
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NUM_LAYERS, HIDDEN = 4, 64  # the light profile asks for layer ids 3, 4 of a 4-layer model
LAYER_IDS = 2

__all__ = [
    "InstantFleet",
    "write_task",
    "write_model",
    "free_port",
    "wait_health",
    "instant_backend_argv",
    "running_instant_backend",
    "REPO",
    "NUM_LAYERS",
    "HIDDEN",
]


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


def instant_backend_argv(
    port: int,
    spool_dir: Path,
    *,
    num_layer_ids: int = LAYER_IDS,
    hidden_size: int = HIDDEN,
    served_model_name: str = "m",
    answer_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The command line of one bench/instant_backend.py; an option left None keeps the
    backend's default (12 answer tokens, prompts of up to 48)."""
    argv = [sys.executable, str(REPO / "bench" / "instant_backend.py"), "--port", str(port)]
    argv += ["--spool-dir", str(spool_dir), "--num-layer-ids", str(num_layer_ids)]
    argv += ["--hidden-size", str(hidden_size), "--served-model-name", served_model_name]
    if answer_tokens is not None:
        argv += ["--answer-tokens", str(answer_tokens)]
    if max_prompt_tokens is not None:
        argv += ["--max-prompt-tokens", str(max_prompt_tokens)]
    return argv + list(extra)


@contextlib.contextmanager
def running_instant_backend(
    spool_dir: Path, *, timeout: float = 60.0, quiet: bool = False, **options
) -> Iterator[str]:
    """Start one instant backend on a free port, wait for its ``/health``, yield its URL; stop
    it on exit. ``options``: those of :func:`instant_backend_argv`. ``quiet``: its output to
    /dev/null (else it goes where this process's goes)."""
    port = free_port()
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(
        instant_backend_argv(port, spool_dir, **options), stdout=out, stderr=out
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_health(url, timeout=timeout, proc=proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class InstantFleet:
    """``servers`` instant backends (bench/instant_backend.py) on free ports, spooling under
    ``work/spool``; a fake model dir ``work/model``. Start with ``with`` or :meth:`start`.
    ``vary_rows``: captures of different prompts hold different rows (probes fit on them)."""

    def __init__(
        self,
        work: Path,
        servers: int = 1,
        answer_tokens: int = 4,
        vary_rows: bool = False,
        latency_ms: float = 0.0,
    ) -> None:
        self.work = Path(work)
        self.servers, self.answer_tokens, self.vary_rows = servers, answer_tokens, vary_rows
        self.latency_ms = latency_ms
        self.model = self.work / "instant-model"
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []

    def start_one(self, i: int) -> subprocess.Popen:
        port = int(self.urls[i].rsplit(":", 1)[1]) if i < len(self.urls) else free_port()
        proc = subprocess.Popen(
            instant_backend_argv(
                port,
                self.work / "spool" / f"s{i}",
                num_layer_ids=LAYER_IDS,
                hidden_size=HIDDEN,
                served_model_name=self.model.name,
                answer_tokens=self.answer_tokens,
                extra=(
                    *(["--vary-rows"] if self.vary_rows else []),
                    *(["--latency-ms", str(self.latency_ms)] if self.latency_ms else []),
                ),
            ),
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
