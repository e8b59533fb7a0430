"""Where the test suite's CPU goes: `python benchmarks/suite_cpu.py [pytest arguments]` (Linux).

Runs pytest as ``scripts/test.sh`` does (``-n 3 --dist loadfile``, ``--workers`` to change) while a sampler
reads every process's CPU time from ``/proc`` twice a second, and prints:

* the machine's busy and idle CPU-seconds over the run (``/proc/stat``): the suite is CPU-bound when idle is
  near zero, and then only less CPU makes it faster;
* CPU-seconds per kind of process (pytest workers, Ray actors by class, Ray's own processes, rollout
  replicas, benchmark scripts, CLI runs, ...), with the count and the mean per process;
* CPU-seconds per test file: what the file's tests spent in the pytest worker (``suite_cpu_plugin``) plus
  every process started while one of its tests ran (found by ``PYTEST_CURRENT_TEST`` in the process's
  environment; a Ray instance's actors count for the test that started the instance).

The sampler misses the last half second of each process and processes shorter than that; on the 2-core
machine it found 97 % of the busy CPU (docs/testing.md). ``--smoke`` runs one small test file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, markdown_table  # noqa: E402
from benchmarks.suite_cpu_plugin import OUT_VARIABLE  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
RAY_INFRASTRUCTURE = ("gcs_server", "raylet/raylet", "dashboard/dashboard.py", "dashboard/agent.py", "log_monitor.py",
                      "autoscaler/_private/monitor.py", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE")
"""Command-line fragments of the processes every Ray instance runs, whatever the suite asks of it."""
KINDS = (("ray/_private/workers/", "Ray worker (tasks)"), ("exec(eval(sys.stdin", "pytest workers"),
         (" -m pytest", "pytest (controller)"), ("unimas.groups.torch.replica_main", "torch rollout replicas"),
         ("benchmarks/", "benchmark scripts"), ("scripts/", "scripts/ checks"), ("unimas.cli", "unimas CLI"),
         ("chromium", "chromium"), ("bwrap", "sandbox (bwrap)"), ("python", "other Python programs"))
"""(command-line fragment, row) for the other processes, first match wins: the xdist worker's command line
holds ``exec(eval(sys.stdin...))`` (execnet's bootstrap, matched as text only)."""


@dataclass
class Sampled:
    """One process seen by the sampler: its command line (the latest, since Ray renames its workers), the test
    it was started under, and its CPU time (``cpu0``: what it had already used when sampling began)."""

    command: str
    test: str | None
    cpu0: float
    cpu: float

    @property
    def spent(self) -> float:
        return self.cpu - self.cpu0


def kind(command: str) -> str:
    """The row of the per-kind table a process belongs to, from its command line."""
    if any(part in command for part in RAY_INFRASTRUCTURE):
        return "Ray's own processes"
    actor = re.match(r"ray::(\w+)", command)
    if actor:
        return f"Ray actor {actor.group(1)}"
    return next((label for pattern, label in KINDS if pattern in command), "other")


def _cpu(pid: str) -> tuple[str, float] | None:
    """(start time, CPU seconds) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19], (int(fields[11]) + int(fields[12])) / TICKS


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _test_of(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            for item in handle.read().split(b"\0"):
                if item.startswith(b"PYTEST_CURRENT_TEST="):
                    return item.partition(b"=")[2].decode(errors="replace").split(" ")[0]
    except OSError:
        pass
    return None


class Sampler(threading.Thread):
    """Reads every process in ``/proc`` each ``period`` seconds until stopped; processes keyed by pid and start."""

    def __init__(self, period: float = 0.5):
        super().__init__(daemon=True)
        self.period, self.stopping = period, threading.Event()
        self.seen: dict[tuple[str, str], Sampled] = {}

    def run(self) -> None:
        first = True
        while not self.stopping.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                read = _cpu(pid)
                if read is None:
                    continue
                start, cpu = read
                known = self.seen.get((pid, start))
                if known is None:
                    self.seen[(pid, start)] = Sampled(_command(pid), _test_of(pid), cpu if first else 0.0, cpu)
                elif cpu > known.cpu:  # read again: Ray renames a worker once it hosts an actor
                    known.cpu, known.command = cpu, _command(pid) or known.command
            first = False
            self.stopping.wait(self.period)


def _busy_and_idle() -> tuple[float, float]:
    with open("/proc/stat") as handle:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, handle.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS, (idle + iowait) / TICKS


def per_kind(processes: list[Sampled]) -> list[list[str]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for process in processes:
        if process.spent > 0:
            total = totals[kind(process.command)]
            total[0] += process.spent
            total[1] += 1
    rows = sorted(totals.items(), key=lambda item: -item[1][0])
    return [[label, f"{cpu:.1f}", str(count), f"{cpu / count:.1f}"] for label, (cpu, count) in rows]


def per_file(processes: list[Sampled], tests: list[dict]) -> list[list[str]]:
    own: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for test in tests:
        own[test["file"]][0] += test["wall_s"]
        own[test["file"]][1] += test["cpu_s"]
    started: dict[str, float] = defaultdict(float)
    for process in processes:
        file = (process.test or "").split("::")[0]
        if file in own and kind(process.command) != "pytest workers":  # not a test of an outer pytest run
            started[file] += process.spent
    files = sorted(own, key=lambda f: -(own[f][1] + started[f]))
    return [[f"`{f}`", f"{own[f][0]:.0f}", f"{own[f][1]:.1f}", f"{started[f]:.1f}", f"{own[f][1] + started[f]:.1f}"]
            for f in files]


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3, help="pytest-xdist workers (scripts/test.sh: 3)")
    p.add_argument("--top", type=int, default=30, help="test files listed")
    p.add_argument("--smoke", action="store_true", help="one small test file, no xdist: for the test suite")
    p.add_argument("--json", type=Path, help="also write the tables' data here")
    return p.parse_known_args(argv)


def main(argv=None) -> int:
    args, pytest_args = parse_args(argv)
    if args.smoke:
        pytest_args = ["tests/test_safe_expr.py", *pytest_args]
    xdist = [] if args.smoke else ["-n", str(args.workers), "--dist", "loadfile"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.suite_cpu_plugin", *xdist, *pytest_args]
    with tempfile.TemporaryDirectory() as out:
        sampler = Sampler()
        sampler.start()
        busy, idle = _busy_and_idle()
        started = time.monotonic()
        # an outer pytest's test name (this script run by tests/test_benchmarks_smoke.py) is not the inner run's
        env = {key: value for key, value in os.environ.items() if key != "PYTEST_CURRENT_TEST"}
        code = subprocess.run(command, cwd=REPO, env={**env, OUT_VARIABLE: out}).returncode
        wall = time.monotonic() - started
        busy, idle = (now - before for now, before in zip(_busy_and_idle(), (busy, idle)))
        sampler.stopping.set()
        sampler.join()
        tests = [json.loads(line) for path in Path(out).glob("*.jsonl") for line in path.read_text().splitlines()]
    processes = list(sampler.seen.values())
    found = sum(p.spent for p in processes)
    kinds, files = per_kind(processes), per_file(processes, tests)
    print(f"\n### Suite CPU: `{' '.join(command[1:])}`\n")
    print(f"pytest exit {code}; {len(tests)} tests; wall {wall:.0f} s; machine busy {busy:.0f} CPU-s, idle "
          f"{idle:.0f} CPU-s ({os.cpu_count()} CPUs); the sampler found {found:.0f} CPU-s of processes.\n")
    print(markdown_table(["processes", "CPU-s", "count", "CPU-s each"], kinds))
    print()
    print(markdown_table(["test file", "wall s (in its worker)", "CPU-s in the worker", "CPU-s of processes started",
                          "CPU-s"], files[:args.top]))
    if args.json:
        args.json.write_text(json.dumps({"wall_s": wall, "busy_s": busy, "idle_s": idle, "exit": code,
                                         "kinds": kinds, "files": files, "tests": tests}, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
