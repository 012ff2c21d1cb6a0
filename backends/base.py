"""The backend type: what a kind of inference server (embedded, vLLM) needs to be started as
hallulog's server, and the typed input it is started from.

A :class:`Backend` owns its start (command line, environment, how its port is held), its health
probe, the engine options it takes and the flags its ``--engine-args`` may not give, and its
capture configuration (what the server is told to capture). One instance per kind lives in
``backends/registry.py``; the run plan resolves the config's ``--backend`` there once and hands
the rest of the run a :class:`ServerSpec` holding the backend itself, so no caller compares
backend names. Backends import nothing of the config: a :class:`ServerSpec` is all they read.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hallulog.backends.engine import (
    EngineOptions,
    engine_args_problem,
    gpu_groups,
    gpus_problem,
    options_problem,
)
from hallulog.backends.ports import listen_on_ports

__all__ = ["Backend", "ServerSpec", "servers_problem"]


class Backend:
    """One kind of inference server (subclassed once per kind: ``backends/embedded.py``,
    ``backends/vllm.py``). Instances are stateless; the registry holds one of each."""

    name: ClassVar[str]
    """The ``--backend`` value."""
    default_groups_in_flight: ClassVar[int]
    """Prompt groups each worker keeps in flight when ``--groups-in-flight`` is not given."""
    takes: ClassVar[frozenset[str]]
    """The :class:`EngineOptions` it applies (the others must stay at their defaults)."""
    reserved: ClassVar[Mapping[str, str]]
    """Flags of its command line hallulog sets itself, which ``--engine-args`` may not give
    (flag → what to use instead)."""
    process_markers: ClassVar[tuple[bytes, ...]]
    """Module arguments (``-m NAME ``) that mark a server process of this kind in its command
    line (NULs read as spaces): a crashed run's leftover servers are killed only when their
    command line holds one. A module argument, not a bare word, so that a checkout or venv path
    holding the word never matches."""
    attention_in_pass: ClassVar[bool] = False
    """Its server captures ``--attention-features``' summaries during generation
    (``contracts/attention_wire.py``); False: the run computes them after generation in a
    transformers pass (``postrun/attention.py``)."""
    health_path: ClassVar[str] = "/health"
    """Answers 200 once the server serves."""

    def reasoning_parser_for(
        self, choice: str, *, model_type: str, has_think_tokens: bool
    ) -> str | None:
        """The reasoning parser the server is started with for ``--reasoning-parser``
        ``choice`` (``auto``, ``none`` or a name) on a model of ``model_type``; None: no
        parser. A backend without parsers (the embedded server splits by the tokenizer's think
        tokens itself) never takes one."""
        return None

    def require(self) -> None:
        """Raise a one-line error naming the install command when the server cannot start
        here (a package missing); nothing to check by default."""

    def engine_problem(self, options: EngineOptions) -> str | None:
        """What is wrong with ``options`` for this backend (one line naming the flag), or
        None."""
        problem = options_problem(options)
        if problem is not None:
            return problem
        for name, value in options.set_off_default().items():
            if name not in self.takes:
                return self.refuse_option(name, value)
        return engine_args_problem(options.engine_args, self.reserved)

    def refuse_option(self, name: str, value: Any) -> str:
        """The one line refusing an engine option this backend does not take."""
        return f"--{name.replace('_', '-')} is not an option of --backend {self.name}"

    def ports(self, count: int, base: int | None) -> tuple[list[socket.socket | None], list[int]]:
        """The ports of ``count`` servers, and the listening socket the run bound on each,
        held by the run until the server stops (run.ports: no other program can take it, also
        while the server restarts); the server serves on it (``--fd``)."""
        listeners = list(listen_on_ports(count, base))
        return list(listeners), [sock.getsockname()[1] for sock in listeners]

    def command(
        self,
        spec: ServerSpec,
        *,
        host: str,
        port: int,
        spool_dir: str | os.PathLike[str],
        python: str = sys.executable,
        inherited_socket: bool = False,
    ) -> list[str]:
        """The command line of one server of ``spec``: capture flags, engine options, then
        ``--engine-args`` split as a shell would, last. ``inherited_socket``: the caller
        appends ``--fd N`` of a listening socket it bound (a server that takes ``--fd`` anyway
        ignores it)."""
        raise NotImplementedError

    def capture_args(
        self, layer_ids: Sequence[int], spool_dir: str | os.PathLike[str]
    ) -> list[str]:
        """The flags that make the server capture ``layer_ids`` into ``spool_dir`` (one capture
        file per request, docs/contracts.md)."""
        raise NotImplementedError

    def environment(
        self,
        base: Mapping[str, str],
        *,
        gpus: tuple[int, ...] | None,
        cache_dir: Path,
        ranks: int,
        run_dir: str,
    ) -> dict[str, str]:
        """The environment of one local server on ``gpus`` (None: on CPU); ``run_dir`` names
        the run's own directory for temporary files (apart from any other run's)."""
        raise NotImplementedError

    def actor_environment(self, cache_dir: Path, *, gpu: bool, ranks: int) -> dict[str, str]:
        """What a Ray actor's server adds to its environment (its node and devices are the
        actor's, unknown here); nothing by default."""
        return {}


@dataclass(frozen=True)
class ServerSpec:
    """What the run's servers are: built once by the run plan (``config/plan.py``) from the
    config and the model, read by ``backends/servers.py`` and the Ray executor."""

    backend: Backend
    model_path: Path
    model_name: str
    model_dtype: str
    layer_ids: tuple[int, ...]
    """The layer ids every server captures (the run stores exactly these)."""
    engine: EngineOptions = field(default_factory=EngineOptions)
    gpus: tuple[int, ...] = ()
    base_port: int | None = None
    startup_timeout: float = 600.0
    spool_root: Path | None = None
    manage: bool = True
    """Start the servers; False: use ``urls``."""
    urls: tuple[str, ...] = ()
    reasoning_parser: str | None = None
    """The reasoning parser the servers start with (``Backend.reasoning_parser_for``)."""

    @property
    def gpus_per_server(self) -> int:
        return self.engine.ranks

    @property
    def gpu_slots(self) -> list[tuple[int, ...] | None]:
        """Each managed server's GPUs (server i on the i-th group of consecutive ids of
        ``gpus``), or one server on CPU (None)."""
        return [*gpu_groups(self.gpus, self.gpus_per_server)] or [None]

    @property
    def count(self) -> int:
        """Servers of the run: one per :attr:`gpus_per_server` GPUs (one on CPU), or the
        given URLs."""
        if not self.manage:
            return max(1, len(self.urls))
        return max(1, len(self.gpus) // self.gpus_per_server)


def servers_problem(
    backend: Backend, options: EngineOptions, gpus: tuple[int, ...], *, manage: bool
) -> str | None:
    """What is wrong with the servers asked for (one line naming the flags), or None: the
    engine options for ``backend``, then ``--gpus`` cut into servers (managed ones only)."""
    problem = backend.engine_problem(options)
    if problem is None and manage and gpus:
        problem = gpus_problem(tuple(gpus), options)
    return problem
