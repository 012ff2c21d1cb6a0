"""A throwaway one-node Slurm cluster on this machine, for tests: munged + slurmctld + slurmd
started from a temp dir with their own key, socket, slurm.conf and ports; stopped by pid.

Needs Debian's ``slurm-wlm`` and ``munge`` and root (slurmd launches jobs as their user).
:func:`unavailable` says exactly why a cluster cannot be started here, or None.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["SlurmCluster", "unavailable"]

_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")


def unavailable() -> str | None:
    """Why no Slurm cluster can be started here (None: it can)."""
    missing = [
        b for b in _BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()
    ]
    if missing:
        return (
            f"Slurm/munge binaries not found ({', '.join(missing)}): install Debian's "
            "packages with `apt-get install -y slurm-wlm munge` (.ci/run does)"
        )
    if os.geteuid() != 0:
        return f"slurmd must run as root to start jobs (this test runs as uid {os.geteuid()})"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user: the munge package did not install cleanly"
    return None


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """``with SlurmCluster(ctld_port) as c: c.env`` — the environment for sbatch & co."""

    def __init__(self, ctld_port: int = 9460, cpus: int | None = None) -> None:
        self.ctld_port = ctld_port
        self.cpus = cpus or os.cpu_count() or 1
        self.dir = Path(tempfile.mkdtemp(prefix="hallulog-slurm-"))
        self.procs: list[subprocess.Popen] = []
        self.host = socket.gethostname().split(".")[0]

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmCluster:
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", [_bin("slurmctld"), "-D", "-c", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [_bin("slurmd"), "-D", "-f", str(self.conf)])
            self._wait_idle(timeout=90)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self, name: str, lines: int = 30) -> str:
        path = self.dir / f"{name}.log"
        if not path.exists():
            return f"({path} missing)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _start_munge(self) -> None:
        m = self.dir / "munge"
        m.mkdir(mode=0o700)
        key = m / "munge.key"
        subprocess.run(
            [_bin("mungekey"), "--create", f"--keyfile={key}"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        munge = pwd.getpwnam("munge")
        run_dir = self.dir / "munge-run"  # the socket's dir must be searchable by every user
        run_dir.mkdir(mode=0o755)
        os.chmod(self.dir, 0o755)
        for path in (m, key, run_dir):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        os.chmod(key, 0o400)
        self.socket = run_dir / "munge.socket"
        self._spawn(
            "munged",
            [
                "runuser",
                "-u",
                "munge",
                "--",
                _bin("munged"),
                "-F",
                f"--key-file={key}",
                f"--socket={self.socket}",
                f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'seed'}",
                f"--log-file={m / 'munged.log'}",
            ],
            log=False,
        )
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                out = (self.dir / "munged.out").read_text(errors="replace")
                raise RuntimeError(f"munged did not start: {out}{self.log('munge/munged')}")
            time.sleep(0.2)

    def _write_conf(self) -> None:
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=hallulogtest",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={self.ctld_port}",
                    f"SlurmdPort={self.ctld_port + 1}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.socket}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={d / 'state'}",
                    f"SlurmdSpoolDir={d / 'spool'}",
                    f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                    f"SlurmdPidFile={d / 'slurmd.pid'}",
                    f"SlurmctldLogFile={d / 'slurmctld.log'}",
                    f"SlurmdLogFile={d / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "SchedulerType=sched/builtin",
                    "JobCompType=jobcomp/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SlurmdTimeout=60",
                    "InactiveLimit=0",
                    "KillWait=5",
                    "MinJobAge=600",
                    f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
                    f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
                ]
            )
            + "\n"
        )

    def _spawn(self, name: str, cmd: list[str], log: bool = True) -> None:
        out = open(self.dir / f"{name}.out", "wb")
        self.procs.append(
            subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env
            )
        )
        out.close()

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{proc.args[0]} exited with {proc.returncode}:\n"
                        f"{self.log('slurmctld')}\n{self.log('slurmd')}"
                    )
            run = subprocess.run(
                [_bin("sinfo"), "-h", "-o", "%T"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            state = run.stdout.strip()
            if state.startswith("idle"):
                return
            time.sleep(1.0)
        raise RuntimeError(
            f"slurm node not idle after {timeout:.0f} s (state {state!r}):\n"
            f"{self.log('slurmctld')}\n{self.log('slurmd')}"
        )

    def job_state(self, job_id: str) -> str:
        """JobState of a job (of the first task that is not COMPLETED, for an array)."""
        run = subprocess.run(
            [_bin("scontrol"), "show", "job", "-o", job_id],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        states = [
            tok.split("=", 1)[1]
            for line in run.stdout.splitlines()
            for tok in line.split()
            if tok.startswith("JobState=")
        ]
        pending = [s for s in states if s != "COMPLETED"]
        return (pending or states or ["UNKNOWN"])[0]

    def cancel(self, *job_ids: str) -> None:
        subprocess.run([_bin("scancel"), *job_ids], env=self.env, capture_output=True, timeout=30)
