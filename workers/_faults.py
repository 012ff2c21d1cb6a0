"""Test-only fault injection: make the n-th write, fsync or truncate of a process fail.

Not used in production. A worker process installs it when ``HALLULOG_FAULTS`` is set (the fault
tests set it for the orchestrator they start; workers inherit the environment)::

    HALLULOG_FAULTS="op=write,nth=7,err=EIO"          # the 7th os.write raises EIO
    HALLULOG_FAULTS="op=fsync,every=3,err=ENOSPC"     # every 3rd fsync/fdatasync raises ENOSPC
    HALLULOG_FAULTS="op=any,nth=12,err=crash"         # the 12th call SIGKILLs the process
    HALLULOG_FAULTS="op=write,nth=2,err=EIO,path=worker_0/"  # count only files under a path

``op`` is ``write`` (os.write), ``fsync`` (os.fsync and os.fdatasync), ``truncate``
(os.ftruncate and os.truncate) or ``any``. Every write path of the worker's persist goes through
these ``os`` functions (storage's ``write_all``, ``hallulog.contracts.jsonl.JsonlAppender``), so wrapping
them reaches every call site without LD_PRELOAD. Unit tests use :func:`inject` in-process, where
``err=crash`` raises :class:`SimulatedCrash` (a BaseException, so no rollback handler runs) and
every later call raises it too, as if the process were gone.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["FaultPlan", "SimulatedCrash", "inject", "install_from_env", "ENV"]

ENV = "HALLULOG_FAULTS"
_OPS = {
    "write": ("write",),
    "fsync": ("fsync", "fdatasync"),
    "truncate": ("ftruncate", "truncate"),
    "any": ("write", "fsync", "fdatasync", "ftruncate", "truncate"),
}


class SimulatedCrash(BaseException):
    """The in-process stand-in for SIGKILL: nothing after it may touch the disk."""


@dataclass
class FaultPlan:
    """Which calls fail and how."""

    op: str = "write"
    nth: int | None = None
    """Fail exactly the nth matching call (1-based)."""
    every: int | None = None
    """Fail every ``every``-th matching call."""
    err: str = "EIO"
    """An errno name (EIO, ENOSPC, EDQUOT, ...) or ``crash``."""
    path: str | None = None
    """Count only calls on files whose path contains this."""
    calls: int = 0
    fired: int = 0
    crashed: bool = False
    hard_kill: bool = False
    """Crash by SIGKILL (a real process) instead of raising SimulatedCrash."""
    _real: dict[str, Callable] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        kv = dict(part.split("=", 1) for part in text.split(",") if part.strip())
        plan = cls(
            op=kv.get("op", "write"),
            err=kv.get("err", "EIO"),
            path=kv.get("path"),
            nth=int(kv["nth"]) if "nth" in kv else None,
            every=int(kv["every"]) if "every" in kv else None,
        )
        if plan.op not in _OPS:
            raise ValueError(f"{ENV}: unknown op {plan.op!r}")
        if plan.err != "crash" and not hasattr(errno_mod, plan.err):
            raise ValueError(f"{ENV}: unknown errno {plan.err!r}")
        return plan

    def _matches(self, target) -> bool:
        if self.path is None:
            return True
        try:
            name = (
                os.readlink(f"/proc/self/fd/{target}")
                if isinstance(target, int)
                else os.fspath(target)
            )
        except OSError:
            return False
        return self.path in name

    def _wrap(self, name: str) -> Callable:
        real = self._real[name]

        def faulty(target, *args, **kwargs):
            if self.crashed:
                raise SimulatedCrash(f"os.{name} after the simulated crash")
            if self._matches(target):
                self.calls += 1
                if (self.nth is not None and self.calls == self.nth) or (
                    self.every is not None and self.calls % self.every == 0
                ):
                    self.fired += 1
                    self._fail(name)
            return real(target, *args, **kwargs)

        return faulty

    def _fail(self, name: str) -> None:
        if self.err == "crash":
            if self.hard_kill:
                os.kill(os.getpid(), signal.SIGKILL)
            self.crashed = True
            raise SimulatedCrash(f"simulated crash at os.{name} call {self.calls}")
        code = getattr(errno_mod, self.err)
        raise OSError(code, f"{os.strerror(code)} (injected at os.{name} call {self.calls})")

    def install(self) -> None:
        for name in _OPS[self.op]:
            self._real[name] = getattr(os, name)
            setattr(os, name, self._wrap(name))

    def uninstall(self) -> None:
        for name, real in self._real.items():
            setattr(os, name, real)
        self._real.clear()


@contextlib.contextmanager
def inject(
    op: str = "write",
    *,
    nth: int | None = None,
    every: int | None = None,
    err: str = "EIO",
    path: str | None = None,
) -> Iterator[FaultPlan]:
    """Install a fault plan in this process for the duration of the block."""
    plan = FaultPlan(op=op, nth=nth, every=every, err=err, path=path)
    plan.install()
    try:
        yield plan
    finally:
        plan.uninstall()


def install_from_env() -> FaultPlan | None:
    """Install the plan ``HALLULOG_FAULTS`` describes (a worker process calls this)."""
    text = os.environ.get(ENV)
    if not text:
        return None
    plan = FaultPlan.parse(text)
    plan.hard_kill = True
    plan.install()
    return plan
