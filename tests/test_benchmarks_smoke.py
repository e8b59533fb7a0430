"""Smoke runs of every benchmark script (``--smoke``: tiny sizes, seconds) so the scripts cannot rot.

Each test runs the exact command a reader would (``python benchmarks/<name>.py``)
in a subprocess, so the script's own path handling, its worker subprocesses
and the plugin module ``benchmarks.bench_workflows`` are all exercised, and
checks that the markdown table it prints is complete. The numbers themselves
are not asserted (the machine is shared); docs/performance.md has real runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import os
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import REPO

try:
    import psutil  # to tell a slow benchmark (busy machine) from a hung one
except ImportError:  # without it a smoke run waits for the benchmark to end, hung or not
    psutil = None


RANK_LAYOUT = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Set in this process by an in-process verl group (``unimas.groups.verl.patches``); a benchmark started as a
fresh program must not inherit them (accelerate, under TRL, would then wait for a distributed rendezvous)."""


STALL_SECONDS = 300.0
"""Wall time a benchmark may go without using any CPU (it and its worker processes together) before it counts
as hung. A busy machine slows a benchmark but still gives it CPU time every second; only a deadlock uses none.
So the smoke runs wait for the benchmark to end, however loaded the machine, and still stop on a hang."""


def cpu_seconds(process: "psutil.Process") -> float:
    """CPU time of ``process`` and all its descendants, live or already reaped."""
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            times = member.cpu_times()
        except psutil.Error:  # ended between the listing and the read: its time is in its parent's children_*
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def run_benchmark(script: str, *args: str) -> str:
    """The stdout of ``python benchmarks/<script> --smoke ARGS``, once it exits 0; fails if it exits otherwise or
    makes no progress for :data:`STALL_SECONDS` (it is then killed with its workers)."""
    env = {key: value for key, value in os.environ.items() if key not in RANK_LAYOUT}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / script), "--smoke", *args],
                                stdout=out, stderr=err, text=True, cwd=REPO, env=env)
        process = psutil.Process(proc.pid) if psutil is not None else None
        used, progressed = -1.0, time.monotonic()
        try:
            if process is None:
                proc.wait()
            while proc.poll() is None:
                with contextlib.suppress(psutil.Error):  # it may end between poll() and the read
                    now_used = cpu_seconds(process)
                    if now_used > used:
                        used, progressed = now_used, time.monotonic()
                if time.monotonic() - progressed > STALL_SECONDS:
                    pytest.fail(f"{script} used no CPU for {STALL_SECONDS:g} s (at {used:.1f} CPU s): hung")
                time.sleep(1.0)
        finally:
            if proc.poll() is None and process is not None:
                for member in [*process.children(recursive=True), process]:
                    with contextlib.suppress(psutil.Error):
                        member.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert proc.returncode == 0, f"{script} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}"
    return stdout


def table_rows(out: str, column: str, first: bool = True) -> list[list[str]]:
    """Body rows of the markdown table whose header starts with (or, ``first=False``, has) ``| column |``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if (line.startswith(f"| {column} |") if first else line.startswith("|") and f"| {column} |" in line))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def number(cell: str) -> float:
    return float(re.sub(r"[,%×x ]", "", cell))


@pytest.mark.slow
def test_vs_trl_smoke():
    pytest.importorskip("trl")
    out = run_benchmark("vs_trl.py")
    rows = table_rows(out, "KL")
    assert {row[1] for row in rows} == {"unimas", "trl", "unimas-async"}  # the async pipeline beside the sync one
    for row in rows:
        assert number(row[2]) > 0 and number(row[3]) > 0  # step ms, tokens/s
        assert number(row[4]) > 0 and number(row[5]) > 0  # generation and reference passes were timed
    before = {row[9] for row in rows}  # expected reward at step 0
    assert len(before) == 1, "both frameworks must start from the same saved weights"
    ratios = table_rows(out.split("Ratios unimas / TRL")[1], "KL")
    assert [row[1] for row in ratios] == ["unimas", "unimas async (max_staleness 1)"]
    assert all(number(row[2]) > 0 for row in ratios)  # step-time ratios
    assert "WARNING" not in out


@pytest.mark.slow
def test_overhead_smoke():
    out = run_benchmark("overhead.py")
    rows = table_rows(out, "mapping")
    assert [row[0] for row in rows] == ["shared", "separate"]
    for row in rows:
        assert number(row[3]) > 0 and number(row[8]) > 0  # unimas step, floor
        assert -100 < number(row[12]) < 100  # overhead %
    if importlib.util.find_spec("pyinstrument"):
        assert "unimas/groups/torch/" in out  # the profile attributes time to unimas functions


@pytest.mark.slow
def test_sharing_smoke():
    out = run_benchmark("sharing.py")
    rows = table_rows(out, "size")
    assert [row[1] for row in rows] == ["one_role", "first_role", "shared", "separate", "lora"]
    params = {row[1]: row[2] for row in rows}
    assert params["shared"] == params["one_role"]  # same single model
    total = lambda cell: int(cell.split("/")[0].replace(",", ""))  # noqa: E731
    assert total(params["separate"]) == 3 * total(params["shared"])
    assert number(params["lora"].split("/")[1]) < total(params["lora"])  # only adapters train
    for row in rows:
        assert number(row[3]) > 0 and number(row[8]) > 0  # peak RSS, step ms
    assert "smoke" in out  # the table says its memory numbers are not measurements


@pytest.mark.slow
def test_controller_scale_smoke():
    out = run_benchmark("controller_scale.py")
    rows = table_rows(out, "concurrent episodes", first=False)
    assert [(row[0], row[1]) for row in rows] == [("local", "1"), ("local", "8"), ("local", "64"),
                                                  ("ray", "1"), ("ray", "8")]
    for row in rows:
        turns, turns_per_s, us_per_turn, cpu_per_turn = (number(row[i]) for i in (2, 4, 5, 6))
        assert turns >= 200 and turns_per_s > 0 and us_per_turn > 0 and cpu_per_turn > 0
    assert number(rows[0][7]) == 1.0  # one episode in flight: every batch holds one request
    assert rows[3][8].endswith("x")  # ray rows are compared with local at the same concurrency
    floor = re.search(r"bare asyncio at 64 concurrent episodes .*: ([0-9.]+) CPU µs/turn", out)
    assert floor and float(floor.group(1)) > 0, out  # the asyncio floor beside the controller's cost
    memory = table_rows(out, "in-flight episodes", first=False)
    assert memory[0][:2] == ["local", "256"] and number(memory[0][2]) > 0


CREDIT_METHODS = ("grpo", "branch+counterfactual", "replay", "seeupo")
CRITIC_METHODS = ("grpo", "ppo_gae", "centralized_critic")


@pytest.fixture(scope="module")
def credit_out() -> str:
    """One credit.py smoke run of both tests' methods: one interpreter start, grpo's rows run once."""
    methods = dict.fromkeys(CREDIT_METHODS + CRITIC_METHODS)
    return run_benchmark("credit.py", "--methods", *methods)


def credit_rows(out: str, methods: tuple[str, ...]) -> list[list[str]]:
    return [row for row in table_rows(out.split("s in all.")[1], "task") if row[1] in methods]


@pytest.mark.slow
def test_credit_smoke(credit_out):
    rows = credit_rows(credit_out, CREDIT_METHODS)
    assert {(row[0], row[1]) for row in rows} == {(task, method) for task in ("signalling", "arith", "math_team")
                                                  for method in CREDIT_METHODS}
    for row in rows:
        assert number(row[7]) >= 64  # each run sampled at least its token budget
        assert 0 <= number(row[2].split("±")[0]) <= 1
    assert all(row[4] != "—" for row in rows if row[0] == "arith")  # verifier fix rate reported for the team


@pytest.mark.slow
def test_shared_prompts_smoke():
    out = run_benchmark("shared_prompts.py")
    rows = table_rows(out, "prompt tokens")
    assert [row[0] for row in rows] == ["8", "32"] and all(row[1] == "8" for row in rows)  # 2 prompts × group 4
    for row in rows:
        assert all(number(cell) > 0 for cell in row[2:])  # both forwards timed both ways, and their ratios


@pytest.mark.slow
def test_startup_smoke():
    out = run_benchmark("startup.py")
    rows = table_rows(out, "command")
    assert [row[0].strip("`") for row in rows] == [
        'python -c "import unimas"', "unimas --help", "unimas plugins", "unimas plugins --verbose",
        "unimas validate examples/quickstart.yaml", "unimas validate examples/quickstart_chat.yaml"]
    assert all(number(row[1]) > 0 and number(row[2]) > 0 for row in rows)  # seconds, modules imported
    assert [row[3] for row in rows[:4]] == ["—"] * 4  # nothing heavy before a config needs a model


@pytest.mark.slow
def test_credit_smoke_critic_rows(credit_out):
    rows = {(row[0], row[1]): row for row in credit_rows(credit_out, CRITIC_METHODS)}
    # arith's warm-start vocabulary (digits, "+", "=", ">") cannot spell "solver: ": that row is skipped, said so
    assert set(rows) == {(task, method) for task in ("signalling", "arith", "math_team")
                         for method in CRITIC_METHODS} - {("arith", "centralized_critic")}
    assert "# arith centralized_critic: skipped" in credit_out
    for (task, method), row in rows.items():
        assert number(row[7]) >= 64  # the same sampled-token budget as every other row
        assert (row[11] == "—") == (method == "grpo")  # a critic trained (and logged its fit) in every critic row


@pytest.mark.slow
def test_suite_cpu_smoke():
    """benchmarks/suite_cpu.py runs pytest under its /proc sampler and attributes the CPU by process and file."""
    out = run_benchmark("suite_cpu.py")
    assert re.search(r"pytest exit 0; [1-9]\d* tests", out), out[-2000:]
    kinds = {row[0]: row for row in table_rows(out, "processes")}
    assert number(kinds["pytest (controller)"][1]) > 0  # the run that executed the tests, found by the sampler
    files = table_rows(out, "test file")
    assert [row[0] for row in files] == ["`tests/test_safe_expr.py`"] and number(files[0][2]) > 0
