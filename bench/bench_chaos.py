"""Chaos soak: one run SIGKILLed at random moments — orchestrator, workers, servers — resumed
until done, then checked for exactly-once results and nothing left behind.

The real orchestrator (``python -m orchestrator run``) runs a synthetic TriviaQA file against
``--servers`` instances of ``bench/instant_backend.py`` (bench/instant_run.py). While it runs, a
killer SIGKILLs at random intervals:

* ``orchestrator``: the driver (its workers die with it, PR_SET_PDEATHSIG); the soak starts it
  again with the same command (a resume). Some of these kills land while it consolidates and
  while it writes the exports (``consolidate`` / ``exports`` in the counts);
* ``worker``: one of the driver's worker processes (the pool re-queues its groups, restarts it);
* ``server``: one backend; it is started again on its port after 0.2-1 s (a supervisor's
  restart), meanwhile its workers' requests fail and their groups are queued again after the
  run's backoff (orchestrator/run/dispatch.py).

Then it checks: every (prompt, sample) has exactly one generation and one activation in
``consolidated/`` (no duplicate, none missing), validation is clean, and no process of the run,
no file in the run's spool and no new shared-memory file (``/dev/shm``) is left. Printed: kills
per kind, work redone (generation requests served beyond K+1 per prompt, from the backends'
request counters), and the wall time against an unkilled run of the same size measured first in
the same invocation.

    python bench/bench_chaos.py                      # 10^5 generations, >= 100 kills
    python bench/bench_chaos.py --generations 2000 --kills 15   # a quick one
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from hallulog.backends.shm import orphaned, shm_names

if __package__:  # imported by the tests as bench.bench_chaos
    from .instant_run import REPO, InstantFleet, free_port, write_task
else:  # python bench/bench_chaos.py
    from instant_run import REPO, InstantFleet, free_port, write_task

KINDS = ("orchestrator", "worker", "server")
TAG_VAR = "HALLULOG_CHAOS_TAG"


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def worker_pids(driver: int) -> list[int]:
    return [p for p in _children(driver) if "spawn_main" in _cmdline(p)]


def tagged_processes(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries the soak's tag."""
    found = []
    needle = f"{TAG_VAR}={tag}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{entry.name}/environ").read_bytes():
                continue
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def requests_served(url: str) -> float:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    m = re.search(r"^hallulog_instant_requests_total\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


class Soak:
    def __init__(
        self,
        work: Path,
        *,
        generations: int,
        k: int,
        servers: int,
        workers: int,
        kills: int,
        seed: int,
        interval: tuple[float, float],
    ) -> None:
        self.work, self.k = work, k
        self.prompts = -(-generations // (k + 1))
        self.servers, self.workers = servers, workers
        self.per_kind = max(1, -(-kills // 3))
        self.rng = random.Random(seed)
        # the order of the kills during the drain: per_kind rounds, each round every kind once in
        # a random order, so however many kills a run lasts for, the kinds stay balanced
        self.schedule = []
        for _ in range(self.per_kind):
            round_ = list(KINDS)
            self.rng.shuffle(round_)
            self.schedule.extend(round_)
        self.schedule.reverse()  # popped from the end
        self.interval = interval
        self.task = work / "questions.jsonl"
        write_task(self.task, self.prompts)
        self.kills = {kind: 0 for kind in KINDS} | {"consolidate": 0, "exports": 0}
        self.sessions = 0
        self.served_before_kill = 0.0
        self.restarts: dict[int, threading.Thread] = {}
        self.progress = self.progress_at_kill = 0
        # committed groups between two kills: the kills spread over about half of the run
        self.gap = max(1, self.prompts // (2 * (3 * self.per_kind + 2)))

    groups_in_flight = 4

    def command(self, fleet: InstantFleet, root: Path, status_port: int | None = None) -> list[str]:
        extra = ["--groups-in-flight", str(self.groups_in_flight), "--checkpoint-interval", "2"]
        if status_port is not None:  # the soak reads the phase to kill during the post-run
            extra += ["--status-port", str(status_port)]
        return fleet.command(root, self.task, k=self.k, workers=self.workers, extra=extra)

    # ---- the unkilled run --------------------------------------------------------------------

    def baseline(self) -> float:
        with InstantFleet(self.work / "fleet_base", servers=self.servers) as fleet:
            root = self.work / "base"
            t0 = time.monotonic()
            proc = subprocess.run(
                self.command(fleet, root), cwd=REPO, env=fleet.env, capture_output=True, text=True
            )
            wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"baseline run failed: {proc.stderr[-2000:]}")
        shutil.rmtree(root, ignore_errors=True)
        return wall

    # ---- the killed run ----------------------------------------------------------------------

    def _kill_server(self, fleet: InstantFleet) -> None:
        up = [
            i
            for i, p in enumerate(fleet.procs)
            if p.poll() is None and not (i in self.restarts and self.restarts[i].is_alive())
        ]
        if not up:
            return
        i = self.rng.choice(up)
        self.served_before_kill += requests_served(fleet.urls[i])
        os.killpg(fleet.procs[i].pid, signal.SIGKILL)
        fleet.procs[i].wait()
        self.kills["server"] += 1
        delay = self.rng.uniform(0.2, 1.0)
        self.restarts[i] = threading.Thread(target=self._restart, args=(fleet, i, delay))
        self.restarts[i].start()

    @staticmethod
    def _restart(fleet: InstantFleet, i: int, delay: float) -> None:
        time.sleep(delay)
        fleet.restart(i)

    def chaos(self, tag: str) -> tuple[float, Path]:
        root = self.work / "run"
        with InstantFleet(self.work / "fleet", servers=self.servers) as fleet:
            fleet.env[TAG_VAR] = tag
            t0 = time.monotonic()
            while True:
                self.sessions += 1
                log = open(self.work / f"session_{self.sessions}.log", "w")
                port = free_port()
                proc = subprocess.Popen(
                    self.command(fleet, root, port),
                    cwd=REPO,
                    env=fleet.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                rc = self._haunt(proc, fleet, f"http://127.0.0.1:{port}/status")
                log.close()
                if rc == 0:
                    break
                if rc != -signal.SIGKILL:
                    raise RuntimeError(
                        f"session {self.sessions} ended with {rc}: "
                        f"{(self.work / f'session_{self.sessions}.log').read_text()[-3000:]}"
                    )
            wall = time.monotonic() - t0
            for thread in self.restarts.values():
                thread.join()
            self.served = self.served_before_kill + sum(requests_served(u) for u in fleet.urls)
        return wall, root

    def _status(self, status_url: str) -> dict:
        try:
            with urllib.request.urlopen(status_url, timeout=0.5) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return {}

    def _haunt(self, proc: subprocess.Popen, fleet: InstantFleet, status_url: str) -> int:
        """Kill things around ``proc`` until it ends; returns its exit code.

        A kill during the queue's drain waits for progress since the previous kill (``gap``
        groups committed), so the kills spread over the run and every one is followed by work
        (the run always ends)."""
        post_quota = max(2, self.per_kind // 4)
        while proc.poll() is None:
            next_kill = time.monotonic() + self.rng.uniform(*self.interval)
            phase = None
            while proc.poll() is None:
                snap = self._status(status_url)
                phase = snap.get("phase")
                prompts = snap.get("prompts") or {}
                if prompts:
                    self.progress = prompts.get("done", 0) + prompts.get("skipped", 0)
                step = {"consolidating": "consolidate", "exporting": "exports"}.get(phase or "")
                if step and self.kills[step] < post_quota:
                    # a random moment within the step (they last a fraction of a second here)
                    time.sleep(self.rng.uniform(0.0, 0.15))
                    if proc.poll() is None:
                        proc.kill()
                        self.kills["orchestrator"] += 1
                        self.kills[step] += 1
                    return proc.wait()
                # behind schedule (a fast run): kill on progress alone, so every planned kill
                # lands before the queue drains
                behind = self.prompts - self.progress <= self.gap * (len(self.schedule) + 1)
                if (
                    (time.monotonic() >= next_kill or behind)
                    and phase == "running"
                    and self.progress - self.progress_at_kill >= self.gap
                ):
                    break
                time.sleep(0.05)
            if proc.poll() is not None:
                continue
            if not self.schedule:
                continue
            kind = self.schedule.pop()
            self.progress_at_kill = self.progress
            if kind == "orchestrator":
                proc.kill()
                self.kills["orchestrator"] += 1
                break
            if kind == "worker":
                pids = worker_pids(proc.pid)
                try:
                    os.kill(self.rng.choice(pids), signal.SIGKILL)
                    self.kills["worker"] += 1
                except (IndexError, ProcessLookupError):  # none up right now: later
                    self.schedule.insert(0, kind)
            else:
                self._kill_server(fleet)
        return proc.wait()


def check(root: Path, prompts: int, k: int) -> list[str]:
    """Exactly-once and clean: the problems found (empty: none)."""
    problems = []
    cons = root / "consolidated"
    for name in ("generations.jsonl", "activation_index.jsonl"):
        keys = [
            (row["prompt_id"], row["sample_id"])
            for row in map(json.loads, (cons / name).read_text().splitlines())
        ]
        dup = len(keys) - len(set(keys))
        per_prompt: dict[str, int] = {}
        for pid, _ in set(keys):
            per_prompt[pid] = per_prompt.get(pid, 0) + 1
        wrong = [p for p, n in per_prompt.items() if n != k + 1]
        if dup:
            problems.append(f"{name}: {dup} duplicated (prompt, sample) rows")
        if len(per_prompt) != prompts or wrong:
            problems.append(
                f"{name}: {len(per_prompt)} prompts of {prompts}, {len(wrong)} "
                f"without exactly {k + 1} samples"
            )
    report = json.loads((cons / "validation_report.json").read_text())
    if not report.get("ok"):
        problems.append(f"validation: {report.get('problem_counts')}")
    spool = root / "spool"
    left = [p for p in spool.rglob("*") if p.is_file()] if spool.exists() else []
    if left:
        problems.append(f"{len(left)} file(s) left in {spool}")
    if list((root / "servers").glob("*.pid")) if (root / "servers").exists() else []:
        problems.append("server pid files left")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", type=int, default=100_000)
    ap.add_argument("--k", type=int, default=3, help="samples per prompt (K)")
    ap.add_argument(
        "--kills",
        type=int,
        default=100,
        help="at least this many kills in all (each of the three kinds gets a third)",
    )
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--interval",
        type=float,
        nargs=2,
        default=(0.2, 1.5),
        metavar=("MIN", "MAX"),
        help="seconds between kills (uniform)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_chaos_"))
    shm_before = shm_names()
    soak = Soak(
        work,
        generations=args.generations,
        k=args.k,
        servers=args.servers,
        workers=args.workers,
        kills=args.kills,
        seed=args.seed,
        interval=tuple(args.interval),
    )
    total = soak.prompts * (args.k + 1)
    print(
        f"{total} generations ({soak.prompts} prompts x {args.k + 1}), {args.servers} "
        f"servers, {args.workers} workers",
        flush=True,
    )
    base = soak.baseline()
    print(f"unkilled run: {base:.1f} s ({total / base:.0f} generations/s)", flush=True)
    tag = uuid.uuid4().hex
    wall, root = soak.chaos(tag)
    problems = check(root, soak.prompts, args.k)
    time.sleep(1.0)
    alive = tagged_processes(tag)
    if alive:
        problems.append(f"{len(alive)} process(es) of the run left: {alive[:5]}")
    new_shm = orphaned(shm_names() - shm_before)  # other users' live files are not ours
    if new_shm:
        problems.append(f"shared-memory files left: {sorted(new_shm)[:5]}")
    redone = max(0.0, soak.served - total)
    kills = soak.kills
    # the most a kill may cost: the groups in flight then (every request of each, K+1 a group)
    per_group = args.k + 1
    in_flight = soak.groups_in_flight * per_group
    drain_kills = kills["orchestrator"] - kills["consolidate"] - kills["exports"]
    bound = (
        drain_kills * args.workers * in_flight
        + kills["worker"] * in_flight
        + kills["server"] * -(-args.workers // args.servers) * in_flight
    )
    if redone > bound:
        problems.append(f"work redone {redone:.0f} > the groups in flight at the kills ({bound})")
    print(
        f"kills: orchestrator {kills['orchestrator']} (consolidating {kills['consolidate']}, "
        f"exporting {kills['exports']}), worker {kills['worker']}, server {kills['server']}; "
        f"total {kills['orchestrator'] + kills['worker'] + kills['server']} over "
        f"{soak.sessions} sessions"
    )
    print(
        f"work redone: ~{redone:.0f} generation requests beyond {total} "
        f"({redone / total:.1%}; counters of killed servers read just before each kill); "
        f"the groups in flight at the kills allow {bound}"
    )
    print(f"wall: {wall:.1f} s killed vs {base:.1f} s unkilled = {wall / base:.2f}x")
    print(
        "checks: "
        + (
            "exactly K+1 generations and one activation per (prompt, sample), "
            "validation clean, no process, spool or shm file left"
            if not problems
            else "FAILED\n  " + "\n  ".join(problems)
        )
    )
    if not args.keep and not problems:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work directory: {work}")
    print(
        json.dumps(
            {
                "generations": total,
                "kills": kills,
                "sessions": soak.sessions,
                "redone_requests": round(redone),
                "redone_bound": bound,
                "wall_killed_s": round(wall, 1),
                "wall_unkilled_s": round(base, 1),
                "ok": not problems,
            }
        )
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
