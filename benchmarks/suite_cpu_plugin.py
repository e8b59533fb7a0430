"""pytest plugin of ``benchmarks/suite_cpu.py``: each test's wall time and the CPU its own process spent on it.

Loaded with ``-p benchmarks.suite_cpu_plugin``; writes one JSON line per test (setup and teardown included,
so a module fixture's cost lands on the test that built it) to ``$UNIMAS_SUITE_CPU_DIR/<worker>.jsonl``.
Processes the test started are not counted here: ``suite_cpu.py`` samples every process from ``/proc``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

OUT_VARIABLE = "UNIMAS_SUITE_CPU_DIR"


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    out = os.environ.get(OUT_VARIABLE)
    started, cpu = time.time(), _own_cpu()
    yield
    if not out:
        return
    record = {"test": item.nodeid, "file": item.nodeid.split("::")[0], "start": started,
              "wall_s": time.time() - started, "cpu_s": _own_cpu() - cpu}
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(out) / f"{worker}.jsonl", "a") as handle:
        handle.write(json.dumps(record) + "\n")
