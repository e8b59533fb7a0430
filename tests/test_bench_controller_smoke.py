"""Smoke run of benchmarks/controller_scale.py (``--smoke``: seconds) so the script cannot rot.

Runs the exact command a reader would, in a subprocess (it starts its own
local Ray instance for the ray rows), and checks that both markdown tables
are complete. Numbers are not asserted beyond being positive: the machine is
shared; docs/runtime.md has a real run.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO


def table(out: str, column: str) -> list[list[str]]:
    """Body rows of the markdown table whose header has ``column``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|") and f"| {column} |" in line)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def number(cell: str) -> float:
    return float(re.sub(r"[,x ]", "", cell))


def test_controller_scale_smoke():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "controller_scale.py"), "--smoke"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    rows = table(proc.stdout, "concurrent episodes")
    assert [(row[0], row[1]) for row in rows] == [("local", "1"), ("local", "8"), ("local", "64"),
                                                  ("ray", "1"), ("ray", "8")]
    for row in rows:
        turns, turns_per_s, us_per_turn, cpu_per_turn = (number(row[i]) for i in (2, 4, 5, 6))
        assert turns >= 200 and turns_per_s > 0 and us_per_turn > 0 and cpu_per_turn > 0
    assert number(rows[0][7]) == 1.0  # one episode in flight: every batch holds one request
    assert rows[3][8].endswith("x")  # ray rows are compared with local at the same concurrency
    memory = table(proc.stdout, "in-flight episodes")
    assert memory[0][:2] == ["local", "256"] and number(memory[0][2]) > 0
